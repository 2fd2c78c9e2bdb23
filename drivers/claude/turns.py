"""A Claude Code turn (`Turns`, the Claude driver's process part): run by the pinned SDK on the
driver's private asyncio loop (one CLI process per turn, resumed from the session's own
transcript), its messages handed to the event translator (`ClaudeEvents`), `turn.completed`
sent once, and an interrupt that kills exactly this turn's CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from domain.enums import TurnOutcome
from domain.errors import NotFound, ProviderNotCalled, SessionBusy
from domain.turn_events import TurnCompleted
from drivers.base import Emit
from drivers.claude.checkpoints import reconcile_checkpoint, resumable, watch_root
from drivers.claude.env import ClaudeDriverConfig
from drivers.claude.events import TIMED_OUT, ClaudeEvents
from drivers.claude.interactions import Interactions
from drivers.claude.state import SessionState, TurnState, required
from drivers.claude.tied import TiedCli
from drivers.claude.warm import (
    CLOSE_BOUND_S,
    KILL_WAIT_S,
    TERM_WAIT_S,
    Cli,
    WarmClis,
    reaped_unless_stopped,
    reaped_within,
    transcript_stamp,
)
from drivers.credentials import model_failure_text
from drivers.errors import DriverError
from drivers.liveness import TreeWatch, kill_tree, stopped_error

TURN_START_TIMEOUT_S = 120.0
LOOP_SLACK_S = 2.0
"""What a stop gives the driver's loop beyond `CLOSE_BOUND_S` to run the CLIs' close (a loop
busy with other Sessions' Turns); the stop is answered within the sum (7 s), inside the host's
bound on it (10 s)."""
MAX_MESSAGE_BYTES = 64 << 20
"""The largest message line the SDK reads from the CLI (64 MiB; its default, 1 MiB, failed any
Turn with a longer reply or tool result). The bound the app-server reader keeps
(`drivers.app_server.process.MAX_LINE_BYTES`): past it the SDK raises `CLIJSONDecodeError …
exceeded maximum buffer size`, the worker's memory bounded; the CLI is killed and the Turn
fails `provider_protocol_error` (`ProtocolBreak`)."""
PROVIDER_PROTOCOL_ERROR = "provider_protocol_error"
"""The reason word a Turn fails with when its CLI broke the stream-json protocol the SDK
cannot read on from (as an app-server's, `drivers.app_server.process`)."""
_UNREADABLE = (UnicodeDecodeError, TypeError, KeyError, AttributeError, ValueError)
"""What the SDK's reading of the CLI's stdout raises, besides its own errors, for bytes that
are not UTF-8 or a message of a known type whose fields have the wrong shape (its parser
indexes them unchecked)."""


_NO_STDERR = "Check stderr output for details"
"""What the SDK puts in a `ProcessError`'s `stderr` when it did not capture the CLI's."""
STDERR_TAIL_CHARS = 400
"""How much of the end of a CLI's captured stderr a start failure's text carries."""


_EXIT_CODE = re.compile(r"\(exit code:? (-?\d+)\)")


def not_started_text(cli_path: str, exc: Exception, exit_code: int | None = None) -> str:
    """The error of a Turn whose Claude Code CLI ended, or could not be started, before it was
    handed the prompt (`exc`: what the SDK raised; `exit_code`: the CLI's own, when its process
    was reaped): the CLI's path, its exit code (or that it could not be started, with the SDK's
    words) and the tail of its stderr if the SDK captured any."""
    code = exit_code if exit_code is not None else getattr(exc, "exit_code", None)
    if not isinstance(code, int):
        # A CLI that ended before the SDK wrote to it is told by the write that failed, whose
        # text carries the exit code when the exit was reaped first ("Cannot write to
        # terminated process (exit code: 1)"); which the SDK raises is a race of the CLI's exit
        # and the write. A write that met the closed pipe first carries none ("Failed to write
        # to process stdin: "): the code then comes from the process itself (`exit_code`).
        found = _EXIT_CODE.search(str(exc))
        code = int(found.group(1)) if found else None
    if isinstance(code, int):
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        text = f"the Claude Code CLI ({cli_path}) {how} before it read the prompt"
    else:
        text = f"the Claude Code CLI ({cli_path}) could not be started: {exc}"
    stderr = getattr(exc, "stderr", None)
    if isinstance(stderr, str) and stderr.strip() and stderr.strip() != _NO_STDERR:
        tail = stderr.strip()[-STDERR_TAIL_CHARS:]
        text += f"; its stderr ends: {tail}"
    return text


def program_identity(path: str) -> tuple[int, int, int] | None:
    """The CLI program's file as it is now (inode, size, mtime; None: unreadable): a parked
    CLI of a program since replaced on disk (an upgrade) is not the one a Turn would start."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class ProtocolBreak(Exception):
    """The SDK could not read what the CLI wrote (a line past `MAX_MESSAGE_BYTES`, corrupt
    JSON, bytes that are not UTF-8, a wrong-shaped message): raised by `_read` only, so a bug
    in the driver's own handling of a message is never taken for one."""


async def _read(next_message: Any) -> Any:
    """The SDK's next message (`next_message`: its `__anext__()` awaitable or task; None at the
    stream's end), a failure to read it raised as `ProtocolBreak`."""
    from claude_agent_sdk import CLIJSONDecodeError
    from claude_agent_sdk._errors import MessageParseError

    try:
        return await next_message
    except StopAsyncIteration:
        return None
    except (CLIJSONDecodeError, MessageParseError, *_UNREADABLE) as exc:
        raise ProtocolBreak(f"{type(exc).__name__}: {exc}"[:300]) from exc


EOF_EXIT_GRACE_S = 0.5
"""How long a CLI whose stdout ended may run on before it is killed (the app-server reader's
grace, `drivers.app_server.process.EOF_EXIT_GRACE_S`): an exiting CLI closes its stdout as it
exits and is reaped a moment later."""


def stdout_ended(process: Any) -> bool:
    """The CLI's stdout reached its end and the SDK has read all of it (the asyncio reader
    under anyio's process, `at_eof`)."""
    reader = getattr(getattr(process, "_process", None), "stdout", None)
    at_eof = getattr(reader, "at_eof", None)
    return bool(at_eof()) if callable(at_eof) else False


def protocol_error(pid: int | None, what: str) -> str:
    """The failure of a Turn whose CLI broke the stream-json protocol, in words."""
    which = "" if pid is None else f" (pid {pid})"
    return (
        f"{PROVIDER_PROTOCOL_ERROR}: the claude-code CLI{which} {what}; it was killed, "
        "and a new one starts at the next Turn"
    )


PROVIDER_HISTORY_MISSING = "provider_history_missing"


def history_missing_text(session: SessionState) -> str:
    """Why a Turn of a Session whose bound history is gone is not started."""
    return (
        f"{PROVIDER_HISTORY_MISSING}: claude-code session {session.provider_session_id} has "
        f"Turns the host bound, but its transcript {session.transcript} is gone (or holds no "
        "message); a Turn would start a fresh history without the conversation, so none was "
        "started. Put the transcript back, or start a new Session"
    )


class Turns:
    """Turn start, interrupt and the CLI process of each Session's active turn."""

    def __init__(
        self,
        config: ClaudeDriverConfig,
        loop: asyncio.AbstractEventLoop,
        interactions: Interactions,
        tied: TiedCli,
    ) -> None:
        self._config = config
        self._tied = tied
        self._loop = loop
        self._interactions = interactions
        self.events = ClaudeEvents(config, self.terminate)
        self.warm = WarmClis(config.warm_clis, config.warm_idle_s)

    def start(self, session: SessionState, params: Mapping[str, Any], emit: Emit) -> dict[str, Any]:
        turn = TurnState(turn_id=required(params, "turnId"), emit=emit)
        text = str(params.get("text") or "")
        if params.get("boundHistory") is True and not resumable(session.transcript):
            # The host has Turns of this Session bound to the transcript, which is gone: a
            # CLI would start a fresh history under the same id, the conversation lost
            # unseen. Nothing is started, nothing written.
            raise ProviderNotCalled(history_missing_text(session))
        with session.lock:
            if session.stopped:
                # Taken before its `session.stop`, whose answer says no CLI of it runs.
                raise NotFound(
                    f"session {session.agent_session_id} is not started in the Claude worker"
                )
            # Two concurrent turns on one Claude session both succeed and branch the
            # transcript (PROVIDERS.md): one at a time, enforced here.
            if session.active is not None:
                raise SessionBusy(f"session {session.agent_session_id} already has an active turn")
            session.active = turn
        turn.task = asyncio.run_coroutine_threadsafe(
            self._run_turn(session, turn, text), self._loop
        )
        try:
            provider_turn_id = turn.started.result(timeout=TURN_START_TIMEOUT_S)
        except FutureTimeout:
            self.cancel(turn)
            raise DriverError("Claude Code did not echo the user message in time") from None
        return {"providerTurnId": provider_turn_id}

    def interrupt(self, session: SessionState, params: Mapping[str, Any]) -> dict[str, Any]:
        turn = session.active
        wanted = params.get("providerTurnId")
        if turn is None or (wanted and turn.provider_turn_id not in (None, wanted)):
            raise NotFound("no such active turn", reason="turn_not_found")
        self.cancel(turn)
        return {}

    def cancel(self, turn: TurnState) -> None:
        turn.interrupted = True
        self._loop.call_soon_threadsafe(self.terminate, turn)

    def terminate(self, turn: TurnState) -> None:
        """Stops the turn's CLI process (on the loop thread, which owns it).

        Killing the process, not cancelling the task: a bare asyncio cancel skips the SDK's
        terminate escalation and leaves the close waiting for the in-flight model call.
        """
        process = getattr(turn.transport, "_process", None)
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        elif turn.task is not None:
            turn.task.cancel()  # not spawned yet: nothing to kill

    def _options(self, session: SessionState, exists: bool, cli: list[Cli]) -> Any:
        """The CLI options of `session`'s next Turn (`exists`: its transcript can be resumed);
        permission requests go to the Turn `cli[0]` serves."""
        from claude_agent_sdk import ClaudeAgentOptions
        from claude_agent_sdk.types import PermissionResultDeny

        async def can_use_tool(tool: str, tool_input: dict[str, Any], context: Any) -> Any:
            turn = cli[0].turn if cli else None
            if turn is None:  # no prompt was written: nothing can ask
                return PermissionResultDeny(message="no turn")
            return await self._interactions.can_use_tool(session, turn, tool, tool_input, context)

        return ClaudeAgentOptions(
            cwd=session.cwd,
            env=dict(session.env),
            # Resume only from this session's own id, and only once its transcript exists in
            # its own home; a first turn claims the id instead (no source namespace, ever).
            resume=session.provider_session_id if exists else None,
            session_id=None if exists else session.provider_session_id,
            setting_sources=[],
            model=session.model,
            # The CLI through a script that ties it to this worker (drivers/claude/tied.py).
            cli_path=self._tied.cli_path(),
            settings=session.claude_settings,
            # Echo user messages with the UUIDs the CLI persisted: the observed identity.
            extra_args={"replay-user-messages": None},
            # Every tool permission the CLI would ask a person for becomes an Interaction.
            can_use_tool=can_use_tool,
            # Raw stream events: text arrives as it is generated (`message.delta`).
            include_partial_messages=True,
            max_buffer_size=MAX_MESSAGE_BYTES,
        )

    def _key(self, session: SessionState, exists: bool) -> tuple[object, ...]:
        """Everything a CLI's start takes from the Session, and the program it runs: two CLIs
        of equal keys (and an unchanged transcript) are interchangeable."""
        return (
            session.provider_session_id,
            exists,
            str(session.config_dir),
            session.cwd,
            tuple(sorted(session.env.items())),
            session.model,
            session.claude_settings,
            self._config.cli_path,
            program_identity(self._tied.real_cli()),
        )

    def _spawn(self, session: SessionState) -> Cli:
        """A CLI for `session`'s next Turn, started now (loop thread)."""
        exists = resumable(session.transcript)
        stamp = transcript_stamp(session.transcript)
        box: list[Cli] = []
        cli = Cli.spawn(self._options(session, exists, box), self._key(session, exists), stamp)
        box.append(cli)
        return cli

    def _cli_for_turn(self, session: SessionState) -> tuple[Cli, bool]:
        """The CLI started ahead for this Session when it was started as one would be now
        (True); else a new one (False)."""
        if self.warm.parked(session.agent_session_id) is not None:
            exists = resumable(session.transcript)
            key = self._key(session, exists)
            cli = self.warm.take(
                session.agent_session_id, key, transcript_stamp(session.transcript)
            )
            if cli is not None:
                return cli, True
        return self._spawn(session), False

    @staticmethod
    def _hand(turn: TurnState, cli: Cli, text: str) -> None:
        """`cli` serves `turn` (an interrupt stops exactly it) and is given its prompt."""
        cli.turn = turn
        turn.transport = cli.transport
        cli.prompt.set_result(text)

    async def _live_or_own(
        self, session: SessionState, turn: TurnState, cli: Cli, text: str
    ) -> Cli:
        """The CLI started ahead, once it answers the prompt it was handed; or, when it ended
        before the prompt was handed to it (`WarmClis.take` checks its process, but it can die
        between that check and the hand-over: killed, crashed), a CLI of the Turn's own, as if
        none had been parked. That CLI never got the Turn (its gate sealed unhanded), so the
        provider is called once. What the first message raises otherwise is left to the
        caller's read of the same `first`."""
        try:
            await cli.first
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await cli.messages.aclose()  # as the caller's `aclosing` would have
            raise
        except Exception:  # noqa: BLE001 - read again by the caller unless the CLI is replaced
            if not cli.gate.seal():
                return cli
            with contextlib.suppress(BaseException):
                await cli.messages.aclose()
            cli = self._spawn(session)
            self._hand(turn, cli, text)
        return cli

    def prestart(self, session: SessionState) -> None:
        """Starts the CLI of the Session's next Turn now, while no Turn runs (loop thread)."""
        if not self.warm.enabled:
            return
        with session.lock:
            if session.active is not None or session.stopped:
                return
        try:
            cli = self._spawn(session)
        except Exception:  # noqa: BLE001 - the next Turn starts its own CLI and reports why
            return
        self.warm.park(session.agent_session_id, cli)

    def forget(self, agent_session_id: str, turn: TurnState | None = None) -> None:
        """The Session stopped: its parked CLI ends, and the CLI of its Turn `turn` (told to
        stop by `cancel`), and this returns once they have, within `CLOSE_BOUND_S` whatever
        they do (terminated, then killed: `Cli.close`, `_end_turn`), so nothing of them writes
        into the Session's home after the stop is answered (from any thread but the loop's).
        `LOOP_SLACK_S` more is given to a loop that is slow to run the close."""
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(
                self._end_session(agent_session_id, turn), self._loop
            ).result(timeout=CLOSE_BOUND_S + LOOP_SLACK_S)

    async def _end_session(self, agent_session_id: str, turn: TurnState | None) -> None:
        ends = [self.warm.drop_and_wait(agent_session_id)]
        if turn is not None:
            ends.append(self._end_turn(turn))
        await asyncio.gather(*ends, return_exceptions=True)

    async def _end_turn(self, turn: TurnState) -> None:
        """The Turn's CLI, terminated, is killed (with its tree) if it has not ended
        within `TERM_WAIT_S`, or as soon as it is seen stopped: one stopped or wedged never
        reads the SIGTERM, and the SDK's own close would wait 15 s for it."""
        self.terminate(turn)
        process = getattr(turn.transport, "_process", None)
        if process is None:
            return  # not spawned (its task cancelled), or reaped and let go by the SDK
        if not await reaped_unless_stopped(process, TERM_WAIT_S):
            if process.returncode is None:
                kill_tree(process.pid)
            await reaped_within(process, KILL_WAIT_S)

    def close(self) -> None:
        """Ends every parked CLI (from any thread but the loop's)."""
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.warm.close_all(), self._loop).result(
                timeout=CLOSE_BOUND_S + LOOP_SLACK_S
            )

    async def _run_turn(self, session: SessionState, turn: TurnState, text: str) -> None:
        outcome = TurnOutcome.FAILED
        error: str | None = None
        try:
            turn.transcript_offset = session.transcript.stat().st_size
        except FileNotFoundError:
            turn.transcript_offset = 0
        answering = asyncio.Event()
        watcher = asyncio.ensure_future(watch_root(session, turn, answering))
        stop_watch = asyncio.ensure_future(self._watch_stopped(turn))
        cli: Cli | None = None
        failed: Exception | None = None
        try:
            # The CLI started ahead for this Turn when there is a matching one; an interrupt
            # stops exactly this CLI (`turn.transport`); aclosing stops it on any exit.
            cli, warm = self._cli_for_turn(session)
            self._hand(turn, cli, text)
            if warm:
                cli = await self._live_or_own(session, turn, cli, text)
            async with contextlib.aclosing(cli.messages) as messages:
                try:
                    message = await _read(cli.first)
                    answering.set()
                    while message is not None:
                        result = self.events.on_message(session, turn, message)
                        if result is not None:
                            outcome, error = result
                            self._check_session(session, turn, message)
                        message = await _read(messages.__anext__())
                except ProtocolBreak as exc:
                    # Named and killed while the SDK still holds its process (its close, on
                    # the way out, lets go of it).
                    self._broken(turn, exc)
                    raise
            if turn.provider_turn_id is None and error is None:
                error = "Claude Code ended the turn without persisting the user message"
                outcome = TurnOutcome.FAILED
        except asyncio.CancelledError:
            outcome, error = TurnOutcome.INTERRUPTED, None
        except ProtocolBreak:
            outcome, error = TurnOutcome.FAILED, turn.provider_failure
        except Exception as exc:  # the CLI failed (or was stopped): the worker lives on
            failed = exc
            text = f"{type(exc).__name__}: {exc}"
            if TIMED_OUT.search(text):
                error = self.events.timeout_text(turn)
            elif error is None:
                error = model_failure_text(
                    "claude-code", self._config.shown_endpoint, text, self._config.credential()
                )
            # else: the error result already named the cause; the exit that follows adds none.
            outcome = TurnOutcome.FAILED
        finally:
            watcher.cancel()
            stop_watch.cancel()
            self._drop_pending(session, turn)
        # A Turn the CLI never named: sealed here, its prompt is never handed after this.
        never_called = turn.provider_turn_id is None and (cli is None or cli.gate.seal())
        if never_called and failed is not None and turn.model_failure is None:
            # The CLI never read the prompt, so no model failure is its cause: what the CLI
            # did, in words (the SDK's own text names neither the program nor a cause).
            code = cli.exit_code() if cli is not None else None
            error = not_started_text(self._tied.real_cli(), failed, code)
        self._finish_turn(session, turn, outcome, error, never_called=never_called)
        if turn.provider_turn_id is not None and not turn.interrupted:
            self.prestart(session)

    @staticmethod
    def _check_session(session: SessionState, turn: TurnState, result: Any) -> None:
        """The Turn's result names the session the CLI wrote it to: one that is not the
        Session's own (a CLI whose session id moves as it resumes) left it out of the
        transcript the Session resumes, forks and re-binds from, so the Turn fails
        `provider_protocol_error` in words rather than being taken as the Session's."""
        written = getattr(result, "session_id", None)
        if isinstance(written, str) and written and written != session.provider_session_id:
            process = getattr(turn.transport, "_process", None)
            pid = getattr(process, "pid", None)
            which = f" (pid {pid})" if isinstance(pid, int) else ""
            turn.provider_failure = (
                f"{PROVIDER_PROTOCOL_ERROR}: the claude-code CLI{which} wrote this Turn to "
                f"session {written}, not the Session's own {session.provider_session_id}, "
                "whose history does not hold it"
            )

    def _broken(self, turn: TurnState, exc: ProtocolBreak) -> None:
        """The SDK cannot read on from the Turn's CLI: it goes (its process tree) and the Turn
        fails `provider_protocol_error` in words."""
        process = getattr(turn.transport, "_process", None)
        pid = getattr(process, "pid", None)
        if turn.provider_failure is None:
            turn.provider_failure = protocol_error(pid, f"wrote what cannot be read ({exc})")
        if isinstance(pid, int) and getattr(process, "returncode", 0) is None:
            kill_tree(pid)

    async def _watch_stopped(self, turn: TurnState) -> None:
        """The turn's CLI (or a process under it) stopped (SIGSTOP, SIGTSTP, a debugger) for
        `stopped_limit_s`: it keeps its pipes open and answers nothing, so neither its exit nor
        a timeout would end the Turn before the host's inactivity limit. Kill it, the Turn
        failing `provider_stopped` in words (the next Turn starts a new CLI).

        On the same tick: a CLI whose stdout ended and that still runs a tick and
        `EOF_EXIT_GRACE_S` later (an exiting one closes its stdout as it exits, and is reaped
        at once) can never say anything again, and the SDK waits for its exit for good:
        killed, the Turn failing `provider_protocol_error`."""
        limit = self._config.stopped_limit_s
        since: float | None = None
        watch: TreeWatch | None = None
        ended: tuple[int, float] | None = None  # the pid whose stdout ended, and when seen
        while True:
            await asyncio.sleep(max(0.05, min(5.0, limit / 4)))
            process = getattr(turn.transport, "_process", None)
            pid = getattr(process, "pid", None)
            if not isinstance(pid, int):
                continue  # not spawned yet
            if getattr(process, "returncode", None) is None and stdout_ended(process):
                now = time.monotonic()
                if ended is not None and ended[0] == pid and now - ended[1] >= EOF_EXIT_GRACE_S:
                    turn.provider_failure = protocol_error(
                        pid, "closed its stdout but kept running"
                    )
                    kill_tree(pid)  # the SDK then sees it exit
                    return
                if ended is None or ended[0] != pid:
                    ended = (pid, now)
            if watch is None or watch.pid != pid:
                watch = TreeWatch(pid)
            now = time.monotonic()
            stopped = watch.stopped(now)
            if stopped is None:
                since = None
                continue
            since = now if since is None else since
            if now - since < limit:
                continue
            turn.provider_failure = stopped_error("claude-code", "CLI", pid, stopped, now - since)
            kill_tree(pid)  # SIGKILL ends a stopped process too; the SDK then sees it exit
            return

    def _drop_pending(self, session: SessionState, turn: TurnState) -> None:
        """No answer can reach a CLI that is gone: cancel what it was waiting on (the host
        supersedes the open Interactions when the Turn settles)."""
        with session.lock:
            pending = list(turn.pending.values())
            turn.pending.clear()
        for item in pending:
            item.answer.cancel()

    def _finish_turn(
        self,
        session: SessionState,
        turn: TurnState,
        outcome: TurnOutcome,
        error: str | None,
        *,
        never_called: bool = False,
    ) -> None:
        """`never_called`: the Turn's prompt was never handed to its CLI (it could not be
        spawned, or ended first): its start fails `ProviderNotCalled`, so the host knows the
        provider never got the Turn."""
        if turn.provider_failure is not None:
            # Whatever the SDK made of the killed CLI's end, the cause is that it was stopped.
            turn.model_failure = turn.provider_failure
        if turn.model_failure is not None:
            error = turn.model_failure
        if turn.provider_turn_id is None:
            # No observed identity: the host learns it from start_turn's failure. The Session
            # freed first, so the failure's answer never meets a next start refused busy.
            with session.lock:
                session.active = None
            if not turn.started.done():
                failure = ProviderNotCalled if never_called else DriverError
                turn.started.set_exception(failure(error or "turn did not start"))
            return
        reconcile_checkpoint(session, turn)
        with session.lock:
            # Cleared before `turn.completed` so the host's next turn.start is never busy.
            session.active = None
        settled = TurnOutcome.INTERRUPTED if turn.interrupted else outcome
        sent_error = error if error and not turn.interrupted else None
        if turn.model_failure is not None and not turn.interrupted:
            settled, sent_error = TurnOutcome.FAILED, turn.model_failure
        turn.emit(
            session.agent_session_id,
            TurnCompleted(turn.turn_id, turn.provider_turn_id, settled.value, sent_error),
        )
