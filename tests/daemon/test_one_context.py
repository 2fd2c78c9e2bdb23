"""The daemon's sockets share one ZeroMQ context: the worker links' and the API server's (its
ROUTER, XPUBs and monitors), so one ZeroMQ I/O thread carries a delta in from its worker and
out to its subscribers (docs/design/internals.md, "A delta's way to the transport"), and a
daemon that stops ends it cleanly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, create_session, run_turn, wait_for

pytestmark = pytest.mark.timeout(120)


def _zmq_threads(pid: int) -> list[str]:
    """The kernel's names of `pid`'s ZeroMQ threads (libzmq names its I/O and reaper threads
    `ZMQbg/IO/<n>` and `ZMQbg/Reaper`)."""
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended meanwhile
        if name.startswith("ZMQbg/"):
            names.append(name)
    return sorted(names)


def test_a_daemon_with_a_worker_runs_one_zeromq_io_thread_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    daemon = DaemonProcess(tmp_path / "home").start()
    try:
        assert daemon.proc is not None
        client = daemon.client()
        sid = create_session(client)["agentSessionId"]
        turn = run_turn(client, sid, "/stream hello there")
        assert turn["outcome"] == "completed"
        # The worker's link is up (its socket is in the daemon's context): one I/O thread and
        # one reaper for every socket of the daemon.
        status = client.call("host.status")
        assert any(w["state"] == "ready" for w in status["workers"])
        assert _zmq_threads(daemon.proc.pid) == ["ZMQbg/IO/0", "ZMQbg/Reaper"]
    finally:
        rc = daemon.stop()
    assert rc == 0, daemon.tail_log()
    wait_for(lambda: daemon.proc is not None and daemon.proc.poll() is not None)
