"""The turn floor `bench.turn_overhead` prints beside each provider's turn overhead: the claim's
COMMIT overlaps the `before` capture (nothing orders them), the `after` capture and the
settlement's COMMIT follow one another, and the cheapest capture is one `ls-files` run as the
shadow store runs it, against the index a first capture left."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common import Latency
from bench.turn_floor import TurnFloor, capture_latency


def test_the_floor_overlaps_the_claim_with_the_before_capture_and_adds_the_settlement() -> None:
    floor = TurnFloor(
        commit=Latency.of([1.0, 1.0, 1.0]),
        capture=Latency.of([3.0, 3.0, 3.0]),
        host_capture=Latency.of([5.0, 5.0, 5.0]),
    )
    assert floor.start_ms == 3.0  # max(COMMIT, capture), not their sum
    assert floor.settle_ms == 4.0  # the `after` capture, then the settlement's COMMIT
    assert floor.floor_ms == 7.0
    assert floor.ratio(14.0) == 2.0
    assert "= 7.0 ms" in floor.line()
    assert floor.to_json()["floorMs"] == 7.0
    slow_disk = TurnFloor(Latency.of([4.0]), Latency.of([3.0]), Latency.of([5.0]))
    assert slow_disk.floor_ms == 4.0 + 3.0 + 4.0


def test_the_cheapest_capture_is_one_listing_of_an_unchanged_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    floor, host = capture_latency(work, tmp_path / "checkpoints", samples=3)
    assert floor.n == 3 and host.n == 3
    assert floor.p50 > 0 and host.p50 > 0


def test_a_folder_that_changes_while_measured_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing that is not empty is not the cheapest capture: the figure would be wrong."""
    from workspace.shadow import ShadowStore

    work = tmp_path / "work"
    work.mkdir()
    real = ShadowStore.capture

    def capture_then_write(self: ShadowStore, cwd: Path) -> object:
        done = real(self, cwd)
        (cwd / f"new-{len(list(cwd.iterdir()))}").write_text("x")  # someone writes after it
        return done

    monkeypatch.setattr(ShadowStore, "capture", capture_then_write)
    with pytest.raises(RuntimeError, match="changed while its floor was measured"):
        capture_latency(work, tmp_path / "checkpoints", samples=2)
