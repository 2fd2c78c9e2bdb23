"""An in-process daemon for tests that look inside it (its API's pools, its publisher): the real
`Daemon` on a fresh home, its real store, worker processes and app-servers, and a client on its
API endpoint — closed, client first, when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agenthost.config import load_config
from agenthost.daemon import Daemon
from transport.client import Client


@contextmanager
def in_process_daemon(home: Path, timeout: float = 20.0) -> Iterator[tuple[Daemon, Client]]:
    """Start a daemon on `home` (created 0700 if missing) and yield it with a client whose calls
    wait up to `timeout` seconds."""
    home.mkdir(mode=0o700, exist_ok=True)
    # A small directory of its own as the default Session `cwd` (see DaemonProcess.workdir).
    workdir = home.parent / f"{home.name}-work"
    workdir.mkdir(exist_ok=True)
    daemon = Daemon(load_config(home), default_cwd=workdir)
    try:
        daemon.start()
        client = Client(daemon.api_endpoint, timeout=timeout)
        try:
            yield daemon, client
        finally:
            client.close()
    finally:
        daemon.close()
