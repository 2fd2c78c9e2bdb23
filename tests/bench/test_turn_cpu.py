"""`bench/turn_cpu.py` reads a process's CPU from its live threads' run time (nanoseconds, not
the 10 ms ticks of `/proc/PID/stat`) and counts their voluntary context switches: a thread of
this process that sleeps and is woken adds to both while it lives."""

from __future__ import annotations

import contextlib
import os
import threading

from bench.harness import ProcSample
from bench.turn_cpu import fine_by_kind, task_sums
from tests.support.daemon import wait_for


def test_a_live_threads_wake_ups_and_run_time_are_counted() -> None:
    go, done, leave = threading.Event(), threading.Event(), threading.Event()

    def sleeper() -> None:
        for _ in range(20):
            go.wait()
            go.clear()
        done.set()
        leave.wait()  # alive at the second reading: an ended thread is not counted

    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    ns0, switches0 = task_sums(os.getpid())
    while not done.is_set():
        go.set()
        done.wait(0.001)
    ns1, switches1 = task_sums(os.getpid())
    leave.set()
    t.join(5)
    assert switches1 - switches0 >= 20  # the sleeper woke at least once per set
    assert ns1 > ns0
    assert ns1 % 10_000_000 != 0  # not a tick count


def test_the_reading_is_by_kind_with_wake_ups_beside_it() -> None:
    me = ProcSample(os.getpid(), "daemon", 0.0, 0.0, 0.0, 0.0)
    got = fine_by_kind([me, me])
    assert set(got) == {"daemon", "cs:daemon"}
    assert got["daemon"] > 0.0


def _thread_names() -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{os.getpid()}/task/{tid}/comm") as fh:
            names.append(fh.read().strip())
    return names


def test_by_comm_splits_a_kinds_run_time_by_the_kernels_thread_names() -> None:
    """`--by-comm`: the same run time, keyed `<kind>:<comm>` (libzmq's I/O threads apart)."""
    import zmq

    from bench import turn_cpu

    ctx: zmq.Context[object] = zmq.Context()  # starts a `ZMQbg/IO/0` and a `ZMQbg/Reaper`
    try:
        sock = ctx.socket(zmq.PAIR)
        sock.bind("inproc://by-comm")  # the context's threads exist once a socket does
        # Each names itself once it runs: on a loaded machine a moment after the bind.
        wait_for(lambda: any(n.startswith("ZMQbg/") for n in _thread_names()), timeout=30.0)
        turn_cpu.BY_COMM.clear()
        ns, _ = task_sums(os.getpid(), "daemon")
        names = set(turn_cpu.BY_COMM)
        assert all(k.startswith("daemon:") for k in names)
        assert any(k.startswith("daemon:ZMQbg/") for k in names), names
        assert abs(sum(turn_cpu.BY_COMM.values()) - ns / 1e9) < 1e-6  # the same reads, split
        sock.close(0)
    finally:
        ctx.term()
        turn_cpu.BY_COMM.clear()
