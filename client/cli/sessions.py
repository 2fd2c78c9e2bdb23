"""The session commands: `status`, `sessions`, `new`, `show`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client.cli.command import call, parse_pairs, with_client
from client.cli.output import EXIT_OK, EXIT_USAGE, CliError, emit
from protocol.methods import (
    HOST_STATUS,
    SESSION_CREATE,
    SESSION_GET,
    SessionCreateParams,
    SessionParams,
)
from protocol.objects import Session

if TYPE_CHECKING:
    from transport.client import Client


@with_client
def run_status(args: argparse.Namespace, client: Client) -> int:
    result = call(args, client, HOST_STATUS)
    workers = ", ".join(
        f"{w['provider']} {w['state']} (pid {w['pid']}, {w['restarts']} restarts)"
        for w in result["workers"]
    )
    emit(
        args,
        result,
        f"agenthost {result['version']} (protocol {result['protocol']}) at {result['home']}, "
        f"up {result['uptimeMs'] / 1000:.0f} s\nworkers: {workers or 'none started'}"
        + "".join(f"\n{provider_line(p)}" for p in result.get("providers") or [])
        + connections_line(result.get("connections"))
        + checkpoints_line(result.get("checkpoints"))
        + removals_line(result.get("worktreeRemovals")),
    )
    return EXIT_OK


def removals_line(r: Mapping[str, Any] | None) -> str:
    """The deleted forks' trees the daemon has not removed yet and keeps trying, each with why
    (none, or an older daemon: nothing; one that does not say why: the paths alone)."""
    if not r or not r.get("pending"):
        return ""
    head = f"\nworktrees being removed: {r['pending']} (the daemon tries again in the background)"
    trees = r.get("trees")
    if not isinstance(trees, list):
        return f"{head}: {', '.join(str(p) for p in r.get('paths') or [])}"
    return head + "".join(f"\n  {t.get('path')}: {_why_left(t)}" for t in trees)


def _why_left(tree: Mapping[str, Any]) -> str:
    reason = tree.get("reason")
    if reason == "in_use":
        users = ", ".join(str(u) for u in tree.get("inUseBy") or [])
        return f"kept while another session works in it ({users})"
    if reason == "git_failed":
        return f"git could not remove it yet: {tree.get('error') or 'see the daemon log'}"
    if reason == "not_recorded":
        return f"removed, its record not yet written: {tree.get('error') or 'see the daemon log'}"
    if reason == "not_tried":
        return "not tried yet"
    return str(reason)


def checkpoints_line(c: Mapping[str, Any] | None) -> str:
    """The workspace checkpoint store: on or off, its size and place (older daemons do not
    say: nothing)."""
    if not c:
        return ""
    state = "on" if c.get("enabled") else "off ([workspace] checkpoints = false)"
    return f"\ncheckpoints: {state}, {human_bytes(int(c.get('bytes') or 0))} in {c.get('path')}"


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def connections_line(c: Mapping[str, Any] | None) -> str:
    """What the daemon's listeners hold and refused, and its descriptor limit (older daemons
    do not say: nothing)."""
    if not c:
        return ""
    shim = c.get("acceptShim") or {}
    if shim.get("loaded"):
        accept = "; accept shim loaded"
    elif shim.get("unavailable"):
        accept = f"; accept shim {shim['unavailable']}: see docs/design/connections.md"
    else:
        accept = ""
    return (
        f"\nconnections: {c['open']} of {c['max']} held, {c['refused']} refused, {c['shed']} idle"
        f" shed (descriptor limit {c['fdLimit']}, {c['fdReserve']} kept in reserve{accept})"
    )


def provider_line(p: Mapping[str, Any]) -> str:
    """One provider in words: program and version, endpoint, model, credential source (the
    variable's name and whether it is set, never its value)."""
    if not p.get("installed"):
        how = f"; install it with `{p['install']}`" if p.get("install") else ""
        return f"  {p['provider']}: NOT INSTALLED ({p.get('program')}){how}"
    cred = p.get("credential") or {}
    source = cred.get("source")
    if source == "env":
        credential = f"${cred.get('variable')} ({'set' if cred.get('set') else 'NOT SET'})"
    elif source == "file":
        credential = "api_key in agenthost.toml"
    elif source == "login":
        credential = "the user's own login"
    else:
        credential = "none"
    endpoint = p.get("endpoint") or "default"
    wire = f" [{p['wireApi']}]" if p.get("wireApi") else ""
    return (
        f"  {p['provider']} {p.get('version') or '?'}: endpoint {endpoint}{wire}, "
        f"model {p.get('model') or 'default'}, credential {credential}"
    )


@with_client
def run_sessions(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import list_sessions

    sessions = list_sessions(client, args.workspace)
    emit(args, {"sessions": sessions}, session_table(sessions) or "(no sessions)")
    return EXIT_OK


def session_table(sessions: list[Session]) -> str:
    """One row a Session in lineage order: the id, provider and fork columns stay aligned for
    every row (the tree is drawn in the title column), a pinned Session is marked, and so is a
    fork whose source was deleted (it is listed at the top level, having no source to sit
    under)."""
    from client.session_client import session_tree

    if not sessions:
        return ""
    listed = {str(s["agentSessionId"]) for s in sessions}
    width = max(len(str(s["provider"])) for s in sessions)
    lines = [f"{'SESSION':<36}  {'PROVIDER':<{width}}  {'FORK':<8}  TITLE"]
    for row in session_tree(sessions):
        s = row.session
        branch = "   " * (row.depth - 1) + "└─ " if row.depth else ""
        fork = "can fork" if s["lifecycleCapabilities"]["forkThroughTurn"] else "no fork"
        marks = []
        if s.get("pinned"):
            marks.append("pinned")
        source = (s.get("forkedFrom") or {}).get("sourceAgentSessionId")
        if source and source not in listed:
            marks.append(f"source {str(source)[:8]} deleted")
        if s.get("activeTurnId"):
            marks.append("turn active")
        tail = "".join(f"  ({m})" for m in marks)
        lines.append(
            f"{s['agentSessionId']:<36}  {s['provider']:<{width}}  {fork:<8}  "
            f"{branch}{s['title']}{tail}"
        )
    return "\n".join(lines)


def _absolute_cwd(value: str | None) -> str:
    path = Path(value).expanduser() if value else Path.cwd()
    path = path.resolve()
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise CliError("invalid_cwd", f"--cwd {value!r}: {what} ({path})", code=EXIT_USAGE)
    return str(path)


def refuse_empty(value: str | None, option: str, absent: str) -> None:
    """A given `--title`/`--model` must have text (the protocol's 1.. characters): an empty one
    is a usage error (exit 2, before anything is sent), never quietly taken for `absent`."""
    if value == "":
        raise CliError(
            "invalid_argument",
            f"{option} is empty: give a value, or leave {option} out for {absent}",
            code=EXIT_USAGE,
        )


@with_client
def run_new(args: argparse.Namespace, client: Client) -> int:
    refuse_empty(args.title, "--title", '"New session"')
    refuse_empty(args.model, "--model", "the provider's configured model")
    params = SessionCreateParams(
        workspaceId=args.workspace, provider=args.provider, cwd=_absolute_cwd(args.cwd)
    )
    if args.title:
        params["title"] = args.title
    if args.settings:
        params["settings"] = parse_pairs(args.settings, "--settings")
    if args.model:
        params["model"] = args.model  # only when given: a daemon without it keeps its default
    session = call(args, client, SESSION_CREATE, params)["session"]
    emit(
        args,
        {"session": session},
        f"{session['agentSessionId']}  {session['provider']}  {session['title']}",
    )
    return EXIT_OK


@with_client
def run_show(args: argparse.Namespace, client: Client) -> int:
    from client.session_client import (
        format_transcript,
        resolve_session,
        source_title,
        timeline,
    )
    from client.transcript_text import lineage_ancestry

    sid = resolve_session(client, args.workspace, args.session)
    session = call(
        args, client, SESSION_GET, SessionParams(workspaceId=args.workspace, agentSessionId=sid)
    )["session"]
    turns = timeline(client, args.workspace, sid)
    source = source_title(client, args.workspace, session)
    chain = lineage_ancestry(client, args.workspace, session)
    emit(
        args,
        {"session": session, "turns": turns},
        format_transcript(session, turns, source, chain),
    )
    return EXIT_OK
