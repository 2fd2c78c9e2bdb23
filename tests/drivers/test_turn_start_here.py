"""A warm `turn.start` started on the worker's link thread (`WorkerServer._start_turn_here`,
`AppServerDriver.begin_turn`), in a real worker with real tutti-agent app-servers: counted by
the worker (`worker.ping`'s `turnStartsHere`), its events and answer as the lane's; and every
case that is not simple left to the lane, as before — a failpoint armed, a runtime that is
not the one the host named, a Session whose Turn start is awaited, an app-server whose stdin
would block (the link thread goes on answering meanwhile) — and an unanswered start failing
typed at the driver's request timeout."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import TUTTI_BIN, EventLog, completed

from domain.errors import HostError
from domain.turn_events import turn_event_from_wire
from drivers.supervisor import WorkerSupervisor
from tests.support.freezer import stop

P = "tutti-agent"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sup(run_dir: Path) -> Iterator[WorkerSupervisor]:
    config = {P: {"command": TUTTI_BIN, "request_timeout_s": 2.0}}
    with WorkerSupervisor(run_dir, provider_config=config) as s:
        yield s


def start_session(sup: WorkerSupervisor, root: Path, sid: str) -> dict[str, Any]:
    return sup.request(
        P,
        "session.start",
        {
            "agentSessionId": sid,
            "home": str(root / sid / "tutti-agent-home"),
            "cwd": str(root),
            "settings": {},
            "model": None,
        },
        30,
    ).result(40)


def turn(sup: WorkerSupervisor, sid: str, turn_id: str, **extra: Any) -> dict[str, Any]:
    params = {"agentSessionId": sid, "turnId": turn_id, "text": "hello", **extra}
    return sup.request(P, "turn.start", params, 30).result(40)


def here(sup: WorkerSupervisor) -> int:
    return int(sup.request(P, "worker.ping", {}, 10).result(20)["turnStartsHere"])


@pytest.fixture
def log(sup: WorkerSupervisor) -> EventLog:
    events = EventLog()
    sup.set_event_sink(lambda provider, sid, event: events(sid, turn_event_from_wire(event)))
    return events


def test_a_warm_turn_start_is_started_on_the_link_thread(
    sup: WorkerSupervisor, log: EventLog, tmp_path: Path
) -> None:
    start_session(sup, tmp_path, "ws/a")
    for i in (1, 2, 3):
        result = turn(sup, "ws/a", f"T{i}")
        assert result["providerTurnId"]
        log.wait_for(completed(f"T{i}"))
        types = [e["type"] for e in log.of_turn(f"T{i}")]
        assert types[0] == "turn.started" and types[-1] == "turn.completed"
    assert here(sup) == 3


def test_an_armed_failpoint_leaves_the_turn_start_to_the_lane(
    sup: WorkerSupervisor, log: EventLog, tmp_path: Path
) -> None:
    start_session(sup, tmp_path, "ws/a")
    sup.set_failpoints({"worker.turn.before_start": "error"})
    with pytest.raises(HostError):
        turn(sup, "ws/a", "T1")  # fired where it always has
    sup.set_failpoints({"worker.turn.before_start": "off"})
    turn(sup, "ws/a", "T2")
    log.wait_for(completed("T2"))
    assert here(sup) == 1


def test_a_runtime_the_host_did_not_name_is_refused_on_the_lane(
    sup: WorkerSupervisor, tmp_path: Path
) -> None:
    started = start_session(sup, tmp_path, "ws/a")
    home = str(tmp_path / "ws/a" / "tutti-agent-home")
    with pytest.raises(HostError) as refused:
        turn(sup, "ws/a", "T1", home=home, runtimeGeneration=started["runtimeGeneration"] + "x")
    assert refused.value.reason == "runtime_changed"
    assert here(sup) == 0


def test_a_start_while_another_is_awaited_goes_to_the_lane(
    sup: WorkerSupervisor, log: EventLog, tmp_path: Path
) -> None:
    started = start_session(sup, tmp_path, "ws/a")
    os.kill(started["runtimePid"], signal.SIGSTOP)  # the first start gets no answer yet
    try:
        first = sup.request(
            P, "turn.start", {"agentSessionId": "ws/a", "turnId": "T1", "text": "x"}, 30
        )
        second = sup.request(
            P, "turn.start", {"agentSessionId": "ws/a", "turnId": "T2", "text": "y"}, 30
        )
        assert here(sup) == 1  # the second waits on a lane for the Session, as before
        assert not second.done()
    finally:
        os.kill(started["runtimePid"], signal.SIGCONT)
    assert first.result(40)["providerTurnId"]
    log.wait_for(completed("T1"))
    with contextlib.suppress(HostError):  # busy while T1 still runs, else started
        second.result(40)
    assert here(sup) == 1


def _fill_stdin(pid: int) -> int:
    """Fill the app-server's stdin pipe (a second writer opened through /proc) until a write
    would block; the bytes written."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_WRONLY | os.O_NONBLOCK)
    written = 0
    try:
        while True:
            try:
                written += os.write(fd, b"\n" * 4096)
            except BlockingIOError:
                return written
            except OSError as exc:  # pragma: no cover - only EAGAIN is expected
                assert exc.errno == errno.EAGAIN
                return written
    finally:
        os.close(fd)


def test_a_stalled_app_server_does_not_stop_the_link_thread(
    sup: WorkerSupervisor, log: EventLog, tmp_path: Path
) -> None:
    stalled = start_session(sup, tmp_path, "ws/stalled")
    start_session(sup, tmp_path, "ws/b")
    pid = stalled["runtimePid"]
    stop(pid)  # stopped before its stdin is filled: a server still running drains some of it
    try:
        assert _fill_stdin(pid) > 0
        # The link thread declines it (its write would block): a lane's thread blocks instead.
        blocked = sup.request(
            P, "turn.start", {"agentSessionId": "ws/stalled", "turnId": "S1", "text": "x"}, 30
        )
        # The link thread still answers, and another Session's Turn starts on it.
        assert here(sup) == 0
        turn(sup, "ws/b", "B1")
        log.wait_for(completed("B1"))
        assert here(sup) == 1
        assert not blocked.done()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with pytest.raises(HostError) as failed:
        blocked.result(40)
    assert failed.value.reason == "provider_unavailable"


def test_an_unanswered_start_fails_typed_at_the_request_timeout(
    sup: WorkerSupervisor, tmp_path: Path
) -> None:
    started = start_session(sup, tmp_path, "ws/a")
    os.kill(started["runtimePid"], signal.SIGSTOP)
    try:
        with pytest.raises(HostError) as failed:
            turn(sup, "ws/a", "T1")
        assert failed.value.reason == "provider_unavailable"
        assert "no answer in 2.0 s" in failed.value.message
        assert here(sup) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(started["runtimePid"], signal.SIGKILL)
