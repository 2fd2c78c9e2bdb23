"""What a cold `thread/resume` reads of a long rollout: its head's bytes are the deferred
load's (the file is read once while it is unchanged), and the writer it opens reads only the
tail after the last newline — counted as the pages the reading thread touches afresh."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from tests.tutti_agent.items import explicit_turn, user_msg
from tests.tutti_agent.storeutil import count_parses, write_root
from tutti_agent.rollout import TAIL_BLOCK, RolloutWriter, read_rollout
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)

BIG = 48 << 20
"""Above glibc's largest dynamic mmap threshold (32 MB): a buffer this big is fresh pages on
every allocation, whatever the process allocated and freed before."""


def _thread_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def test_the_deferred_load_parses_the_bytes_the_head_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume's head reads the whole rollout; the load right after (the file unchanged)
    parses those bytes instead of reading the file again, to the same lines."""
    store = ThreadStore(tmp_path / "home")
    tid = write_root(store, [*explicit_turn("t1", "u1", "a1"), *explicit_turn("t2", "u2", "a2")])
    parsed = count_parses(monkeypatch)
    assert store.head(tid) is not None
    history = store.load(tid)
    assert parsed == []  # no second read of the file
    assert list(history.lines) == read_rollout(store.path_of(tid))


def test_a_rollout_changed_since_the_head_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's bytes are taken only under the key (identity, size, mtime) they were read
    with: a line appended since is read from the file; and they are taken once."""
    store = ThreadStore(tmp_path / "home")
    tid = write_root(store, explicit_turn("t1", "u1", "a1"))
    path = store.path_of(tid)
    parsed = count_parses(monkeypatch)
    assert store.head(tid) is not None
    writer = store.open_writer(store.load(tid))
    assert parsed == []
    writer.append(user_msg("after the head"))
    writer.close()
    history = store.load(tid)
    assert parsed == [path]
    assert list(history.lines) == read_rollout(path)
    assert history.lines[-1].item == user_msg("after the head")


def _big_rollout(path: Path, tail: bytes) -> None:
    line = b'{"timestamp":"t","ordinal":0,"type":"event_msg","payload":{"x":"' + b"y" * 180
    line += b'"}}\n'
    block = line * ((1 << 20) // len(line))
    with open(path, "wb") as f:
        for _ in range(BIG // len(block)):
            f.write(block)
        f.write(tail)


def test_opening_a_writer_reads_the_tail_not_the_rollout(tmp_path: Path) -> None:
    """A 48 MB rollout (12,288 pages): the writer's torn-tail check touches a few pages, where
    reading the file whole touched every one afresh."""
    path = tmp_path / "big.jsonl"
    _big_rollout(path, b"")
    size = path.stat().st_size
    before = _thread_faults()
    writer = RolloutWriter(path, 1, create=False)
    faults = _thread_faults() - before
    writer.close()
    assert path.stat().st_size == size
    assert faults < 200, faults  # the whole file is > 11,000 pages


@pytest.mark.parametrize("torn", [1, TAIL_BLOCK - 1, TAIL_BLOCK, 3 * TAIL_BLOCK + 5])
def test_a_torn_tail_of_any_length_is_cut_at_the_last_newline(tmp_path: Path, torn: int) -> None:
    """Across the blocks the tail is read in: the file ends at its last newline."""
    path = tmp_path / "torn.jsonl"
    _big_rollout(path, b"z" * torn)
    whole = path.stat().st_size
    RolloutWriter(path, 1, create=False).close()
    assert path.stat().st_size == whole - torn
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        assert f.read() == b"\n"


def test_a_rollout_without_a_newline_is_cut_to_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none.jsonl"
    path.write_bytes(b"x" * (2 * TAIL_BLOCK + 3))
    RolloutWriter(path, 0, create=False).close()
    assert path.stat().st_size == 0


def test_the_head_bytes_are_not_kept_past_the_next_read(tmp_path: Path) -> None:
    """A read that finds its parse cached drops the head's bytes too (14.7 MB for a long
    rollout are not held until some later load)."""
    store = ThreadStore(tmp_path / "home")
    tid = write_root(store, explicit_turn("t1", "u1", "a1"))
    store.load(tid)  # cached
    assert store.head(tid) is not None
    assert store._head_read is not None
    store.load(tid)
    assert store._head_read is None
