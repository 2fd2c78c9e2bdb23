"""The supervisor against real worker processes over real ipc sockets: spawn on demand, answers,
typed failures (lost / unavailable / timeout / error), restart, status, failpoints, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import pid_alive, wait_until

from drivers.errors import WorkerError, WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.supervisor import WorkerSupervisor
from tests.support.left_processes import ended, left_behind, reap

P = "tutti-agent"


@pytest.mark.timeout(30)
def test_request_spawns_worker_on_demand_and_status_lists_it(supervisor: WorkerSupervisor) -> None:
    assert supervisor.status() == []
    result = supervisor.request(P, "worker.ping", {}, 15).result(20)
    assert result["provider"] == P
    [row] = supervisor.status()
    assert row == {
        "provider": P,
        "pid": result["pid"],
        "state": "ready",
        "restarts": 0,
        "lastError": None,
        "busySilences": 0,
    }
    assert pid_alive(result["pid"])


@pytest.mark.timeout(40)
def test_killed_worker_fails_inflight_with_worker_lost_then_restarts_and_serves(
    supervisor: WorkerSupervisor,
) -> None:
    first = supervisor.request(P, "worker.ping", {}, 15).result(20)["pid"]
    inflight = supervisor.request(P, "debug.sleep", {"ms": 20_000}, 30)
    # The sleep has reached the worker once it is answering later pings concurrently.
    supervisor.request(P, "worker.ping", {}, 15).result(20)
    # What a tool of one of its providers left: the worker's environment (its incarnation's
    # marker), out of its tree. A killed worker stops no runtime: its supervisor ends it.
    left = [left_behind(first)]
    try:
        os.kill(first, signal.SIGKILL)
        with pytest.raises(WorkerLost):
            inflight.result(20)
        second = supervisor.request(P, "worker.ping", {}, 20).result(25)["pid"]
        assert ended(left[0].pid), "a killed worker's provider's tool process outlived it"
    finally:
        reap(left)
    assert second != first
    [row] = supervisor.status()
    assert row["restarts"] == 1 and row["state"] == "ready" and row["pid"] == second


@pytest.mark.timeout(30)
def test_request_that_never_left_the_host_fails_with_worker_unavailable(run_dir: Path) -> None:
    # A "python" that exits at once: the worker never says hello, so nothing is ever sent.
    with WorkerSupervisor(run_dir, python="/bin/false") as sup:
        with pytest.raises(WorkerUnavailable):
            sup.request(P, "worker.ping", {}, 15).result(20)
        assert sup.status()[0]["state"] in ("backoff", "starting")


@pytest.mark.timeout(30)
def test_sent_request_without_answer_in_time_fails_with_worker_timeout(
    supervisor: WorkerSupervisor,
) -> None:
    supervisor.request(P, "worker.ping", {}, 15).result(20)
    with pytest.raises(WorkerTimeout):
        supervisor.request(P, "debug.sleep", {"ms": 3000}, 0.3).result(10)
    # The late answer is dropped and the worker keeps serving.
    assert supervisor.request(P, "worker.ping", {}, 15).result(20)["provider"] == P


@pytest.mark.timeout(30)
def test_error_answer_fails_with_worker_error_carrying_the_typed_identity(
    supervisor: WorkerSupervisor,
) -> None:
    with pytest.raises(WorkerError) as info:
        supervisor.request(P, "no.such.method", {}, 15).result(20)
    wire = info.value.to_wire()
    assert wire["code"] == "invalid_request" and wire["reason"] == "unknown_method"
    assert info.value.status == 400


@pytest.mark.timeout(40)
def test_silent_worker_is_declared_dead_and_its_inflight_request_lost(
    supervisor: WorkerSupervisor,
) -> None:
    pid = supervisor.request(P, "worker.ping", {}, 15).result(20)["pid"]
    inflight = supervisor.request(P, "debug.sleep", {"ms": 100}, 30)
    inflight.result(10)
    stuck = supervisor.request(P, "debug.sleep", {"ms": 60_000}, 60)
    os.kill(pid, signal.SIGSTOP)  # alive but silent: no heartbeats
    try:
        with pytest.raises(WorkerLost):
            stuck.result(30)
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGCONT)
    assert wait_until(lambda: not pid_alive(pid))
    assert supervisor.request(P, "worker.ping", {}, 20).result(25)["pid"] != pid


@pytest.mark.timeout(60)
def test_busy_worker_whose_heartbeats_are_starved_is_not_taken_for_hung(
    supervisor: WorkerSupervisor,
) -> None:
    """The watchdog tells busy from hung by the worker's CPU time (read from the
    kernel, which the work cannot block): 9 s without a heartbeat while the worker computes
    is no death; a stopped worker (above) still is."""
    pid = supervisor.request(P, "worker.ping", {}, 15).result(20)["pid"]
    result = supervisor.request(P, "debug.hog", {"ms": 9_000}, 40).result(45)
    assert result["spins"] > 0
    [row] = supervisor.status()
    assert row["pid"] == pid and row["restarts"] == 0 and row["state"] == "ready", row
    assert row["busySilences"] >= 1, row
    assert supervisor.request(P, "worker.ping", {}, 15).result(20)["pid"] == pid


@pytest.mark.timeout(40)
def test_once_kill_failpoint_kills_the_worker_once_and_not_its_successor(
    supervisor: WorkerSupervisor,
) -> None:
    supervisor.request(P, "worker.ping", {}, 15).result(20)
    assert supervisor.set_failpoints({"test.point": "once:kill"}) == {"test.point": "once:kill"}
    with pytest.raises(WorkerLost):
        supervisor.request(P, "debug.hit", {"name": "test.point"}, 15).result(20)
    # The restarted worker inherits the armed point but the `once` has been spent.
    supervisor.request(P, "debug.hit", {"name": "test.point"}, 20).result(25)
    assert supervisor.status()[0]["restarts"] == 1


@pytest.mark.timeout(30)
def test_error_and_sleep_failpoints_act_in_the_live_worker(supervisor: WorkerSupervisor) -> None:
    supervisor.request(P, "worker.ping", {}, 15).result(20)
    supervisor.set_failpoints({"a": "error", "b": "sleep:50"})
    with pytest.raises(WorkerError) as info:
        supervisor.request(P, "debug.hit", {"name": "a"}, 15).result(20)
    assert info.value.reason == "failpoint"
    supervisor.request(P, "debug.hit", {"name": "b"}, 15).result(20)
    supervisor.set_failpoints({"a": "off"})
    supervisor.request(P, "debug.hit", {"name": "a"}, 15).result(20)


@pytest.mark.timeout(30)
def test_failpoints_given_at_construction_reach_workers_spawned_later(run_dir: Path) -> None:
    with WorkerSupervisor(run_dir, failpoints="p.q=error") as sup, pytest.raises(WorkerError):
        sup.request(P, "debug.hit", {"name": "p.q"}, 15).result(20)


def test_bad_failpoint_action_is_rejected_and_changes_nothing(supervisor: WorkerSupervisor) -> None:
    with pytest.raises(ValueError):
        supervisor.set_failpoints({"a": "explode"})


@pytest.mark.timeout(30)
def test_worker_events_reach_the_sink_in_order_before_the_result(
    supervisor: WorkerSupervisor,
) -> None:
    seen: list[tuple[str, str, dict[str, Any]]] = []
    order: list[str] = []
    supervisor.set_event_sink(lambda p, sid, ev: (seen.append((p, sid, ev)), order.append("evt")))
    events = [{"type": "item", "n": i} for i in range(50)]
    fut = supervisor.request(P, "debug.emit", {"agentSessionId": "s1", "events": events}, 15)
    fut.add_done_callback(lambda _: order.append("res"))
    assert fut.result(20) == {"emitted": 50}
    assert wait_until(lambda: len(order) == 51)
    assert [ev for _, _, ev in seen] == events
    assert {(p, sid) for p, sid, _ in seen} == {(P, "s1")}
    assert order[-1] == "res"


@pytest.mark.timeout(30)
def test_lifecycle_sink_hears_ready_and_lost(supervisor: WorkerSupervisor) -> None:
    heard: list[dict[str, Any]] = []
    done = threading.Event()

    def sink(provider: str, event: dict[str, Any]) -> None:
        heard.append(event)
        if event["type"] == "worker.lost":
            done.set()

    supervisor.set_lifecycle_sink(sink)
    pid = supervisor.request(P, "worker.ping", {}, 15).result(20)["pid"]
    os.kill(pid, signal.SIGKILL)
    assert done.wait(20)
    assert [e["type"] for e in heard[:2]] == ["worker.ready", "worker.lost"]
    assert heard[1]["pid"] == pid


@pytest.mark.timeout(30)
def test_close_terminates_every_worker_and_fails_pending_requests(run_dir: Path) -> None:
    sup = WorkerSupervisor(run_dir)
    pid = sup.request(P, "worker.ping", {}, 15).result(20)["pid"]
    pending = sup.request(P, "debug.sleep", {"ms": 30_000}, 60)
    sup.close()
    assert not pid_alive(pid)
    with pytest.raises((WorkerLost, WorkerUnavailable)):
        pending.result(5)
    with pytest.raises(WorkerUnavailable):
        sup.request(P, "worker.ping", {}, 5).result(5)
    assert sup.status()[0]["state"] == "stopped"
    assert not list(run_dir.glob("*.sock"))


@pytest.mark.timeout(40)
def test_worker_exits_when_its_parent_process_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from drivers.supervisor import WorkerSupervisor
        sup = WorkerSupervisor(Path({str(tmp_path / "run")!r}))
        print(sup.request("{P}", "worker.ping", {{}}, 15).result(20)["pid"], flush=True)
        time.sleep(120)
        """
    )
    root = str(Path(__file__).resolve().parents[2])
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        assert pid_alive(worker)
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not pid_alive(worker), timeout=15)
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.timeout(40)
def test_close_returns_when_the_loop_is_stuck_with_a_worker_link_open(run_dir: Path) -> None:
    """A loop thread that does not stop in time still holds its worker links; `close` must not
    then wait on the ZeroMQ context's `term()` (which blocks until every socket is closed): the
    daemon's stop would hang. Nor may it close the mailbox the loop still reads: once the loop
    goes on, it ends without an error."""
    sup = WorkerSupervisor(run_dir)
    release = threading.Event()
    try:
        sup.request(P, "worker.ping", {}, 15).result(20)  # a link is open on the loop's context
        real_shutdown = sup._shutdown

        def stuck() -> None:
            release.wait(60)
            real_shutdown()

        sup._shutdown = stuck  # type: ignore[method-assign]
        closer = threading.Thread(target=sup.close, kwargs={"timeout": 0.1}, daemon=True)
        closer.start()
        closer.join(20)
        assert not closer.is_alive(), "close() hung on the context's term()"
        errors: list[BaseException] = []
        previous = threading.excepthook
        threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment,arg-type]
        try:
            release.set()
            sup._loop_thread.join(10)
        finally:
            threading.excepthook = previous
        assert not sup._loop_thread.is_alive()
        assert errors == []
    finally:
        release.set()
        sup._loop_thread.join(10)
