"""`bench.turn_pipe`'s reading of a traced run: the provider's stdout writes and the reader's
`read()` returns from `perf script` lines, host and bare Turns told apart by the worker's
driver stamps, and each delta's lag cut into the legs that add up to it."""

from __future__ import annotations

import pytest

from bench.turn_pipe import (
    DRIVER_POINT,
    legs,
    parse_perf,
    reader_reads,
    report,
    stdout_writes,
    turns,
)

W = "syscalls:sys_enter_write: fd: 0x0000000{fd}, buf: 0x7f, count: 0x000000ed"
R = "syscalls:sys_exit_read: {ret}"
SWITCH = "sched:sched_switch: prev_comm=python prev_pid=805 prev_state=S ==> next_pid=9"
PERF = [
    f" app-server-stdo 700/703 [001]    10.000100:  {W.format(fd=1)}",
    f" tokio-rt-worker 700/701 [000]    10.000150:  {W.format(fd=5)}",
    f"          python 800/805 [001]    10.000180:  {R.format(ret='0xed')}",
    f"          python 800/806 [000]    10.000300:  {R.format(ret='0x8')}",
    f"          python 800/805 [001]    10.000400:  {SWITCH}",
    f" app-server-stdo 700/703 [001]    10.020000:  {W.format(fd=1)}",
    f"          python 800/805 [001]    10.020050:  {R.format(ret='0xed')}",
    f"          python 800/805 [001]    10.020060:  {R.format(ret='0xfffffffffffffff5')}",
]


def test_the_providers_stdout_writes_and_the_readers_reads_are_found() -> None:
    calls = parse_perf(PERF)
    assert {c.event for c in calls} == {"sys_enter_write", "sys_exit_read"}
    writes = stdout_writes(calls, "700")
    assert writes == pytest.approx([10_000.1, 10_020.0])  # fd 1 only, in ms
    # the thread whose reads follow the writes, not the one reading an eventfd; no errors
    assert reader_reads(calls, "800", writes) == pytest.approx([10_000.18, 10_020.05])
    assert reader_reads(calls, "999", writes) == []


def _stamps(host: bool, t0: float, held_until: float | None = None) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for i in range(3):
        e = t0 + 2.0 * i
        d = max(e + 0.3, held_until or 0.0)
        out.append(("M.emit", e))
        out.append(("c.delta", d + (0.5 if host else 0.0)))
        if host:
            out.append((DRIVER_POINT, d))
    return out


def test_host_and_bare_turns_are_told_apart_by_the_drivers_stamps() -> None:
    stamps = _stamps(True, 100.0) + _stamps(False, 200.0)
    found = turns(stamps, deltas=3)
    assert [t.host for t in found] == [True, False]
    assert found[0].driver == pytest.approx([100.3, 102.3, 104.3])
    # a host Turn whose driver stamps are incomplete is left out, not misread as bare
    partial = [s for s in stamps if not (s[0] == DRIVER_POINT and s[1] > 104)]
    assert [t.host for t in turns(partial, deltas=3)] == [False]


def test_a_held_run_is_charged_to_the_leg_that_held_it() -> None:
    """Three deltas held by the provider until 110 ms: each waited in the provider (emission →
    its write), none in the pipe or the reader, and the lag is the sum of the legs."""
    (turn,) = turns(_stamps(True, 100.0, held_until=110.2), deltas=3)
    writes = [110.0]
    reads = [110.1]
    rows = legs(turn, writes, reads)
    assert [round(r[1], 6) for r in rows] == [10.0, 8.0, 6.0]  # the provider held them
    assert all(r[2] == pytest.approx(0.1) for r in rows)  # write → read()
    assert all(r[3] == pytest.approx(0.1) for r in rows)  # read() → the driver
    for lag, *parts in rows:
        assert lag == pytest.approx(sum(parts))
    lines = report(rows, "host")
    assert lines[0] == "host: 3 deltas"
    assert lines[2].rstrip().endswith("> 5 ms: 3")  # the provider's leg
    assert lines[3].rstrip().endswith("> 5 ms: 0")  # the pipe and the reader's wake-up
