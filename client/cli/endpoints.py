"""Where the client commands find the daemon: the home's ipc sockets (`domain.home_layout`),
or a connection file's TCP endpoints and CURVE keys (`--connection`, `$AGENTHOST_CONNECTION`;
`transport.connection_file`), and `--connect` / `--events` given as they are.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from client.cli.output import EXIT_USAGE, CliError
from domain.home_layout import (
    API_SOCKET,
    EVENTS_EXACT_SOCKET,
    EVENTS_SOCKET,
    default_home,
    run_dir,
)


def connection(args: argparse.Namespace) -> Any:
    """The parsed `--connection` file (or $AGENTHOST_CONNECTION), None without one."""
    from transport.connection_file import CONNECTION_ENV, KeyError_, load_connection

    path = getattr(args, "connection", None) or os.environ.get(CONNECTION_ENV) or None
    if path is None:
        return None
    cached = getattr(args, "_connection_loaded", None)
    if cached is None:
        try:
            cached = load_connection(Path(path))
        except KeyError_ as exc:
            raise CliError("bad_connection_file", str(exc), code=EXIT_USAGE) from None
        args._connection_loaded = cached
    return cached


def endpoints(args: argparse.Namespace) -> tuple[str, str]:
    """(api, events); events is "" when a connection file names no events endpoint."""
    run = run_dir((args.home or default_home()).expanduser())
    conn = connection(args)
    if conn is not None:
        return args.connect or conn.api, args.events or conn.events or ""
    api = args.connect or f"ipc://{run / API_SOCKET}"
    events = args.events or f"ipc://{run / EVENTS_SOCKET}"
    return api, events


def events_endpoint(args: argparse.Namespace) -> str | None:
    """The events endpoint to subscribe to, or None (none named, or no ipc socket there)."""
    return events_source(args)[0]


def events_source(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(endpoint, exact): the events endpoint to subscribe to (None: none) and whether it is
    the terminated-topic one (`eventsExact`), preferred wherever the daemon
    advertises it — its connection file's `eventsExact`, or the home's `events-exact.sock` —
    unless `--events` names an endpoint."""
    if not args.events:
        conn = connection(args)
        if conn is not None and conn.events_exact:
            return conn.events_exact, True
        if conn is None:
            run = run_dir((args.home or default_home()).expanduser())
            if (run / EVENTS_EXACT_SOCKET).exists():
                return f"ipc://{run / EVENTS_EXACT_SOCKET}", True
    _, events = endpoints(args)
    if not events or (events.startswith("ipc://") and not Path(events[len("ipc://") :]).exists()):
        return None, False
    return events, False


def curve(args: argparse.Namespace) -> Any:
    """The CURVE keys of the connection file (None without one)."""
    conn = connection(args)
    return None if conn is None else conn.curve


def home_path(args: argparse.Namespace) -> Path:
    return Path(os.path.abspath((args.home or default_home()).expanduser()))
