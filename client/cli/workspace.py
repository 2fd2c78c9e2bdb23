"""The workspace commands: `diff` (what a turn changed in the session's folder, or between two
turns) and `restore` (put the folder back to a turn's checkpoint; undoable)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Literal, cast

from client.cli.command import api_error, call, with_client
from client.cli.output import EXIT_OK, EXIT_USAGE, CliError, emit
from client.workspace_text import change_list, restore_summary
from protocol.methods import (
    SESSION_GET,
    SESSION_WORKSPACE_DIFF,
    WORKSPACE_RESTORE,
    SessionParams,
    WorkspaceDiffParams,
    WorkspaceRestoreParams,
)
from transport.client import ApiError

if TYPE_CHECKING:
    from transport.client import Client

# What a restore prints after `undo with:` (a git tree id, SHA-1 or SHA-256).
_CHECKPOINT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _turn(client: Client, args: argparse.Namespace, sid: str, ref: str | None) -> str | None:
    from client.session_client import resolve_turn, timeline

    if ref is None:
        return None
    return str(resolve_turn(timeline(client, args.workspace, sid), ref))


@with_client
def run_diff(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    params = WorkspaceDiffParams(workspaceId=args.workspace, agentSessionId=sid)
    turn_id = _turn(client, args, sid, args.turn)
    from_id = _turn(client, args, sid, args.from_turn)
    if turn_id is not None:
        params["turnId"] = turn_id
    if from_id is not None:
        params["fromTurnId"] = from_id
    if args.max_bytes is not None:
        params["maxBytes"] = args.max_bytes
    try:
        result = call(args, client, SESSION_WORKSPACE_DIFF, params)
    except ApiError as exc:
        raise _copied_by_a_fork(args, client, sid, exc) or exc from None
    files = result["changedFiles"]
    span = (
        f"from turn {result['fromTurnId']} to turn {result['turnId']}"
        if result.get("fromTurnId")
        else f"turn {result['turnId']}"
    )
    head = f"{span} in {result['cwd']}: " + (
        f"{len(files)} file(s) changed: {change_list(files, limit=len(files))}"
        if files
        else "no files changed"
    )
    body = result["diff"].rstrip("\n")
    cut = "\n(diff cut at the size bound; --max-bytes for more)" if result["truncated"] else ""
    emit(args, result, head + (f"\n{body}" if body else "") + cut)
    return EXIT_OK


def _copied_by_a_fork(
    args: argparse.Namespace, client: Client, sid: str, exc: ApiError
) -> CliError | None:
    """A fork child's copied Turn has no checkpoint of its own (`workspaceReason` `forked`):
    name the source Session's Turn of the same sequence, whose `diff` shows its files."""
    from client.session_client import timeline

    params = exc.params or {}
    if exc.reason != "workspace_checkpoint_missing" or params.get("workspaceReason") != "forked":
        return None
    ids = SessionParams(workspaceId=args.workspace, agentSessionId=sid)
    forked = call(args, client, SESSION_GET, ids)["session"].get("forkedFrom")
    source = forked["sourceAgentSessionId"] if forked else None
    turns = {t["turnId"]: t["sequence"] for t in timeline(client, args.workspace, sid)}
    sequence = turns.get(str(params.get("turnId")))
    if not source or sequence is None:
        return None
    wire = api_error(exc)  # --json: the daemon's error as it came
    return CliError(
        wire.reason,
        f"turn {sequence} was copied by the fork that made this session: its files changed in"
        f" the source session — agenthost diff {source} --turn {sequence}",
        error=wire.error,
    )


@with_client
def run_restore(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import resolve_session

    if args.undo is not None and args.before:
        # An undo id names one state of the folder: there is no "before" to choose.
        raise CliError(
            "invalid_argument",
            "--before goes with --turn (the files as that turn found them), not with --undo",
            code=EXIT_USAGE,
        )
    if args.undo is not None and not _CHECKPOINT_ID.fullmatch(args.undo):
        raise CliError(
            "invalid_argument",
            f"--undo {args.undo!r}: give the id a restore printed after `undo with:` "
            "(40 or 64 hex digits)",
            code=EXIT_USAGE,
        )
    sid = resolve_session(client, args.workspace, args.session)
    params = WorkspaceRestoreParams(
        workspaceId=args.workspace, agentSessionId=sid, force=bool(args.force)
    )
    if args.undo:
        params["tree"] = args.undo
        what = f"to checkpoint {args.undo}"
    else:
        turn_id = _turn(client, args, sid, args.turn)
        which: Literal["before", "after"] = "before" if args.before else "after"
        # An unknown Turn is sent as null: the daemon says which Turn it could not find.
        params["turnId"] = cast(str, turn_id)
        params["which"] = which
        what = f"as turn {turn_id} {'found' if args.before else 'left'} it"
    try:
        result = call(args, client, WORKSPACE_RESTORE, params)
    except ApiError as exc:
        if exc.reason != "workspace_shared":
            raise
        listed = exc.params.get("agentSessionIds")
        others = ", ".join(str(s)[:8] for s in (listed if isinstance(listed, list) else []))
        raise CliError(
            exc.reason,
            f"other live sessions ({others}) work in this folder too: their files would change "
            "behind their back; run again with --force to restore anyway",
        ) from exc
    changed = restore_summary(result["changedFiles"])
    emit(
        args,
        result,
        f"restored {result['cwd']} {what}: {changed}\n"
        f"undo with: agenthost restore {sid} --undo {result['undo']['tree']}",
    )
    return EXIT_OK
