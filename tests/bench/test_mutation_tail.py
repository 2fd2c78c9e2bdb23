"""`bench.mutation_tail`: the tail of phase A's mutations attributed to the suspects stamped
beside them — a suspect that overlaps only the slowest requests takes their excess over p50,
one that overlaps every request alike takes none."""

from __future__ import annotations

from typing import Any

from bench.mutation_tail import _union_overlap, attribute


def _requests() -> list[dict[str, Any]]:
    """100 renames 10 ms long, one after another, and 2 of them 40 ms (the slowest 2 %)."""
    out: list[dict[str, Any]] = []
    t = 0.0
    for i in range(100):
        ms = 40.0 if i in (30, 70) else 10.0
        out.append({"kind": "session.updateTitle", "t0": t, "t1": t + ms, "status": 200})
        t += ms + 1.0
    return out


def _row(
    kind: str, t0: float, ms: float, detail: Any = "", proc: str = "daemon:1"
) -> dict[str, Any]:
    return {"kind": kind, "t0": t0, "t1": t0 + ms, "ms": ms, "detail": detail, "proc": proc}


def test_a_pause_over_the_slowest_requests_alone_takes_their_excess() -> None:
    requests = _requests()
    slow = [r for r in requests if r["t1"] - r["t0"] > 20]
    rows = [_row("gc", r["t0"] + 5.0, 30.0, "gen2 0") for r in slow]
    # A COMMIT inside every request, 2 ms each: as much beside the typical as the slowest.
    rows += [_row("commit", r["t0"] + 1.0, 2.0, 3) for r in requests]
    got = attribute(requests, rows, tail=0.02)
    by_cause = {row["cause"]: row for row in got["table"]}
    assert got["tailN"] == 2
    assert got["excessMs"] == 30.0
    assert by_cause["gc gen2 (daemon)"]["share"] == 1.0
    assert by_cause["gc gen2 (daemon)"]["tailHit"] == 2
    assert by_cause["group COMMIT"]["share"] == 0.0


def test_the_daemons_late_wake_up_is_split_into_its_run_queue_and_gil_parts() -> None:
    requests = _requests()
    slow = [r for r in requests if r["t1"] - r["t0"] > 20]
    # 30 ms late, 20 of them on a run queue (no CPU), 10 waiting for the interpreter.
    rows = [_row("lag", r["t0"] + 5.0, 30.0, 20.0) for r in slow]
    by_cause = {row["cause"]: row for row in attribute(requests, rows)["table"]}
    assert round(by_cause["lag: no CPU"]["tailMs"], 6) == 20.0
    assert round(by_cause["lag: GIL"]["tailMs"], 6) == 10.0


def test_overlapping_stamps_of_one_kind_count_once() -> None:
    assert _union_overlap([(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)], 2.0, 25.0) == 18.0
    assert _union_overlap([(0.0, 1.0)], 2.0, 25.0) == 0.0
