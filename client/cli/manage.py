"""The commands that change a session: `delete`, `rename`, `pin` / `unpin`, `settings`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from client.cli.command import call, parse_pairs, with_client
from client.cli.output import EXIT_ERROR, EXIT_OK, CliError, emit


@with_client
def run_delete(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = call(args, client, "session.get", agentSessionId=sid)["session"]
    if not args.yes:
        if args.json or not sys.stdin.isatty():
            raise CliError(
                "confirmation_required", "not a terminal: pass --yes to delete without asking"
            )
        try:
            reply = input(f"delete session {session['title']!r} ({sid})? [y/N] ")
        except EOFError:
            reply = ""
        if reply.strip().lower() not in ("y", "yes"):
            print("not deleted", file=sys.stderr)
            return EXIT_ERROR
    result = call(args, client, "session.delete", agentSessionId=sid)
    emit(args, {**result, "agentSessionId": sid}, f"deleted {sid}  {session['title']}")
    return EXIT_OK


@with_client
def run_rename(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = call(args, client, "session.updateTitle", agentSessionId=sid, title=args.title)[
        "session"
    ]
    emit(args, {"session": session}, f"{sid}  {session['title']}")
    return EXIT_OK


@with_client
def run_pin(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = call(args, client, "session.pin", agentSessionId=sid, pinned=args.pinned)["session"]
    emit(
        args,
        {"session": session},
        f"{sid}  {'pinned' if session['pinned'] else 'unpinned'}",
    )
    return EXIT_OK


@with_client
def run_settings(args: argparse.Namespace, client: Any) -> int:
    from client.session_client import resolve_session

    sid = resolve_session(client, args.workspace, args.session)
    session = call(args, client, "session.get", agentSessionId=sid)["session"]
    if args.pairs:
        # session.updateSettings replaces the map: merge here so `k=v` changes only k.
        merged = dict(session.get("settings") or {})
        for key, value in parse_pairs(args.pairs, "setting").items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        session = call(args, client, "session.updateSettings", agentSessionId=sid, settings=merged)[
            "session"
        ]
    settings = session.get("settings") or {}
    emit(
        args,
        {"session": session},
        "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(settings.items())) or "(no settings)",
    )
    return EXIT_OK
