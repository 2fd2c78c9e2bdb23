"""A re-bind whose history read failed is asked again at the next cold start, through the real
daemon, its worker and a real tutti-agent app-server: a Turn whose worker died before its
`turn.start` is settled `failed`, unbound and not host-only (its start's fate unknown). The
next cold start asks the provider's history about it, but the read fails
(`worker.history.before_read` armed `once:error`): the Turn stays unbound. Once the runtime is
gone again (its worker killed while the Session is idle, the Session's actor kept), the next
cold start asks again, its final history proves the Turn absent, it is marked host-only and
the Session forks through it. The next cold start may be in the same worker, which meanwhile ran
a Turn of the Session to its end: that worker's history is final again once every start of the
Session it got has ended (one runtime slot: another Session's Turn stops the idle runtime)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, until_terminal
from tests.daemon.test_turn_never_sent import host_only_marks
from tests.reliability.reliability_harness import worker_fired, worker_of
from tests.support.daemon import DaemonProcess, create_session, run_turn, settle, submit, wait_for
from tests.support.invariants import assert_invariants
from transport.client import Client

pytestmark = pytest.mark.timeout(180)


def _lost_before_its_start(d: DaemonProcess, c: Client, sid: str) -> dict[str, Any]:
    """A Turn of `sid` whose worker is killed before its start (`worker.turn.before_start`):
    settled `failed`, unbound, its start's fate unknown to the host. The killed worker's
    `host.status` entry."""
    before = worker_of(d, "tutti-agent")
    assert before is not None
    c.call("debug.failpoints", {"points": {"worker.turn.before_start": "once:kill"}})
    lost = submit(c, sid, "its worker dies before the start")
    wait_for(lambda: worker_fired(d, "worker.turn.before_start"), 60)
    wait_for(lambda: (worker_of(d, "tutti-agent") or before)["pid"] != before["pid"], 60)
    assert settle(c, sid, lost["turnId"])["outcome"] == "failed"
    return before


def _marked_and_forked(
    d: DaemonProcess, c: Client, sid: str, done: dict[str, Any], logged: str
) -> None:
    """The Turn lost before its start marked host-only (the second of `sid`'s four Turns), a
    fork through the last one (`done`) committed, and the daemon's log holding `logged`."""
    assert host_only_marks(d.home, sid) == [0, 1, 0, 0], d.tail_log()
    _, op = fork(c, sid, done["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    log = d.tail_log()
    assert logged in log, log


def test_a_failed_history_read_is_asked_again_at_the_next_cold_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "first")["outcome"] == "completed"
        _lost_before_its_start(d, c, sid)
        assert host_only_marks(home, sid) == [0, 0]
        # The next cold start's history read fails: nothing is proven, the Turn stays unbound.
        c.call("debug.failpoints", {"points": {"worker.history.before_read": "once:error"}})
        assert run_turn(c, sid, "its history read fails")["outcome"] == "completed"
        assert worker_fired(d, "worker.history.before_read")
        assert host_only_marks(home, sid) == [0, 0, 0]
        # The runtime goes with its worker (the Session idle, its actor kept): the next Turn
        # starts cold again, and that start asks the provider's history again.
        worker = worker_of(d, "tutti-agent")
        assert worker is not None
        os.kill(worker["pid"], signal.SIGKILL)
        wait_for(lambda: (worker_of(d, "tutti-agent") or {"pid": 0})["pid"] != worker["pid"], 60)
        done = run_turn(c, sid, "after the worker's death")
        assert done["outcome"] == "completed", done
        _marked_and_forked(d, c, sid, done, "re-bind from provider history failed")
    finally:
        d.stop()
    assert_invariants(home)


def test_a_rebind_in_the_worker_that_ran_the_sessions_turns_is_final_once_they_ended(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # One runtime slot: a Turn of another Session stops this Session's idle runtime, so its
    # next Turn starts it cold again in the same worker.
    (home / "agenthost.toml").write_text("[daemon]\nmax_runtimes_per_provider = 1\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "first")["outcome"] == "completed"
        before = _lost_before_its_start(d, c, sid)
        # The first re-bind gets no final history (its read fails); the Turn after it runs to
        # its end in the new worker.
        c.call("debug.failpoints", {"points": {"worker.history.before_read": "once:error"}})
        assert run_turn(c, sid, "its history read fails")["outcome"] == "completed"
        assert worker_fired(d, "worker.history.before_read")
        worker = worker_of(d, "tutti-agent")
        assert worker is not None and worker["pid"] not in (None, before["pid"]), worker
        assert host_only_marks(home, sid) == [0, 0, 0]
        other = create_session(c)["agentSessionId"]
        assert run_turn(c, other, "takes the only runtime slot")["outcome"] == "completed"
        # A cold start again, in the same worker: its history is final, the Turn marked.
        done = run_turn(c, sid, "a cold start in the same worker")
        assert done["outcome"] == "completed", done
        assert (worker_of(d, "tutti-agent") or {})["pid"] == worker["pid"]
        _marked_and_forked(d, c, sid, done, "is not in the provider's final history")
    finally:
        d.stop()
    assert_invariants(home)
