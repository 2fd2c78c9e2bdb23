"""The turn commands: `say` (run a turn and stream it, answering what it asks), `interrupt`,
`answer`.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from client.cli.command import api_error, call, with_client
from client.cli.endpoints import curve, events_source
from client.cli.output import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError, emit
from client.workspace_text import folder_missing
from protocol.methods import (
    INTERACTION_RESPOND,
    SESSION_GET,
    TURN_INTERRUPT,
    InteractionRespondParams,
    SessionParams,
    TurnInterruptParams,
)
from protocol.objects import Interaction, JsonObject, Turn

if TYPE_CHECKING:
    from transport.client import Client


class _Followed:
    """What `say` knows about its turn so far (for Ctrl-C: which turn to interrupt, and why
    when it was not Ctrl-C itself but the end of input at a question)."""

    def __init__(self) -> None:
        self.turn: Turn | None = None
        self.by = "ctrl_c"
        self.reason: str | None = None


class _JsonLines:
    """`say --json`: one JSON object per event — each message once it can no longer grow,
    each Interaction when it appears and when it is answered, then the settled turn."""

    def __init__(self) -> None:
        self.messages: set[str] = set()
        self.interactions: dict[str, str] = {}

    def update(self, turn: Mapping[str, Any]) -> None:
        messages = list(turn.get("messages") or [])
        settled = turn.get("phase") == "settled"
        for index, message in enumerate(messages):
            if message["messageId"] in self.messages:
                continue
            if not settled and index == len(messages) - 1 and message.get("kind") == "assistant":
                continue  # may still be streaming
            self.messages.add(message["messageId"])
            _jsonl({"type": "message", "message": message})
        for interaction in turn.get("interactions") or []:
            if self.interactions.get(interaction["requestId"]) != interaction["status"]:
                self.interactions[interaction["requestId"]] = interaction["status"]
                _jsonl({"type": "interaction", "interaction": interaction})

    @staticmethod
    def delta(event: Mapping[str, Any]) -> None:
        """A streamed piece of a reply (not durable: the settled `message` line is the record)."""
        _jsonl({**event, "type": "message.delta"})


def _jsonl(obj: Mapping[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _ctrl_c_interrupts() -> None:
    """Ctrl-C is how a person stops `say`'s turn: make sure it arrives. A parent may hand this
    process SIGINT blocked (a signal mask is inherited across exec: a launcher thread that
    blocked it, as multiprocessing's does while it spawns) or ignored; either way Ctrl-C would
    silently do nothing while the turn runs on."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@with_client
def run_say(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import (
        TurnPrinter,
        TurnWaitTimeout,
        get_turn,
        resolve_session,
        stream_turn,
    )
    from transport.client import ApiError

    _ctrl_c_interrupts()
    if args.text == "-":
        # The message from a pipe or a file (`say SID - < prompt.txt`); the prompt of an
        # Interaction then has no terminal, as with any redirected input.
        try:
            # Strict or surrogate-escaped by the locale: either way only UTF-8 goes on the wire.
            args.text = sys.stdin.read().rstrip("\n")
            args.text.encode("utf-8")
        except UnicodeError:
            raise CliError(
                "invalid_argument", "say -: standard input is not UTF-8 text", code=EXIT_USAGE
            ) from None
        if not args.text.strip():
            raise CliError("invalid_argument", "say -: standard input was empty", code=EXIT_USAGE)
    elif not args.text.strip():
        # The same usage error as an empty `-`, before a turn is asked for.
        raise CliError(
            "invalid_argument",
            "the message is empty: give the text to send (or `-` to read it from standard input)",
            code=EXIT_USAGE,
        )
    sid = resolve_session(client, args.workspace, args.session)
    events, exact = events_source(args)
    printer: Any = _JsonLines() if args.json else TurnPrinter(print, _write)
    followed = _Followed()
    pending: list[Mapping[str, Any]] = []

    def on_update(turn: Turn) -> None:
        followed.turn = turn
        printer.update(turn)

    def still_pending(interaction: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The Interaction as the daemon has it now, or None while it is still pending."""
        sequence = None if followed.turn is None else followed.turn["sequence"]
        turn = get_turn(
            client,
            args.workspace,
            sid,
            str(interaction["turnId"]),
            int(sequence) if sequence is not None else None,
        )
        for now in turn.get("interactions") or []:
            if now["requestId"] == interaction["requestId"] and now["status"] != "pending":
                return dict(now)
        return None

    def on_interaction(interaction: Interaction) -> JsonObject | None:
        response = _interaction_response(args, interaction, followed, still_pending)
        if response is None:
            pending.append(interaction)
            raise _InteractionPending()
        return response

    try:
        turn = stream_turn(
            client,
            args.workspace,
            sid,
            args.text,
            events_endpoint=events,
            events_curve=curve(args),
            events_exact=exact,
            on_update=on_update,
            on_interaction=on_interaction,
            timeout=args.turn_timeout,
            on_delta=printer.delta,
            answered_by="cli",
        )
    except ApiError as exc:
        if exc.reason != "agent_session_busy":
            raise
        raise CliError(
            exc.reason,
            f"{exc.message}: wait for it (`agenthost show {sid}` shows it) or stop it "
            f"(`agenthost interrupt {sid}`), then say it again",
            error={**api_error(exc).error},
        ) from None
    except TurnWaitTimeout as exc:
        # The daemon is reachable (not exit 3): the Turn is just still running there.
        raise CliError(
            "turn_timeout",
            f"{exc} (--turn-timeout); it keeps running in the daemon: "
            f"`agenthost show {sid}` shows where it is, `agenthost interrupt {sid}` stops it",
        ) from None
    except _InteractionPending:
        interaction = pending[-1]
        asked = _asked(interaction)
        # Nobody can answer here: do not leave the session blocked on a turn nobody will finish.
        turn = _stop_turn(
            args,
            client,
            sid,
            str(interaction["turnId"]),
            printer,
            by="cli",
            reason=f"it {asked} and `agenthost say` had no terminal or option to answer it",
        )
        raise CliError(
            "interaction_pending",
            f"the turn {asked} ({_describe(interaction)}) and was interrupted: nothing here "
            f"could answer it; run it again {_how_to_answer(interaction)}",
        ) from None
    except KeyboardInterrupt:
        # First Ctrl-C (or Ctrl-C at a prompt): interrupt the turn and wait for it to settle.
        # Said at once, before any call to the daemon: Ctrl-C may come while turn.submit's reply
        # is still on its way (the turn exists, `say` does not know its id yet), and from here
        # on a second Ctrl-C is "stop waiting" even while the turn is still being looked up.
        try:
            if not args.json:
                print("\n… interrupting the turn (Ctrl-C again leaves it running)", file=sys.stderr)
            turn_id = (followed.turn["turnId"] if followed.turn else None) or _active_turn(
                args, client, sid
            )
            if not turn_id:
                print("agenthost: interrupted before the turn started", file=sys.stderr)
                return EXIT_INTERRUPTED
            turn = _stop_turn(
                args, client, sid, str(turn_id), printer, by=followed.by, reason=followed.reason
            )
        except KeyboardInterrupt:
            print(
                "\nagenthost: stopped waiting; the turn may still be running: "
                f"`agenthost interrupt {sid}` stops it, `agenthost show {sid}` shows it",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        code = _report_turn(args, turn)
        return code if code == EXIT_OK else EXIT_INTERRUPTED
    return _report_turn(args, turn)


def _report_turn(args: argparse.Namespace, turn: Mapping[str, Any]) -> int:
    ok = turn.get("outcome") == "completed"
    missing = folder_missing(turn)
    if missing is not None:
        # On stderr in both modes: the turn itself may have gone well, and `--json` stays JSON.
        print(f"agenthost: warning: {missing}", file=sys.stderr)
    if args.json:
        data: dict[str, Any] = {"type": "turn", "turn": turn}
        if not ok:
            data["error"] = {
                "reason": f"turn_{turn.get('outcome') or 'unsettled'}",
                "message": turn.get("error") or "",
            }
        _jsonl(data)
    elif not ok:
        print(
            f"agenthost: turn_{turn.get('outcome') or 'unsettled'}: {turn.get('error') or ''}",
            file=sys.stderr,
        )
    return EXIT_OK if ok else EXIT_ERROR


def _active_turn(args: argparse.Namespace, client: Client, sid: str) -> str | None:
    session = call(
        args, client, SESSION_GET, SessionParams(workspaceId=args.workspace, agentSessionId=sid)
    )["session"]
    active = session.get("activeTurnId")
    return str(active) if active else None


def _stop_turn(
    args: argparse.Namespace,
    client: Client,
    sid: str,
    turn_id: str,
    printer: Any | None = None,
    *,
    by: str,
    reason: str | None = None,
) -> Turn:
    """turn.interrupt (saying who and why), then follow the turn until it settles (printing
    what is new)."""
    from client.session_client import get_turn
    from transport.client import ApiError

    params = TurnInterruptParams(
        workspaceId=args.workspace,
        agentSessionId=sid,
        turnId=turn_id,
        by=cast(Literal["ctrl_c", "cli", "gui", "host", "client"], by),
    )
    if reason:
        params["reason"] = reason
    try:
        turn = call(args, client, TURN_INTERRUPT, params)["turn"]
    except ApiError as exc:
        if exc.status >= 500:
            raise
        turn = get_turn(client, args.workspace, sid, turn_id)  # e.g. it settled meanwhile
    deadline = time.monotonic() + max(args.timeout, 5.0)
    while turn.get("phase") != "settled" and time.monotonic() < deadline:
        time.sleep(0.05)
        turn = get_turn(client, args.workspace, sid, turn_id, int(turn["sequence"]))
    if printer is not None:
        printer.update(turn)
    return turn


def _write(text: str) -> None:
    """Partial output (a streamed reply): written and flushed at once."""
    sys.stdout.write(text)
    sys.stdout.flush()


class _InteractionPending(Exception):
    pass


def _describe(interaction: Mapping[str, Any]) -> str:
    from client.session_client import describe_interaction

    return describe_interaction(interaction)


def _asked(interaction: Mapping[str, Any]) -> str:
    """`asked for an approval`, `asked a question`."""
    kind = str(interaction.get("kind") or "interaction")
    if kind == "question":
        return "asked a question"
    return f"asked for an {kind}" if kind[:1] in "aeiou" else f"asked for a {kind}"


def _how_to_answer(interaction: Mapping[str, Any]) -> str:
    """The `say` options that answer this kind of Interaction ahead (the turn that asked is
    interrupted by then, so `agenthost answer` has nothing left to answer)."""
    if interaction.get("kind") == "approval":
        return "with --approve or --decline (or on a terminal, where `say` asks)"
    return "with --answer TEXT (or on a terminal, where `say` asks)"


def _interaction_response(
    args: argparse.Namespace,
    interaction: Mapping[str, Any],
    followed: _Followed,
    still_pending: Callable[[Mapping[str, Any]], Mapping[str, Any] | None],
) -> dict[str, Any] | None:
    kind = interaction.get("kind")
    if kind == "approval" and args.decision:
        return {"decision": args.decision}
    if kind != "approval" and args.answer is not None:
        return {"text": args.answer}
    if sys.stdin.isatty() and not args.json:
        prompt = _describe(interaction)
        ask = f"approve {prompt}? [y/N] " if kind == "approval" else f"{kind}: {prompt} > "
        try:
            reply = _prompt(ask, lambda: still_pending(interaction))
        except EOFError:
            # End of input is not an answer: an approval is declined, a question can only be
            # given up by interrupting the turn. Either way nothing stays pending.
            print(file=sys.stderr)
            if kind == "approval":
                print("agenthost: end of input (Ctrl-D): declined the approval", file=sys.stderr)
                return {"decision": "decline"}
            print(
                "agenthost: end of input (Ctrl-D): no answer to the question, so the turn is "
                "interrupted",
                file=sys.stderr,
            )
            followed.by, followed.reason = "cli", "end of input (Ctrl-D) at its question"
            raise KeyboardInterrupt from None
        if isinstance(reply, str):
            if kind == "approval":
                yes = reply.strip().lower() in ("y", "yes")
                return {"decision": "approve" if yes else "decline"}
            return {"text": reply}
        # Answered from another terminal or the GUI while this prompt waited: say so, and
        # follow the reply it lets the turn give.
        from client.session_client import AnsweredElsewhere, format_interaction

        print(f"\n  answered elsewhere: {format_interaction(reply)}", flush=True)
        raise AnsweredElsewhere()
    return None


PROMPT_POLL_S = 0.25


def _prompt(ask: str, answered: Callable[[], Mapping[str, Any] | None]) -> str | Mapping[str, Any]:
    """Show `ask` and wait for a line from the terminal; the Interaction as answered, when
    someone else answers it first. A line-buffered terminal makes stdin readable only once a
    whole line (or end of input) is there, so each wait is short and never cuts a line."""
    sys.stdout.write(ask)
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], PROMPT_POLL_S)
        if ready:
            line = sys.stdin.readline()
            if not line:
                raise EOFError
            return line.rstrip("\n")
        done = answered()
        if done is not None:
            return done


@with_client
def run_interrupt(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    turn_id = _active_turn(args, client, sid)
    if turn_id is None:
        emit(args, {"turn": None}, "nothing to interrupt: no turn is running")
        return EXIT_OK
    turn = _stop_turn(args, client, sid, turn_id, by="cli", reason=args.reason)
    why = f" {turn['error']}" if turn.get("error") else ""
    emit(
        args,
        {"turn": turn},
        f"Turn {turn['sequence']} {turn.get('outcome') or turn['phase']}{why}",
    )
    return EXIT_OK


@with_client
def run_answer(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import get_turn, resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    turn_id = _active_turn(args, client, sid)
    interactions = get_turn(client, args.workspace, sid, turn_id)["interactions"] if turn_id else []
    waiting = [i for i in interactions or [] if i.get("status") == "pending"]
    if not waiting:
        raise CliError("no_pending_interaction", "the session is not waiting for an answer")
    interaction = waiting[0]
    kind = interaction.get("kind")
    if kind == "approval" and args.decision is None:
        raise CliError(
            "wrong_answer_kind",
            f"the turn asks for an approval ({_describe(interaction)}): use --approve or --decline",
        )
    if kind != "approval" and args.decision is not None:
        raise CliError(
            "wrong_answer_kind",
            f"the turn asks a {kind} ({_describe(interaction)}): use --text",
        )
    response = {"decision": args.decision} if args.decision else {"text": args.text}
    result = call(
        args,
        client,
        INTERACTION_RESPOND,
        InteractionRespondParams(
            workspaceId=args.workspace,
            agentSessionId=sid,
            turnId=interaction["turnId"],
            requestId=interaction["requestId"],
            response=response,
            by="cli",
        ),
    )
    what = {"approve": "approved", "decline": "declined"}.get(
        str(args.decision), f"answered {json.dumps(args.text)}"
    )
    emit(args, result, f"{kind}: {_describe(interaction)} → {what}")
    return EXIT_OK
