"""A fork re-attests its source's runtime only when that runtime changed since the
Session's last passed attestation (the runtime generation of `drivers/worker.py`), through the
real daemon, worker and tutti-agent app-server.

The probe is the worker failpoint `worker.binder.available`, hit by `runtime.attest` and by
nothing else: armed with `error`, a fork whose saga sends `runtime.attest` ends `failed`
("binder unavailable"); one that sends none commits. So each test counts the attestation
round trips of a fork by its outcome, with no timing."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, until_terminal
from tests.daemon.test_hung_provider import _app_servers
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    run_turn,
    status_of_last_fork,
    wait_for,
)
from transport.client import Client

pytestmark = pytest.mark.timeout(180)

BINDER_OFF = {"worker.binder.available": "error"}


def _committed(c: Client, sid: str, turn_id: str) -> dict[str, Any]:
    op = until_terminal(c, fork(c, sid, turn_id)[1])
    assert op["status"] == "committed", op
    # ACKed, so the boundary's barrier does not answer the next fork with this operation.
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    return op


def _source(c: Client) -> tuple[str, str]:
    sid = create_session(c, title="t")["agentSessionId"]
    return sid, run_turn(c, sid, "one")["turnId"]


def test_a_second_fork_on_a_warm_unchanged_runtime_sends_no_runtime_attest(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)  # attested: the generation is remembered
    c.call("debug.failpoints", {"points": BINDER_OFF})
    # A `runtime.attest` would hit the armed failpoint and fail the fork: it commits, twice.
    _committed(c, sid, turn_id)
    _committed(c, sid, turn_id)
    # A fork without the generation check still attests (and so fails closed here).
    other, other_turn = _source(c)
    op = until_terminal(c, fork(c, other, other_turn)[1])
    assert op["status"] == "failed" and "binder unavailable" in op["error"], op


def _exited(pid: int) -> bool:
    """A zombie or gone (the process has finished its exit)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True  # gone (reaped between the open and the read: ESRCH)
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X", b"x")


def test_a_respawned_app_server_is_re_attested_before_dispatch(daemon: DaemonProcess) -> None:
    """Provider state lost: the Session's app-server dies; the next fork's `session.start`
    spawns a new one (a new generation), so the saga re-attests before `dispatching`."""
    c = daemon.client()
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)
    pids = wait_for(lambda: _app_servers(sid), 10)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # Wait until each is a zombie or gone: `process_alive` calls a process dead from the
    # moment its SIGKILL is pending, but cannot see the kernel's own instant between taking
    # the signal and marking the task exiting (tests/actors/test_process_alive.py); a fork in
    # that instant would find the runtime still warm and be refused by the worker.
    wait_for(lambda: all(_exited(pid) for pid in pids), 10)
    c.call("debug.failpoints", {"points": BINDER_OFF})
    op = until_terminal(c, fork(c, sid, turn_id)[1])
    assert op["status"] == "failed" and "binder unavailable" in op["error"], op
    assert op["session"] is None
    c.call("debug.failpoints", {"points": {"worker.binder.available": "off"}})
    _committed(c, sid, turn_id)  # attested again; the fence was released


def test_a_restarted_worker_is_re_attested_before_dispatch(daemon: DaemonProcess) -> None:
    """A new worker process is a new generation for every runtime it holds, even when its
    app-server answers exactly as before."""
    c = daemon.client()
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)
    worker = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
    c.call("debug.failpoints", {"points": BINDER_OFF})
    os.kill(worker["pid"], signal.SIGKILL)
    wait_for(
        lambda: any(
            w["provider"] == "tutti-agent" and w["pid"] not in (None, worker["pid"])
            for w in c.call("host.status")["workers"]
        ),
        30,
    )
    op = until_terminal(c, fork(c, sid, turn_id)[1])
    assert op["status"] == "failed" and "binder unavailable" in op["error"], op


def test_a_runtime_that_changes_after_its_unattested_start_is_refused_by_the_worker(
    daemon: DaemonProcess,
) -> None:
    """The skipped attestation relied on the verdict of the runtime `session.start` found; if
    that runtime is gone when the fork reaches the worker, the worker does not hand the fork
    to a new, unattested runtime: `not_started`, so `failed`, and no provider child."""
    c = daemon.client()
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)
    c.call("debug.failpoints", {"points": {"host.fork.after_prepare": "sleep:2000"}})
    pending = c.submit(
        "fork.create",
        fork_params(WS, sid, turn_id),
    )
    # Inside the after_prepare window: session.start answered, the operation prepared (a
    # warm fork's prepare writes it at `dispatching`, durable), nothing sent yet.
    wait_for(lambda: status_of_last_fork(daemon.home / "store.sqlite3", sid) == "dispatching", 10)
    for pid in _app_servers(sid):
        os.kill(pid, signal.SIGKILL)
    status, body = pending.result(timeout=30)
    op = until_terminal(c, body["operation"])
    assert op["status"] == "failed", op
    assert "runtime changed since its attestation" in op["error"], op
    assert op["session"] is None
