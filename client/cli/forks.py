"""The fork commands: `fork` (through a settled turn or from the latest one, followed through
its acknowledgement), `tree`, `resolve` (an unknown fork operation), `op`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from client.cli.command import call, with_client
from client.cli.endpoints import curve, events_source
from client.cli.output import EXIT_ERROR, EXIT_OK, EXIT_UNKNOWN, emit
from protocol.methods import (
    FORK_ACKNOWLEDGE,
    FORK_GET,
    FORK_RESOLVE,
    SESSION_GET,
    SESSION_LINEAGE,
    ForkResolveParams,
    LineageParams,
    Method,
    OperationParams,
    OperationResult,
    SessionParams,
)
from protocol.objects import Operation, Turn

if TYPE_CHECKING:
    from transport.client import Client


@with_client
def run_tree(args: argparse.Namespace, client: Client) -> int:
    from client.lineage_view import format_tree
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    tree = call(
        args, client, SESSION_LINEAGE, LineageParams(workspaceId=args.workspace, agentSessionId=sid)
    )
    emit(args, tree, format_tree(tree))
    return EXIT_OK


@with_client
def run_resolve(args: argparse.Namespace, client: Client) -> int:
    from client.lineage_view import format_resolution, status_words

    operation_id = _operation_id(args, client)
    if args.action == "inspect":
        # Only an `unknown` operation has anything to resolve: say what the others are instead
        # of the evidence's verdict (a committed fork's child reads as "adoptable").
        op = _get_operation(args, client, operation_id)
        if op["status"] != "unknown":
            human = f"operation {operation_id} is {status_words(op)}: nothing to resolve"
            human += " (only a fork whose outcome is unknown can be resolved)"
            child = op.get("session")
            if child:
                human += f"\n  child session: {child['agentSessionId']}  {child['title']}"
            emit(args, {"operation": op, "evidence": None}, human)
            return EXIT_OK
    result = call(
        args,
        client,
        FORK_RESOLVE,
        ForkResolveParams(
            workspaceId=args.workspace,
            operationId=operation_id,
            requestId=args.request_id or str(uuid.uuid4()),
            action=args.action,
        ),
    )
    human = format_resolution(result).replace("OP", operation_id)
    if args.action == "adopt" and result["operation"]["status"] == "committed":
        # Adopted like any fork commit: the boundary stays held until a client ACKs it.
        human += f"\n  next: agenthost op {operation_id} --ack (releases the turn for new forks)"
    emit(args, result, human)
    return EXIT_OK


def _operation_id(args: argparse.Namespace, client: Client) -> str:
    from client.session_client import resolve_operation

    return resolve_operation(client, args.workspace, args.operation)


def _get_operation(
    args: argparse.Namespace,
    client: Client,
    operation_id: str,
    method: Method[OperationParams, OperationResult] = FORK_GET,
) -> Operation:
    """fork.get (or fork.acknowledge); a 404 gets the hint about id prefixes."""
    from client.cli.command import api_error
    from client.references import OPERATION_HINT
    from transport.client import ApiError

    try:
        return call(
            args,
            client,
            method,
            OperationParams(workspaceId=args.workspace, operationId=operation_id),
        )["operation"]
    except ApiError as exc:
        if exc.reason != "agent_session_fork_operation_not_found":
            raise
        error = api_error(exc)
        error.message = f"{exc.message}: {OPERATION_HINT}"
        error.error["message"] = error.message
        raise error from None


@with_client
def run_fork(args: argparse.Namespace, client: Client) -> int:
    from client.engine.lifecycle import Engine
    from client.engine.values import LATEST_SETTLED, AckState, MutationStatus
    from client.session_client import resolve_session, resolve_turn, timeline

    sid = resolve_session(client, args.workspace, args.session)
    if args.latest:
        turn_id = LATEST_SETTLED  # the daemon resolves the boundary; the Engine's key for it
    else:
        turn_id = resolve_turn(timeline(client, args.workspace, sid), args.through)
    events, exact = events_source(args)
    engine = Engine(client, args.workspace)
    try:
        if events is not None:
            engine.attach_events(events, curve=curve(args), exact=exact)
        workspace = "worktree" if args.worktree else "shared"
        record = (
            engine.fork_latest(sid, workspace)
            if args.latest
            else engine.fork(sid, turn_id, workspace)
        )
        shown: str | None = None

        def changed() -> bool:
            return engine.mutation(sid, turn_id) != record

        deadline = time.monotonic() + args.fork_timeout
        while record.status is MutationStatus.IN_FLIGHT and time.monotonic() < deadline:
            if not args.json and record.operation_id and record.phase != shown:
                shown = record.phase
                print(
                    f"… fork accepted ({shown}), operation {record.operation_id}", file=sys.stderr
                )
            engine.wait_for(changed, 0.5)
            record = engine.mutation(sid, turn_id) or record
        if record.status is MutationStatus.SUCCEEDED:
            # Give the client-observed ACK its deadline (and first retry) before we exit.
            engine.wait_for(
                lambda: getattr(engine.mutation(sid, turn_id), "ack", None) is AckState.OBSERVED,
                engine.ack_deadline + 2,
            )
            record = engine.mutation(sid, turn_id) or record
        operation = None
        if record.operation_id:
            operation = engine.request(
                FORK_GET,
                OperationParams(workspaceId=args.workspace, operationId=record.operation_id),
                timeout=args.timeout,
            )["operation"]
        session: Mapping[str, Any] | None = None
        turns: list[Turn] = []
        if record.error_detail is not None:
            # A refusal before any operation: read the source so the sentence can name turns.
            with contextlib.suppress(Exception):
                session = call(
                    args,
                    client,
                    SESSION_GET,
                    SessionParams(workspaceId=args.workspace, agentSessionId=sid),
                )["session"]
                turns = timeline(client, args.workspace, sid)
    finally:
        engine.close()
    return _report_fork(args, record, operation, session=session, turns=turns)


def files_line(workspace: Mapping[str, Any] | None) -> str:
    """Where a worktree fork's files are, as a line of its own ("" for a shared fork)."""
    if not workspace or workspace.get("mode") != "worktree":
        return ""
    state = workspace.get("state")
    if state == "removing":
        # Its child deleted; git may not have managed yet (the daemon keeps trying).
        return f"\nfiles: its worktree {workspace.get('path')} is being removed"
    if state == "removed":
        return "\nfiles: its worktree was removed"
    branch = workspace.get("branch")
    on = f" on branch {branch}" if branch else " (a plain directory: not in a git repository)"
    where = workspace.get("cwd") or workspace.get("path")
    return f"\nfiles: {where}{on}"


def _report_fork(
    args: argparse.Namespace,
    record: Any,
    operation: Any,
    *,
    session: Mapping[str, Any] | None = None,
    turns: list[Turn] | None = None,
) -> int:
    from client.engine.values import AckState, MutationStatus
    from client.session_client import fork_refusal

    data = {"mutation": record.to_dict(), "operation": operation}
    status = record.status
    if status is MutationStatus.SUCCEEDED:
        child = (operation or {}).get("session") or {}
        how = "from its latest settled turn, " if record.point != "throughTurn" else ""
        human = (
            f"forked {record.source_session_id} {how}through turn {record.boundary}\n"
            f"child {record.child_session_id}  {child.get('title', '')}\n"
            f"operation {record.operation_id} committed"
        )
        human += files_line((operation or {}).get("workspace"))
        if record.ack is not AckState.OBSERVED:
            human += (
                "\nwarning: acknowledgement still pending; the boundary stays held until a "
                "client acknowledges it (`agenthost op --ack`)"
            )
        emit(args, data, human)
        return EXIT_OK
    if status is MutationStatus.IN_FLIGHT:
        reason, code = "fork_timeout", EXIT_UNKNOWN
        message = f"operation {record.operation_id} still accepted; see `agenthost op`"
    elif status is MutationStatus.UNKNOWN:
        reason, code = "agent_session_fork_delivery_unknown", EXIT_UNKNOWN
        message = f"{record.error}; a retry reuses the same identity and never forks twice"
        if record.operation_id:
            message += f"; or settle it: agenthost resolve {record.operation_id}"
    elif record.error_detail is not None:
        # Refused before any operation existed: the daemon's error reply, in words.
        detail = dict(record.error_detail)
        reason, code = str(detail.get("reason") or "agent_session_fork_failed"), EXIT_ERROR
        message = fork_refusal(
            reason,
            detail.get("params"),
            turn_id=record.turn_id,
            latest=record.point != "throughTurn",
            turns=turns or [],
            session=session,
            message=detail.get("message"),
        )
        error = {**detail, "reason": reason, "message": message}
        error.setdefault("retryable", False)
        if args.json:
            print(json.dumps({**data, "error": error}))
        else:
            print(f"agenthost: {message}", file=sys.stderr)
        return code
    else:
        reason, code = record.error or "agent_session_fork_failed", EXIT_ERROR
        message = f"fork failed: {(operation or {}).get('error') or record.error}"
    if args.json:
        print(json.dumps({**data, "error": {"reason": reason, "message": message}}))
    else:
        print(f"agenthost: {reason}: {message}", file=sys.stderr)
    return code


@with_client
def run_op(args: argparse.Namespace, client: Client) -> int:
    from client.lineage_view import status_words

    operation_id = _operation_id(args, client)
    op = _get_operation(args, client, operation_id, FORK_ACKNOWLEDGE if args.ack else FORK_GET)
    point = op["point"]
    lines = [
        f"operation {op['operationId']}: {status_words(op)}",
        f"  source {op['sourceAgentSessionId']}"
        + (" from its latest settled turn," if point.get("type") == "latestSettled" else "")
        + f" through turn {point['turnId']}",
        f"  target {op['targetAgentSessionId']}  request {op['requestId']}",
    ]
    if op.get("error"):
        lines.append(f"  error: {op['error']}")
    if child := op.get("session"):
        lines.append(f"  child: {child['title']}")
    if files_line(op.get("workspace")):
        lines.append("  " + files_line(op.get("workspace")).strip())
    if args.ack:
        lines.insert(
            0,
            f"acknowledged: the fork is committed and its turn {point['turnId']} is free for "
            "new forks",
        )
    emit(args, {"operation": op}, "\n".join(lines))
    return EXIT_OK
