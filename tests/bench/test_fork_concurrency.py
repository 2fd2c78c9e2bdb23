"""bench/fork_concurrency.py's readers: `perf stat --per-thread` lines and /proc's counters."""

from __future__ import annotations

import os

from bench.fork_concurrency import _perf_per_thread, counters


def test_perf_lines_are_summed_by_thread_name_and_short_event() -> None:
    text = "\n".join(
        [
            "# started on Sat Dec  5 00:49:41 2026",
            "",
            "session_3-717,12,,syscalls:sys_enter_futex,1000,100.00,,",
            "session_16-725,5,,syscalls:sys_enter_futex,1000,100.00,,",
            "ZMQbg/IO/0-700,7,,syscalls:sys_enter_epoll_ctl,1000,100.00,,",
            "agenthost-read_2-40,3,,sched:sched_switch,1000,100.00,,",
            "python-1,<not counted>,,sched:sched_wakeup,0,100.00,,",
        ]
    )
    assert _perf_per_thread(text) == {
        "session": {"futex": 17},
        "ZMQbg/IO/": {"epoll_ctl": 7},
        "agenthost-read": {"sched_switch": 3},
    }


def test_counters_read_this_process_threads() -> None:
    got = counters(os.getpid())
    assert sum(v for k, v in got.items() if k.startswith("n:")) >= 1
    assert any(k.startswith("cs:") for k in got) and any(k.startswith("ncs:") for k in got)
