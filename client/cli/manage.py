"""The commands that change a session: `delete`, `rename`, `pin` / `unpin`, `settings`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from client.cli.command import api_error, call, parse_pairs, with_client
from client.cli.output import EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError, emit
from client.control_chars import shown
from client.failure_words import EMPTY_TITLE_WORDS
from protocol.methods import (
    FORK_GET,
    SESSION_DELETE,
    SESSION_GET,
    SESSION_PIN,
    SESSION_UPDATE_SETTINGS,
    SESSION_UPDATE_TITLE,
    DeleteParams,
    OperationParams,
    PinParams,
    SessionParams,
    UpdateSettingsParams,
    UpdateTitleParams,
)

if TYPE_CHECKING:
    from transport.client import Client


def _fork_tree(args: argparse.Namespace, client: Client, session: Mapping[str, Any]) -> Any:
    """The tree a worktree fork made for this Session, while it stands (else None)."""
    lineage = session.get("forkedFrom")
    if not isinstance(lineage, dict):
        return None
    op = call(
        args,
        client,
        FORK_GET,
        OperationParams(workspaceId=args.workspace, operationId=lineage["operationId"]),
    )["operation"]
    where: Mapping[str, Any] = op.get("workspace") or {}
    if where.get("mode") != "worktree" or where.get("state") != "made":
        return None
    return where


def _ask(question: str) -> bool:
    try:
        # input() on a terminal writes its prompt past sys.stdout: shown here.
        reply = input(shown(question))
    except EOFError:
        reply = ""
    return reply.strip().lower() in ("y", "yes")


def _dirty_words(sid: str, exc: Any) -> str:
    p = exc.params
    what = []
    if p.get("uncaptured"):
        what.append("changes made after its last checkpoint")
    if p.get("commits"):
        what.append(
            f"{p['commits']} commit(s) on branch {p.get('branch')} that no other branch has"
        )
    return (
        f"not deleted: the worktree {p.get('path')} holds {' and '.join(what)}; keep it "
        f"(agenthost delete {sid[:8]} --worktree keep) or remove it anyway "
        f"(agenthost delete {sid[:8]} --worktree remove --force; a branch with commits of its "
        "own is kept)"
    )


@with_client
def run_delete(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import resolve_session
    from transport.client import ApiError

    if args.force and args.worktree != "remove":
        # Alone it would change nothing: the worktree is kept and the session deleted anyway.
        raise CliError(
            "invalid_argument",
            "--force only goes with --worktree remove (remove the worktree even though it "
            "holds changes); add --worktree remove, or leave --force out",
            code=EXIT_USAGE,
        )
    sid = resolve_session(client, args.workspace, args.session)
    session = call(
        args, client, SESSION_GET, SessionParams(workspaceId=args.workspace, agentSessionId=sid)
    )["session"]
    tree = _fork_tree(args, client, session)
    worktree = args.worktree
    if not args.yes:
        if args.json or not sys.stdin.isatty():
            raise CliError(
                "confirmation_required", "not a terminal: pass --yes to delete without asking"
            )
        if not _ask(f"delete session {session['title']!r} ({sid})? [y/N] "):
            print("not deleted", file=sys.stderr)
            return EXIT_ERROR
        if tree is not None and worktree is None:
            remove = _ask(f"remove its worktree {tree['path']} too? [y/N] ")
            worktree = "remove" if remove else "keep"
    params = DeleteParams(
        workspaceId=args.workspace,
        agentSessionId=sid,
        worktree=cast(Literal["keep", "remove"], worktree or "keep"),
    )
    if args.force:
        params["force"] = True
    try:
        result = call(args, client, SESSION_DELETE, params)
    except ApiError as exc:
        if exc.reason != "workspace_worktree_dirty":
            raise
        raise CliError(exc.reason, _dirty_words(sid, exc), error=api_error(exc).error) from exc
    human = f"deleted {sid}  {session['title']}"
    done = result.get("worktree")
    if done and done.get("state") == "removed":
        kept = f"; branch {done['branch']} kept (it has commits of its own)"
        human += f"\nworktree {done['path']} removed{kept if done.get('branchKept') else ''}"
    elif done and done.get("state") == "removing":
        human += (
            f"\nworktree {done['path']} could not be removed: {done.get('error', '')}"
            " (the daemon tries again in the background until it goes)"
        )
    elif done:
        on = f" (branch {done['branch']})" if done.get("branch") else ""
        human += f"\nworktree kept: {done['path']}{on}"
        if done.get("inUseBy"):
            human += f" — other sessions work in it: {', '.join(done['inUseBy'])}"
    emit(args, {**result, "agentSessionId": sid}, human)
    return EXIT_OK


@with_client
def run_rename(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import resolve_session

    if args.title == "":
        # The usage error `new --title ""` gives, before anything is sent.
        raise CliError("invalid_argument", EMPTY_TITLE_WORDS, code=EXIT_USAGE)
    sid = resolve_session(client, args.workspace, args.session)
    session = call(
        args,
        client,
        SESSION_UPDATE_TITLE,
        UpdateTitleParams(workspaceId=args.workspace, agentSessionId=sid, title=args.title),
    )["session"]
    emit(args, {"session": session}, f"{sid}  {session['title']}")
    return EXIT_OK


@with_client
def run_pin(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = call(
        args,
        client,
        SESSION_PIN,
        PinParams(workspaceId=args.workspace, agentSessionId=sid, pinned=args.pinned),
    )["session"]
    emit(
        args,
        {"session": session},
        f"{sid}  {'pinned' if session['pinned'] else 'unpinned'}",
    )
    return EXIT_OK


@with_client
def run_settings(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = call(
        args, client, SESSION_GET, SessionParams(workspaceId=args.workspace, agentSessionId=sid)
    )["session"]
    if args.pairs:
        # session.updateSettings replaces the map: merge here so `k=v` changes only k.
        merged = dict(session.get("settings") or {})
        for key, value in parse_pairs(args.pairs, "setting").items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        session = call(
            args,
            client,
            SESSION_UPDATE_SETTINGS,
            UpdateSettingsParams(workspaceId=args.workspace, agentSessionId=sid, settings=merged),
        )["session"]
    settings = session.get("settings") or {}
    emit(
        args,
        {"session": session},
        "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(settings.items())) or "(no settings)",
    )
    return EXIT_OK
