"""One app-server of a home at a time in the worker (`Runtimes.home`), with the real tutti-agent
driver and app-server: a Session runtime's start waits while its home is held (as a transient
app-server of that home holds it, its whole life), and a cold fork whose source Session started
while it waited forks on that Session's runtime instead of a transient one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import EventLog, wait_until
from test_tutti_driver import fork_request, open_session

from domain.enums import DeliveryDisposition
from domain.worker_messages import ForkResult
from drivers.app_server.driver import AppServerDriver

Make = Callable[..., AppServerDriver]


def start_params(home: Path, root: Path) -> dict[str, Any]:
    return {"agentSessionId": "s", "home": str(home), "cwd": str(root), "settings": {}}


@pytest.mark.timeout(60)
def test_a_session_runtime_start_waits_for_its_held_home(make_driver: Make, tmp_path: Path) -> None:
    driver = make_driver()
    home = tmp_path / "runtimes" / "s" / "tutti-agent-home"
    other = tmp_path / "runtimes" / "o" / "tutti-agent-home"
    started: dict[str, Any] = {}
    with driver.runtimes.home(home):
        start = threading.Thread(
            target=lambda: started.update(driver.start_session(start_params(home, tmp_path)))
        )
        start.start()
        # The start waits for the home (it holds it and one more waits).
        assert wait_until(lambda: driver.runtimes.holders(home) == 2)
        assert driver.spawns == 0
        with driver.runtimes.home(other):  # another home is not held by it
            assert driver.runtimes.holders(other) == 1
    start.join(30)
    assert started["providerSessionId"]
    assert driver.spawns == 1
    assert driver.runtimes.homes_held == 0  # the map keeps no home nobody holds


@pytest.mark.timeout(60)
def test_a_cold_fork_that_waited_for_its_home_forks_on_the_session_started_meanwhile(
    make_driver: Make, tmp_path: Path
) -> None:
    """The fork found no live source runtime and waited for the home; the Session's runtime
    started meanwhile (here on the thread holding the home): the fork runs on it, no transient
    app-server is spawned beside it (one would be a second writer of the source thread)."""
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    driver.stop_session({"agentSessionId": "src"})
    spawns = driver.spawns
    request = fork_request(home, thread_id, version, turns, tmp_path / "t")
    result: list[ForkResult] = []
    with driver.runtimes.home(home):
        fork = threading.Thread(target=lambda: result.append(driver.fork(request)))
        fork.start()
        assert wait_until(lambda: driver.runtimes.holders(home) == 2)
        params = start_params(home, home.parent) | {"agentSessionId": "src"}
        driver.start_session(params | {"providerSessionId": thread_id})
    fork.join(30)
    assert result[0].disposition is DeliveryDisposition.ACCEPTED, result[0].error
    assert driver.spawns == spawns + 1  # the Session's runtime only: no transient source


@pytest.mark.timeout(60)
def test_a_stopped_session_runtime_is_closed_with_its_home_held(
    make_driver: Make, tmp_path: Path
) -> None:
    """`session.stop` closes the runtime with its home held: while another thread holds the
    home, the stop waits and the app-server lives on (a start of that home meanwhile would
    wait likewise, never spawn beside it)."""
    driver = make_driver()
    home, _, _, _ = open_session(driver, EventLog(), tmp_path, texts=("a",))
    pid = driver.runtime_pid("src", str(home))
    assert pid is not None
    with driver.runtimes.home(home):
        stop = threading.Thread(target=lambda: driver.stop_session({"agentSessionId": "src"}))
        stop.start()
        assert wait_until(lambda: driver.runtimes.holders(home) == 2)
        assert Path(f"/proc/{pid}").exists()
    stop.join(30)
    assert not stop.is_alive()
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists())
    assert driver.runtimes.homes_held == 0


@pytest.mark.timeout(60)
def test_a_start_in_the_stop_window_waits_until_the_old_app_server_exited(
    make_driver: Make, tmp_path: Path
) -> None:
    """`session.stop` takes the Session out of the worker's table, then waits for an operation
    in flight on it (its `op_lock`) before it closes the runtime. A start of the same Session
    in that window opens a new Session of the same home: it waits until the old app-server has
    exited, and never spawns a second one of the home beside it (for Codex a second writer of
    the thread: "already has an active writer"). The start runs on the test's own thread: an
    app-server dies with the thread that spawned it (its parent-death signal)."""
    driver = make_driver()
    home, thread_id, _, _ = open_session(driver, EventLog(), tmp_path, texts=("a",))
    old_pid = driver.runtime_pid("src", str(home))
    assert old_pid is not None
    old = driver._sessions.get("src")
    assert old is not None
    spawns = driver.spawns
    seen: dict[str, Any] = {}
    returned = threading.Event()

    def operation_in_flight() -> None:
        """Holds the old Session's `op_lock` until the start has waited 1.5 s for the home."""
        with old.op_lock:
            held.set()
            seen["waiting"] = wait_until(lambda: driver.runtimes.holders(home) == 1)
            seen["returned"] = returned.wait(1.5)  # a start that did not wait is done by now
            seen["spawns"] = driver.spawns
            seen["old alive"] = Path(f"/proc/{old_pid}").exists()

    held = threading.Event()
    operation = threading.Thread(target=operation_in_flight)
    operation.start()
    assert held.wait(10)
    stop = threading.Thread(target=lambda: driver.stop_session({"agentSessionId": "src"}))
    stop.start()
    assert wait_until(lambda: driver._sessions.get("src") is None)  # out of the table
    params = start_params(home, home.parent) | {"agentSessionId": "src"}
    started = driver.start_session(params | {"providerSessionId": thread_id})
    returned.set()
    operation.join(30)
    stop.join(30)
    assert not stop.is_alive() and not operation.is_alive()
    assert seen == {"waiting": True, "returned": False, "spawns": spawns, "old alive": True}, (
        "the start spawned beside the app-server being stopped"
    )
    assert started["providerSessionId"] == thread_id
    assert driver.spawns == spawns + 1
    assert not Path(f"/proc/{old_pid}").exists()  # the old one exited before the new spawn
    new_pid = driver.runtime_pid("src", str(home))
    assert new_pid is not None and new_pid != old_pid
    assert driver.runtimes.homes_held == 0
