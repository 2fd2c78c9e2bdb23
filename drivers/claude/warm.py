"""Claude Code CLIs started ahead of a Session's next Turn: one CLI, spawned and initialized
over the SDK's control protocol while no Turn runs, waits on its stdin for the Turn's prompt,
so the Turn does not pay the CLI's start-up (node, the resumed transcript, the handshake).

`Cli` is one such process with the `query()` stream over it; `WarmClis` parks at most one per
Session (and `limit` per worker) and hands it to the Turn only when it was started exactly as the
Turn would start one now: the same options key and the transcript unchanged since its spawn.
Anything else (an expired, dead or mismatched CLI) is closed, and the Turn starts its own. All of
it runs on the driver's asyncio loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from domain.procfs import alive_in_stat, read_proc_stat
from drivers.claude.state import TurnState
from drivers.liveness import TreeWatch, kill_tree, stopped_now

EXIT_WAIT_S = 2.0
"""How long a discarded CLI may take to exit once its stdin is closed, before it is terminated."""
TERM_WAIT_S = 1.0
"""How long it may take to exit once terminated (SIGTERM), before it is killed."""
KILL_WAIT_S = 1.0
"""How long its reaping may take once it and everything below it were SIGKILLed: a SIGKILL ends
a stopped or wedged process too (only a process in an uninterruptible wait delays its end), so
the close never waits on the CLI's cooperation."""
STREAM_CLOSE_S = 0.5
"""How long the close of its `query()` stream may take once the process has ended (the SDK's
own close, which would otherwise wait 5 s, terminate, 5 s, kill, 5 s more)."""
STOP_LOOK_S = 0.1
"""How often a close waiting for a CLI's exit looks whether it (or a process below it) was
stopped (SIGSTOP, SIGTSTP, a debugger): a stopped CLI reads no end of input and handles no
SIGTERM, so it is killed then, not waited for."""
STOP_TREE_AFTER_S = 0.5
"""How long a close waits for a CLI's end before it also looks at the processes below it."""
CLOSE_BOUND_S = EXIT_WAIT_S + TERM_WAIT_S + KILL_WAIT_S + 2 * STREAM_CLOSE_S
"""The longest `Cli.close` takes (5 s), well inside the host's bound on a Session's stop (10 s,
`SessionControls._discard_runtime`): a CLI that ignores its close and its SIGTERM (stopped,
wedged) is killed at `EXIT_WAIT_S + TERM_WAIT_S`."""


TAIL_BYTES = 4096


def transcript_stamp(transcript: Path) -> tuple[int, int, bytes] | None:
    """What a CLI resuming `transcript` read at its start: the file (inode), its size and its
    last bytes (None: absent). A parked CLI whose transcript no longer has its stamp holds a
    stale history. Not the mtime: a resuming CLI touches the file as it starts, unchanged."""
    try:
        with open(transcript, "rb") as fh:
            st = os.fstat(fh.fileno())
            fh.seek(max(0, st.st_size - TAIL_BYTES))
            tail = fh.read(TAIL_BYTES)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, tail)


class PromptGate:
    """Whether the Turn's prompt was handed to the SDK (which only then writes it to the CLI's
    stdin: the prompt reaches the CLI through this stream alone), or sealed first, so it never
    will be. Both happen on the driver's loop thread, so the one that comes first decides."""

    __slots__ = ("handed", "sealed")

    def __init__(self) -> None:
        self.handed = False
        self.sealed = False

    def seal(self) -> bool:
        """Never hand the prompt from now on; whether it was never handed (so the CLI never got
        it: the provider was never called with this Turn)."""
        self.sealed = True
        return not self.handed


async def _one_prompt(
    text: asyncio.Future[str | None], gate: PromptGate
) -> AsyncIterator[dict[str, Any]]:
    """The CLI's input: the Turn's one user message, once it is known (None: nothing, and the
    CLI, its stdin closed, exits); nothing once the gate is sealed."""
    value = await text
    if value is not None and not gate.sealed:
        gate.handed = True
        yield {
            "type": "user",
            "session_id": "",
            "message": {"role": "user", "content": value},
            "parent_tool_use_id": None,
        }


@dataclass(slots=True, eq=False)
class Cli:
    """One CLI process with its `query()` stream: `first` (a task) spawns and initializes it and
    then waits for its first message, which comes only after `prompt` is given."""

    key: tuple[object, ...]
    stamp: tuple[int, int, bytes] | None
    transport: Any
    messages: AsyncGenerator[Any, None]
    prompt: asyncio.Future[str | None]
    first: asyncio.Future[Any]
    gate: PromptGate
    turn: TurnState | None = None
    """The Turn the CLI serves (its permission requests become that Turn's Interactions)."""
    expiry: asyncio.TimerHandle | None = field(default=None)
    spawned: list[Any] = field(default_factory=list)
    """The CLI's process once spawned, kept: the SDK's transport lets go of it as it closes,
    before a failed stream's error reaches its reader (`exit_code`)."""

    @classmethod
    def spawn(
        cls, options: Any, key: tuple[object, ...], stamp: tuple[int, int, bytes] | None
    ) -> Cli:
        """Starts the CLI of `options` now (on the loop thread); `can_use_tool` of `options`
        must find its Turn through the returned `Cli.turn`."""
        from claude_agent_sdk import query
        from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

        loop = asyncio.get_running_loop()
        prompt: asyncio.Future[str | None] = loop.create_future()
        gate = PromptGate()
        stream = _one_prompt(prompt, gate)
        # Our own transport handle (the SDK's default one, pinned version) so an interrupt can
        # stop exactly this CLI; it gets what `query()` would give its own: permission prompts
        # over stdio (the control protocol); `query()` keeps `can_use_tool` and no prompt tool
        # name, or the SDK refuses the pair.
        transport = SubprocessCLITransport(
            prompt=stream, options=replace(options, permission_prompt_tool_name="stdio")
        )
        spawned: list[Any] = []
        connect = transport.connect

        async def connect_and_keep() -> None:
            await connect()
            spawned.append(transport._process)

        # The SDK's `query` connects it through this attribute.
        transport.connect = connect_and_keep  # type: ignore[method-assign]
        # `query` is an async generator function: its stream can be closed (`aclose`).
        messages = cast(
            AsyncGenerator[Any, None], query(prompt=stream, options=options, transport=transport)
        )
        first = asyncio.ensure_future(messages.__anext__())
        return cls(key, stamp, transport, messages, prompt, first, gate, spawned=spawned)

    def exit_code(self) -> int | None:
        """The CLI's exit code (negative: the signal that killed it), once its process was
        reaped; None when it was never started or has not been reaped."""
        code = getattr(self.spawned[0], "returncode", None) if self.spawned else None
        return code if isinstance(code, int) else None

    def process_exited(self) -> bool:
        """The CLI has ended or is ending: reaped (its return code), or, before the loop has
        reaped it, a zombie, exiting or with a SIGKILL pending (`/proc/PID/stat`), so a CLI
        killed a moment ago is never handed a Turn, whose prompt would die with it."""
        process = getattr(self.transport, "_process", None)
        if process is None:
            return False
        if process.returncode is not None:
            return True
        try:
            stat = read_proc_stat(process.pid)
        except (FileNotFoundError, ProcessLookupError):
            return True  # gone (a process reaped between the open and the read: ESRCH)
        except OSError:
            return False  # unreadable is not evidence of an exit
        return not alive_in_stat(stat)

    def usable(self) -> bool:
        """Still waiting for its prompt: neither ended nor failed to start."""
        return not self.first.done() and not self.prompt.done() and not self.process_exited()

    def process(self) -> Any:
        """The CLI's process once spawned (None before), kept after the SDK let go of it."""
        process = getattr(self.transport, "_process", None)
        if process is None and self.spawned:
            process = self.spawned[0]
        return process

    def terminate(self) -> None:
        process = self.process()
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()

    def kill(self) -> None:
        """SIGKILL the CLI and everything below it (a tool's process keeps the Session's folder
        as its HOME); nothing once its process was reaped (its pid may name another one)."""
        process = self.process()
        if process is not None and process.returncode is None:
            kill_tree(process.pid)

    async def ended_within(self, timeout: float) -> bool:
        """Whether the CLI ends within `timeout`: its process reaped, or, never spawned, its
        stream's first read done (the spawn failed or the stream ended before it)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while True:
            process = self.process()
            left = until - loop.time()
            if process is not None:
                return await reaped_within(process, left)
            if self.first.done():
                return True
            if left <= 0:
                return False
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self.first), min(left, SPAWN_LOOK_S))

    async def ended_unless_stopped(self, timeout: float) -> bool | None:
        """`ended_within(timeout)`, looked at every `STOP_LOOK_S`: None as soon as the CLI (or a
        process below it) is seen stopped, an exit it cannot make."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        until = began + timeout
        watch: TreeWatch | None = None
        while True:
            left = until - loop.time()
            if await self.ended_within(max(0.0, min(STOP_LOOK_S, left))):
                return True
            process = self.process()
            if process is not None and process.returncode is None:
                watch = watch if watch is not None else TreeWatch(process.pid)
                if _seen_stopped(watch, loop.time() - began):
                    return None
            if left <= STOP_LOOK_S:
                return False

    async def close(self) -> None:
        """Ends the CLI unused, within `CLOSE_BOUND_S` whatever it does: no prompt, so its stdin
        closes and it exits; terminated if it has not within `EXIT_WAIT_S`, killed (with its
        tree) if it has not `TERM_WAIT_S` later, or as soon as it is seen stopped (SIGKILL is
        the one signal a stopped process takes); its stream closed."""
        if not self.prompt.done():
            self.prompt.set_result(None)
        ended = await self.ended_unless_stopped(EXIT_WAIT_S)
        if ended is False:
            self.terminate()
            ended = await self.ended_unless_stopped(TERM_WAIT_S)
        if not ended:
            self.kill()
            await self.ended_within(KILL_WAIT_S)
        if not self.first.done():
            self.first.cancel()
        await asyncio.wait({self.first}, timeout=STREAM_CLOSE_S)
        if self.first.done() and not self.first.cancelled():
            self.first.exception()  # taken: a killed CLI's read error is no one's to report
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.messages.aclose(), STREAM_CLOSE_S)


async def reaped_unless_stopped(process: Any, timeout: float) -> bool | None:
    """`reaped_within(process, timeout)`, looked at every `STOP_LOOK_S`: None as soon as the
    process (or one below it) is seen stopped, an exit it cannot make."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    until = began + timeout
    watch = TreeWatch(process.pid)
    while True:
        left = until - loop.time()
        if await reaped_within(process, max(0.0, min(STOP_LOOK_S, left))):
            return True
        if process.returncode is None and _seen_stopped(watch, loop.time() - began):
            return None
        if left <= STOP_LOOK_S:
            return False


def _seen_stopped(watch: TreeWatch, waited: float) -> bool:
    """Whether the watched process is stopped (one read), or, once it has been waited for
    `STOP_TREE_AFTER_S`, a process below it (listing a tree walks the process table, which a
    process that ends at once is spared)."""
    if stopped_now(watch.pid):
        return True
    return waited >= STOP_TREE_AFTER_S and watch.stopped(time.monotonic()) is not None


async def reaped_within(process: Any, timeout: float) -> bool:
    """Whether the CLI's `process` (anyio's) is reaped within `timeout`."""
    if process.returncode is None and timeout > 0:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), timeout)
    return process.returncode is not None


SPAWN_LOOK_S = 0.05
"""How often a close looks again for the process of a CLI whose spawn is still under way."""


class WarmClis:
    """The CLIs parked for the next Turn of their Session (loop thread only)."""

    def __init__(self, limit: int, idle_s: float) -> None:
        self._limit = limit
        self._idle_s = idle_s
        self._parked: dict[str, Cli] = {}
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return self._limit > 0

    def parked(self, agent_session_id: str) -> Cli | None:
        return self._parked.get(agent_session_id)

    def take(
        self, agent_session_id: str, key: tuple[object, ...], stamp: tuple[int, int, bytes] | None
    ) -> Cli | None:
        """The Session's parked CLI if it was started as one started now would be; else None
        (and whatever was parked is closed)."""
        cli = self._parked.pop(agent_session_id, None)
        if cli is None:
            return None
        if cli.expiry is not None:
            cli.expiry.cancel()
        if cli.key == key and cli.stamp == stamp and cli.usable():
            return cli
        self.discard(cli)
        return None

    def park(self, agent_session_id: str, cli: Cli) -> None:
        self.drop(agent_session_id)
        self._parked[agent_session_id] = cli
        loop = asyncio.get_running_loop()
        cli.expiry = loop.call_later(self._idle_s, self._expire, agent_session_id, cli)
        while len(self._parked) > self._limit:
            oldest = next(iter(self._parked))
            self.drop(oldest)

    def drop(self, agent_session_id: str) -> None:
        cli = self._parked.pop(agent_session_id, None)
        if cli is not None:
            if cli.expiry is not None:
                cli.expiry.cancel()
            self.discard(cli)

    async def drop_and_wait(self, agent_session_id: str) -> None:
        """`drop`, then wait for the dropped CLI to end."""
        cli = self._parked.pop(agent_session_id, None)
        if cli is None:
            return
        if cli.expiry is not None:
            cli.expiry.cancel()
        await cli.close()

    def _expire(self, agent_session_id: str, cli: Cli) -> None:
        if self._parked.get(agent_session_id) is cli:
            self.drop(agent_session_id)

    def discard(self, cli: Cli) -> None:
        task = asyncio.ensure_future(cli.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close_all(self) -> None:
        for agent_session_id in list(self._parked):
            self.drop(agent_session_id)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
