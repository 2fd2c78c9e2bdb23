"""The readability proof takes the binder's decoding of the bytes it bound instead of decoding
the child again, and only for a file that still holds exactly those bytes: a copy changed after
the bind (cut, or rewritten in place at the same length) is read from disk and refused."""

from __future__ import annotations

from pathlib import Path

import pytest

import tutti_agent
from drivers.binder import BindReceipt, RolloutBinder, iter_rollouts
from drivers.tutti_agent import prove_tutti_child
from tests.tutti_agent.items import explicit_turn
from tests.tutti_agent.storeutil import write_root
from tutti_agent.fork import ForkOptions, ForkService, ThroughTurn
from tutti_agent.rollout import read_rollout
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)
VERSION = tutti_agent.__version__


def _bound_child(tmp_path: Path) -> tuple[Path, str, str, list[str], BindReceipt]:
    source_home, target = tmp_path / "source", tmp_path / "target"
    store = ThreadStore(source_home)
    turns = ["t1", "t2", "t3"]
    root = write_root(store, [it for t in turns for it in explicit_turn(t, f"u-{t}", f"a-{t}")])
    child = ForkService(store).fork(root, ForkOptions(boundary=ThroughTurn("t2"))).child
    receipt = RolloutBinder().bind(source_home, target, child.thread_id)
    return target, child.thread_id, root, turns[:2], receipt


def test_the_proof_takes_the_binders_parse_of_an_unchanged_copy(tmp_path: Path) -> None:
    target, child_id, source_id, prefix, receipt = _bound_child(tmp_path)
    [copied] = list(iter_rollouts(target))
    assert set(receipt.parsed) == {str(copied)}
    parsed = receipt.parsed[str(copied)]
    assert parsed.data == copied.read_bytes()
    store = ThreadStore(target)
    assert store.adopt_decoded(copied, parsed.data, parsed.records) is True
    # The lines taken are the ones a decode of the file returns, offsets included.
    assert list(store.load(child_id).lines) == read_rollout(copied)
    assert prove_tutti_child(target, child_id, source_id, prefix, VERSION, receipt.parsed) is None
    # It still judges: another prefix or source is refused with the shared parse too.
    assert (
        prove_tutti_child(target, child_id, source_id, prefix[:1], VERSION, receipt.parsed)
        is not None
    )
    assert (
        prove_tutti_child(target, child_id, child_id, prefix, VERSION, receipt.parsed) is not None
    )


def test_a_copy_cut_after_the_bind_is_read_from_disk_and_refused(tmp_path: Path) -> None:
    target, child_id, source_id, prefix, receipt = _bound_child(tmp_path)
    [copied] = list(iter_rollouts(target))
    data = copied.read_bytes()
    copied.write_bytes(data[: data.index(b"\n") + 1])  # what the tamper failpoint does
    assert ThreadStore(target).adopt_decoded(copied, data, receipt.parsed[str(copied)].records) is (
        False
    )
    problem = prove_tutti_child(target, child_id, source_id, prefix, VERSION, receipt.parsed)
    assert problem is not None and "no longer holds the bytes the binder wrote" in problem


def test_a_copy_rewritten_in_place_at_the_same_length_is_refused(tmp_path: Path) -> None:
    target, child_id, source_id, prefix, receipt = _bound_child(tmp_path)
    [copied] = list(iter_rollouts(target))
    data = copied.read_bytes()
    changed = data.replace(b'"t2"', b'"t9"')
    assert len(changed) == len(data) and changed != data
    copied.write_bytes(changed)
    parsed = receipt.parsed[str(copied)]
    assert ThreadStore(target).adopt_decoded(copied, parsed.data, parsed.records) is False
    problem = prove_tutti_child(target, child_id, source_id, prefix, VERSION, receipt.parsed)
    assert problem is not None and "no longer holds the bytes the binder wrote" in problem
