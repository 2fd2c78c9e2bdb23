"""A Turn's `before` begun beside its claim (`TurnCheckpoints.capture_before_claim`): the tree
is answered as soon as it is known, but no ref file is created or renamed until the claim says
it is durable — a ref's create and rename beside the claim's fsync on the same filesystem
lengthen that fsync — and then the same refs as the pool's capture are kept; a ref that cannot
be kept then is said by the job's own answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.checkpoints import TurnCheckpoints
from drivers.failpoints import Failpoints
from tests.workspace.test_capture_cost import age, aged_store, repo
from workspace.shadow import Checkpoint, Unavailable

pytestmark = pytest.mark.timeout(60)

__all__ = ["repo"]  # the fixture, used by name


@pytest.fixture
def turns(tmp_path: Path, repo: Path) -> Iterator[TurnCheckpoints]:
    age()
    t = TurnCheckpoints(aged_store(tmp_path), failpoints=Failpoints())
    try:
        yield t
    finally:
        t.pool.shutdown(wait=True)


def refs_dir(turns: TurnCheckpoints, repo: Path) -> Path:
    return turns.shadow.repo_dir(repo) / "refs" / "agenthost" / "s1"


def ref_files(turns: TurnCheckpoints, repo: Path) -> list[str]:
    top = refs_dir(turns, repo)
    return sorted(str(p.relative_to(top)) for p in top.rglob("*")) if top.exists() else []


def test_the_tree_is_answered_before_the_claim_is_durable_and_its_refs_written_after(
    turns: TurnCheckpoints, repo: Path
) -> None:
    pooled = turns.capture(str(repo), "s1", "t0", "before").result(30)
    assert isinstance(pooled.checkpoint, Checkpoint)
    durable = threading.Event()
    answered, kept = turns.capture_before_claim(str(repo), "s1", "t1", durable)
    got = answered.result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    assert got.checkpoint.tree == pooled.checkpoint.tree
    # The claim's COMMIT has not returned: not one file of this Turn's refs exists yet.
    assert not kept.done()
    assert [r for r in ref_files(turns, repo) if r.startswith("t1")] == []
    durable.set()
    assert kept.result(30) == got
    # Then the same refs as the pool's `before`: the ref, and its `after`'s lock reserved.
    assert [r for r in ref_files(turns, repo) if r.startswith("t1")] == [
        "t1",
        "t1/after.lock",
        "t1/before",
    ]
    assert (refs_dir(turns, repo) / "t1" / "before").read_text() == got.checkpoint.commit + "\n"


def test_a_ref_that_cannot_be_kept_after_the_claim_is_said_by_the_jobs_own_answer(
    turns: TurnCheckpoints, repo: Path
) -> None:
    turns.capture(str(repo), "s1", "t0", "before").result(30)
    durable = threading.Event()
    answered, kept = turns.capture_before_claim(str(repo), "s1", "t1", durable)
    assert isinstance(answered.result(30).checkpoint, Checkpoint)
    # Someone else holds the ref's lock (as a killed writer would leave it).
    (refs_dir(turns, repo) / "t1").mkdir(parents=True)
    (refs_dir(turns, repo) / "t1" / "before.lock").write_text("")
    durable.set()
    own = kept.result(30)
    assert isinstance(own.checkpoint, Unavailable)
