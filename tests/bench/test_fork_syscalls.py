"""Per-fork syscall counts through the real daemon, with `strace -f -c` attached
to the daemon, its worker and its tutti-agent app-server: the app-server makes a fork child
durable with 2 fsyncs (the file, its directory), not one per copied line, and the worker's
binder fsyncs at most the 7 changed directories + 1 file of a fresh target home. Counts, never
timings. Needs `strace` (installed on the project's machine); without it this module skips,
and `tests/tutti_agent/test_tutti_fork_fsyncs.py` + `tests/drivers/test_binder_fsyncs.py`
pin the same counts in process."""

from __future__ import annotations

import shutil

import pytest

from bench.fork_syscalls import _parse_strace_c, measure
from bench.sync_floor import store_commits_on_the_fork_path

pytestmark = pytest.mark.timeout(180)

STRACE_C = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 61.10    0.002441          40        60           fsync
  9.31    0.000372           3       112        16 openat
------ ----------- ----------- --------- --------- ----------------
100.00    0.003995          18       172        16 total
"""


def test_strace_summary_is_parsed_per_syscall() -> None:
    assert _parse_strace_c(STRACE_C) == {"fsync": 60, "openat": 112}


def test_a_fork_costs_two_app_server_fsyncs_through_the_daemon() -> None:
    # Fails, never skips, without strace: the count is the point of this test.
    assert shutil.which("strace") is not None, "strace is not installed (the test counts syscalls)"
    report = measure(forks=4, turns=3, warmup=1, strace=True)
    calls = report.calls_per_fork
    assert calls["app-server"]["fsync"] == 2  # the child file and its directory
    assert calls["app-server"]["write"] <= 8  # the child in one write (+ JSON-RPC replies)
    assert calls["worker"]["fsync"] <= 8  # binder: each changed directory once + the file
    # The store's fsync'd COMMITs a warm fork (every measured one: the warm-up attested the
    # runtime) waits for: dispatching and committed. prepared reaches the disk with
    # dispatching's fsync, provider_accepted with the commit's; the ACK's comes after the reply.
    assert store_commits_on_the_fork_path(calls) == 2
    # No process is spawned on the fork path: not by the daemon, not by the worker
    # (the readability proof is in-process), not by the app-server; strace -f would count the
    # execve of any child they started.
    assert {kind: per_kind.get("execve", 0) for kind, per_kind in calls.items()} == {
        kind: 0 for kind in calls
    }
