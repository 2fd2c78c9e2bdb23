"""The turn floor `bench.turn_overhead` prints beside each provider's turn overhead: the claim's
COMMIT overlaps the `before` capture (nothing orders them), the `after` capture and the
settlement's COMMIT follow one another, and the cheapest capture is what the host's capture of
an unchanged folder does: the stat check of its snapshot, or one `ls-files` run as the shadow
store runs it when the folder has none."""

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


def test_the_cheapest_capture_of_an_aged_unchanged_folder_is_its_stat_check(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    caps = capture_latency(work, tmp_path / "checkpoints", samples=3, racy_margin_ns=10**8)
    assert caps.kind == "stat check"
    assert caps.cheapest.n == 3 and caps.git.n == 3 and caps.host.n == 3
    assert caps.cheapest.p50 > 0 and caps.git.p50 > 0 and caps.host.p50 > 0
    # The host samples kept their tree by one ref, as a Session's Turns on an unchanged
    # folder share theirs.
    refs = tmp_path / "checkpoints"
    assert len(list(refs.rglob("+*"))) == 1 and not list(refs.rglob("*.lock"))
    # The cheapest writes no ref: an unchanged folder's tree ref is there already.
    assert not list(refs.rglob("floor-cheapest"))


def test_a_folder_without_a_snapshot_costs_one_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too many entries for a stat snapshot: every capture asks git, the cheapest too."""
    from workspace import shadow

    monkeypatch.setattr(shadow, "STAT_WALK_LIMIT", 2)
    work = tmp_path / "work"
    work.mkdir()
    for i in range(3):
        (work / f"f{i}.txt").write_text(f"{i}\n")
    caps = capture_latency(work, tmp_path / "checkpoints", samples=2, racy_margin_ns=10**8)
    assert caps.kind == "ls-files"
    assert caps.cheapest is caps.git


def test_a_folder_that_changes_while_measured_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing that is not empty, or a snapshot that no longer holds, is not the cheapest
    capture: the figure would be wrong."""
    from workspace.shadow import ShadowStore

    work = tmp_path / "work"
    work.mkdir()
    real = ShadowStore.capture

    def capture_then_write(self: ShadowStore, cwd: Path, resolved: str | None = None) -> object:
        done = real(self, cwd, resolved)
        (cwd / f"new-{len(list(cwd.iterdir()))}").write_text("x")  # someone writes after it
        return done

    monkeypatch.setattr(ShadowStore, "capture", capture_then_write)
    with pytest.raises(RuntimeError, match="changed while its floor was measured"):
        capture_latency(work, tmp_path / "checkpoints", samples=2, racy_margin_ns=10**8)
