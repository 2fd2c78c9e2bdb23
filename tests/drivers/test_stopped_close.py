"""A stopped (SIGSTOP) app-server's close: it can read no end of input and handle no SIGTERM,
so a close that waits for either (3 s each) waits for nothing; one seen stopped is SIGKILLed
with its tree at once, and its runtime's close ends it in well under those waits."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import psutil
import pytest

from domain.procfs import pid_exists
from drivers.app_server.runtimes import Runtimes
from drivers.liveness import stopped_now
from drivers.tutti_agent import TuttiAgentProvider
from tests.support.daemon import wait_for

pytestmark = pytest.mark.timeout(60)

ENDED_WITHIN_S = 2.0
"""The bound on a stopped app-server's end once its close began: below the first of the
close's two 3 s waits, far above a SIGKILL's reaping on a loaded host."""


TUTTI = str(Path(sys.executable).parent / "tutti-agent")


def _lingering(tmp_path: Path) -> str:
    """A front that runs the app-server, then lives on past its exit, deaf to SIGTERM: a close
    of it waits both of its waits unless it is seen stopped."""
    front = tmp_path / "front"
    front.write_text(f"#!/bin/sh\ntrap '' TERM\n{TUTTI} \"$@\"\nexec sleep 600\n")
    front.chmod(0o755)
    return str(front)


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_stopped_app_server_s_close_kills_it_at_once(tmp_path: Path, when: str) -> None:
    """`before`: the app-server stopped before its close began; `during`: a server that lives
    on past the end of its input stopped while the close waits for its exit."""
    provider = TuttiAgentProvider({"command": [_lingering(tmp_path)]} if when == "during" else {})
    runtime = Runtimes(provider, request_timeout=10.0).spawn(tmp_path / "h", None)
    pid = runtime.proc.pid
    assert pid is not None
    try:
        if when == "before":
            os.kill(pid, signal.SIGSTOP)
            wait_for(lambda: stopped_now(pid), 5)
        closing = threading.Thread(target=runtime.proc.close, daemon=True)
        closing.start()
        if when == "during":
            # The close's end of input reached the app-server: the front lives on, waited for.
            wait_for(lambda: "sleep" in psutil.Process(pid).name(), 5)
            os.kill(pid, signal.SIGSTOP)
        assert wait_for(lambda: not pid_exists(pid), ENDED_WITHIN_S)
        closing.join(10)
        assert not closing.is_alive()
    finally:
        if pid_exists(pid):
            os.kill(pid, signal.SIGKILL)
