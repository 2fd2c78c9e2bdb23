"""The daemon has one ZeroMQ context: its API server's sockets and its worker links share it, so
the process has one libzmq I/O thread (every API and worker frame crosses one thread, not two)
and one reaper. The context is terminated last at every stop: a normal one, after a worker was
killed and restarted, and a start that failed half-way (a `term()` would block on any socket
left open, so each path must close every socket first)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from agenthost.config import load_config
from agenthost.daemon import Daemon
from tests.support.daemon import DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(120)


def _zmq_threads(pid: int) -> Counter[str]:
    """The process's libzmq threads by kind (`ZMQbg/IO/0` → `ZMQbg/IO`)."""
    kinds: Counter[str] = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("ZMQbg/"):
            kinds[comm.rstrip("0123456789").rstrip("/")] += 1
    return kinds


def test_a_daemon_with_a_worker_link_has_one_zmq_io_thread_and_stops_clean(
    tmp_path: Path,
) -> None:
    daemon = DaemonProcess(tmp_path / "home").start()
    try:
        assert daemon.proc is not None
        c = daemon.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "one")["outcome"] == "completed"
        workers = [w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent"]
        assert workers and workers[0]["pid"] > 0  # a worker link is open
        assert _zmq_threads(daemon.proc.pid) == Counter({"ZMQbg/IO": 1, "ZMQbg/Reaper": 1})
        # A worker crash closes its link; the restarted worker's link is on the same context.
        os.kill(workers[0]["pid"], signal.SIGKILL)
        assert run_turn(c, sid, "two")["outcome"] == "completed"
        assert _zmq_threads(daemon.proc.pid) == Counter({"ZMQbg/IO": 1, "ZMQbg/Reaper": 1})
        started = time.monotonic()
        assert daemon.stop() == 0
        assert time.monotonic() - started < 20
        assert "ZeroMQ" not in daemon.tail_log(100_000)  # no socket was left open at close
    finally:
        daemon.kill()


def test_the_context_is_terminated_by_close_after_a_normal_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    daemon = Daemon(load_config(home), default_cwd=tmp_path)
    try:
        daemon.start()
        context = daemon.zmq_context
        assert context is not None and not context.closed
    finally:
        daemon.close()
    assert daemon.zmq_context is None and context.closed


def test_a_start_that_fails_half_way_still_terminates_the_context(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    # The supervisor is made (on the shared context) before the API server's binds fail.
    daemon = Daemon(load_config(home), listen=("tcp://192.0.2.1:1",), default_cwd=tmp_path)
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the bind raises
        daemon.start()
    context = daemon.zmq_context
    assert context is not None
    started = time.monotonic()
    daemon.close()
    assert time.monotonic() - started < 20
    assert daemon.zmq_context is None and context.closed
