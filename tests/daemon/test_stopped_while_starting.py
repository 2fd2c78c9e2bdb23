"""An app-server stopped (SIGSTOP) while it starts — before it answers `initialize`, or the
Session's `thread/start` — through the real daemon and a real tutti-agent app-server behind the
relay (`misbehaving_app_server`, modes `stop_init` / `stop_open`: the process the worker spawned
stops itself as the request reaches it). The Session has no runtime yet, only a process being
started: the worker's liveness check looks at it as at a runtime, kills it once it stayed stopped
for `provider_stopped_seconds`, and the start waiting on it fails then, `provider_stopped`: the
Turn fails and the Session's next Turn starts on a new app-server, not after the start's own
request limit (30 s). A stop meanwhile kills it at once
(tests/drivers/test_stop_while_starting.py)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.test_stopped_turn_start import (
    NEXT_TURN_STARTS_S,
    _stopped,
    _taken_pid,
    module_daemon,
    next_turn_runs_and_the_stopped_server_is_gone,
)
from tests.support.daemon import DaemonProcess, create_session, settle, submit, wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Path]]:
    yield from module_daemon(tmp_path_factory, "ss", "provider_stopped_seconds = 1\n")


@pytest.mark.parametrize("mode", ["stop_init", "stop_open"])
def test_an_app_server_stopped_while_it_starts_holds_no_session_after_its_turn(
    daemon: tuple[DaemonProcess, Path], mode: str
) -> None:
    """`stop_init`: stopped at `initialize`; `stop_open`: at the Session's `thread/start`. The
    first Turn fails `provider_stopped`, and the next is bound to its provider turn, well
    before the start's 30 s would have ended; the stopped server is gone."""
    d, arm = daemon
    taken = arm.with_name(arm.name + ".taken")
    taken.unlink(missing_ok=True)
    pid = None
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        arm.write_text(mode)
        turn = submit(c, sid, "never started")
        pid = _taken_pid(arm)
        wait_for(lambda: _stopped(pid), 10)
        done = settle(c, sid, turn["turnId"], timeout=NEXT_TURN_STARTS_S)
        assert done["outcome"] == "failed", done
        assert done["errorReason"] == "provider_stopped", done
        assert "while it started" in (done["error"] or ""), done
        next_turn_runs_and_the_stopped_server_is_gone(c, sid, pid)
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
