"""A Session's stop while its app-server is starting and stopped (SIGSTOP) before it answered
`initialize` or the Session's `thread/start`, with the real driver and a real tutti-agent
app-server behind the relay (`tests/daemon/misbehaving_app_server.py`, modes `stop_init`,
`stop_open`). The Session has no runtime yet, only the process being started: the stop finds
it stopped and kills it, and the start waiting on it fails at once, `provider_stopped`, so
neither the stop nor the Session is held for the start's request limit (30 s)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import TUTTI_BIN

from domain.procfs import pid_exists
from drivers.app_server.driver import AppServerDriver
from drivers.errors import DriverError
from drivers.liveness import PROVIDER_STOPPED
from tests.daemon.test_stopped_turn_start import _stopped, _taken_pid
from tests.support.daemon import wait_for

pytestmark = pytest.mark.timeout(60)

RELAY = str(Path(__file__).parents[1] / "daemon" / "misbehaving_app_server.py")
ENDS_WITHIN_S = 8.0
"""The bound on the stop and on the start's failure once the stop began: far below the
start's request limit (30 s), far above a kill on a loaded host."""


@pytest.mark.parametrize(
    ("mode", "start_only"), [("stop_init", False), ("stop_open", False), ("stop_open", True)]
)
def test_a_stop_kills_an_app_server_stopped_while_it_starts(
    make_driver: Callable[..., AppServerDriver], tmp_path: Path, mode: str, start_only: bool
) -> None:
    """`stop_init`: stopped at `initialize` (inside the spawn); `stop_open`: at the Session's
    `thread/start`, once initialized. `start_only`: the stop of a start given up (`startOnly`:
    an interrupted Turn's, a deleted Session's) kills it alike."""
    arm = tmp_path / "armed"
    arm.write_text(mode)
    driver = make_driver(command=[sys.executable, RELAY, str(arm), "--", TUTTI_BIN])
    home = tmp_path / "runtimes" / "s" / "tutti-agent-home"
    params = {"agentSessionId": "s", "home": str(home), "cwd": str(tmp_path), "settings": {}}
    failed: list[BaseException] = []

    def start() -> None:
        try:
            driver.start_session(params)
        except DriverError as exc:
            failed.append(exc)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    pid = _taken_pid(arm)
    wait_for(lambda: _stopped(pid), 10)
    result: dict[str, Any] = {}
    stopping = threading.Thread(
        target=lambda: result.update(
            driver.stop_session(
                {"agentSessionId": "s"} | ({"startOnly": True} if start_only else {})
            )
        ),
        daemon=True,
    )
    stopping.start()
    stopping.join(ENDS_WITHIN_S)
    starting.join(ENDS_WITHIN_S)
    assert not stopping.is_alive() and not starting.is_alive()
    assert result == {}
    assert len(failed) == 1 and isinstance(failed[0], DriverError), failed
    assert failed[0].reason == PROVIDER_STOPPED, failed[0]
    assert "when its Session was stopped" in str(failed[0]), failed[0]
    # The stopped server and the provider behind it were ended (stopped_runtime_left).
    wait_for(lambda: not pid_exists(pid), 5)
    assert driver.runtimes.homes_held == 0


def test_a_start_only_stop_leaves_a_healthy_start_its_runtime(
    make_driver: Callable[..., AppServerDriver], tmp_path: Path
) -> None:
    """A start given up while its app-server is healthy (`startOnly` while it is spawned, a
    `sleep 1` before it runs): the stop answers once the start has ended, the start succeeds,
    and its runtime is kept live for the Session's next Turn (not closed as a full stop's).
    The start runs on this thread: the app-server dies with the thread that spawned it."""
    driver = make_driver(command=["sh", "-c", 'sleep 1; exec "$@"', "sh", TUTTI_BIN])
    home = tmp_path / "runtimes" / "s" / "tutti-agent-home"
    params = {"agentSessionId": "s", "home": str(home), "cwd": str(tmp_path), "settings": {}}
    stopped: list[dict[str, Any]] = []

    def stop() -> None:
        wait_for(lambda: (s := driver._sessions.get("s")) is not None and s.op_lock.locked(), 5)
        stopped.append(driver.stop_session({"agentSessionId": "s", "startOnly": True}))

    stopping = threading.Thread(target=stop, daemon=True)
    stopping.start()
    assert driver.start_session(params)["providerSessionId"]
    stopping.join(ENDS_WITHIN_S)
    assert not stopping.is_alive() and stopped == [{}], stopped
    pid = driver.runtime_pid("s", str(home))
    assert pid is not None and pid_exists(pid)
