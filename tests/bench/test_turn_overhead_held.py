"""`bench.turn_overhead` counts, per 1,000 deltas and on each side, how many waited past 5 and
10 ms beyond the bare provider's p50 lag: the longest-wait row is one maximum, and these counts
say whether it was one delta or many (docs/performance.md, "Claude Code's longest delta wait")."""

from __future__ import annotations

from bench.turn_overhead import Sample, _figures


def _sample(lags: list[float]) -> Sample:
    emitted = [float(10 * i) for i in range(len(lags))]
    return Sample(100.0, [e + lag for e, lag in zip(emitted, lags, strict=True)], emitted)


def test_deltas_held_past_5_and_10_ms_are_counted_per_thousand_on_each_side() -> None:
    bare = [_sample([1.0] * 18 + [7.0, 12.0])]  # bare p50 lag 1.0
    host = [_sample([1.0] * 16 + [5.5, 6.5, 11.5, 30.0])]
    counts = _figures(host, bare)["heldOverPerK"]
    # host: 5.5 - 1 = 4.5 is not past 5; 6.5, 11.5, 30 are (3 of 20); 11.5 and 30 past 10
    assert counts["host"] == {"5ms": 150.0, "10ms": 100.0}
    assert counts["bare"] == {"5ms": 100.0, "10ms": 50.0}
