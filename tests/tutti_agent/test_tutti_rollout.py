"""Rollout files: format, exact lookup, torn tails and corruption (seed 004 §10 first row)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tutti_agent.items import explicit_turn, user_msg
from tests.tutti_agent.storeutil import write_root
from tutti_agent.errors import RolloutCorrupt
from tutti_agent.fork import ForkOptions, ForkPersistence, ForkService
from tutti_agent.rollout import (
    RolloutWriter,
    find_rollout_path,
    iter_rollout_paths,
    read_rollout,
)
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "tutti-home")


def test_lines_carry_timestamp_ordinal_type_payload(store: ThreadStore) -> None:
    tid = write_root(store, explicit_turn("t1", "u1", "a1"))
    raw = [json.loads(line) for line in store.path_of(tid).read_text().splitlines()]
    assert all(set(obj) == {"timestamp", "ordinal", "type", "payload"} for obj in raw)
    assert [obj["ordinal"] for obj in raw] == list(range(len(raw)))
    assert raw[0]["type"] == "session_meta" and raw[0]["payload"]["id"] == tid


def test_lookup_is_exact_by_thread_id(store: ThreadStore) -> None:
    tid = write_root(store, [])
    assert find_rollout_path(store.home, tid) == store.path_of(tid)
    assert find_rollout_path(store.home, tid[:-1]) is None
    assert find_rollout_path(store.home, tid[1:]) is None


def test_a_new_rollout_is_filed_in_sessions_and_an_older_dated_one_still_found(
    store: ThreadStore,
) -> None:
    """A new rollout lands directly in `sessions/` (no YYYY/MM/DD: a fork child's home is three
    directories, not six); one an older build filed under `sessions/YYYY/MM/DD` is still found
    by the exact lookup, listed, loaded and forked from (its child filed the new way)."""
    old = write_root(store, explicit_turn("t1", "u1", "a1"))
    dated = store.home / "sessions" / "2026" / "11" / "29" / store.path_of(old).name
    dated.parent.mkdir(parents=True)
    store.path_of(old).rename(dated)
    fresh = ThreadStore(store.home)  # no remembered path
    new = write_root(fresh, explicit_turn("t2", "u2", "a2"))
    assert fresh.path_of(new).parent == store.home / "sessions"
    assert find_rollout_path(store.home, old) == dated
    assert find_rollout_path(store.home, new) == fresh.path_of(new)
    assert list(iter_rollout_paths(store.home)) == sorted([dated, fresh.path_of(new)])
    assert fresh.load(old).path == dated
    child = ForkService(fresh).fork(old, ForkOptions()).child
    assert fresh.path_of(child.thread_id).parent == store.home / "sessions"
    assert ThreadStore(store.home).load(child.thread_id).forked_from_id == old


def test_torn_last_line_is_ignored_and_cut_before_the_next_append(store: ThreadStore) -> None:
    tid = write_root(store, explicit_turn("t1", "u1", "a1"))
    path = store.path_of(tid)
    with open(path, "ab") as f:
        f.write(b'{"timestamp":"x","ordinal":5,"type":"resp')
    assert len(read_rollout(path)) == 5
    writer = RolloutWriter(path, 5, create=False)
    writer.append(user_msg("next"))
    writer.close()
    lines = read_rollout(path)
    assert [line.ordinal for line in lines] == list(range(6))
    assert path.read_bytes().endswith(b"\n")


_REFUSED_APPEND = """
import resource, sys
from tests.tutti_agent.items import user_msg
from tutti_agent.rollout import RolloutWriter
path, size = sys.argv[1], int(sys.argv[2])
writer = RolloutWriter(__import__("pathlib").Path(path), 5, create=False)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, hard))  # the disk fills mid-line
try:
    writer.append(user_msg("refused"))
except OSError:
    pass
else:
    sys.exit("the append past the limit was not refused")
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space returns
writer.append(user_msg("next"))
writer.close()
"""


def test_an_append_the_disk_refuses_leaves_no_line_to_glue_onto_the_next(
    store: ThreadStore,
) -> None:
    # In a process of its own: the file size limit (EFBIG past it, as on a full file system,
    # 10 bytes of the line written first) is the whole process's.
    tid = write_root(store, explicit_turn("t1", "u1", "a1"))
    path = store.path_of(tid)
    size = path.stat().st_size
    ran = subprocess.run(
        [sys.executable, "-c", _REFUSED_APPEND, str(path), str(size)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == 0, ran.stderr
    lines = read_rollout(path)
    assert [line.ordinal for line in lines] == list(range(6))
    assert lines[-1].item.payload["content"][0]["text"] == "next"
    assert path.read_bytes().endswith(b"\n")


def test_corrupt_line_before_the_end_is_an_error_not_a_guess(store: ThreadStore) -> None:
    tid = write_root(store, explicit_turn("t1", "u1", "a1"))
    path = store.path_of(tid)
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"{not json"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(RolloutCorrupt):
        read_rollout(path)


def test_unreadable_source_creates_no_child(store: ThreadStore) -> None:
    tid = write_root(store, explicit_turn("t1", "u1", "a1"))
    path = store.path_of(tid)
    data = path.read_bytes().split(b"\n")
    data[1] = b"garbage"
    path.write_bytes(b"\n".join(data))
    for persistence in ForkPersistence:
        with pytest.raises(RolloutCorrupt):
            ForkService(store).fork(tid, ForkOptions(persistence=persistence))
    assert list(iter_rollout_paths(store.home)) == [path]
    assert not store.is_reserved(tid)


def test_referenced_child_reads_its_own_settings_on_cold_resume(
    store: ThreadStore, tmp_path: Path
) -> None:
    tid = write_root(store, explicit_turn("t1", "u1", "a1"), cwd="/source")
    child = (
        ForkService(store)
        .fork(tid, ForkOptions(persistence=ForkPersistence.REFERENCED, cwd="/child"))
        .child
    )
    cold = ThreadStore(tmp_path / "tutti-home").load(child.thread_id)
    assert cold.effective_settings()["cwd"] == "/child"
    assert ThreadStore(tmp_path / "tutti-home").load(tid).effective_settings()["cwd"] == "/source"


@pytest.mark.parametrize("block", [1, 2, 7, 16, 64, 1 << 18])
def test_line_blocks_yield_the_lines_one_split_yields_at_any_block_size(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tutti_agent import rollout

    monkeypatch.setattr(rollout, "LINE_BLOCK", block)
    data = b"a\n\nbcdefghijklmnopqrstuvwxyz0123456789\nxy\n" * 5 + b"torn tail"
    whole = data.split(b"\n")[:-1]
    assert list(rollout.lines_of(data)) == whole
    assert [line for lines in rollout.line_blocks(data) for line in lines] == whole
    # A window of the bytes: the lines between `start` and `stop` only.
    start, stop = 2, data.rindex(b"\n") + 1
    assert list(rollout.lines_of(data, start, stop)) == data[start:stop].split(b"\n")[:-1]
    assert list(rollout.lines_of(b"no newline")) == []


@pytest.mark.parametrize("at", [0, 5, 14, 15, 16, 17, 30, 31])
def test_a_long_digit_run_across_a_block_boundary_still_sends_the_file_to_the_standard_decoder(
    at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tutti_agent import rollout

    monkeypatch.setattr(rollout, "AGREE_BLOCK", 16)
    digits = b"1" * rollout.LONG_DIGITS
    data = b"x" * at + digits + b"x" * 40
    assert not rollout.orjson_agrees(data)
    assert rollout.orjson_agrees(data.replace(digits, digits[:-1] + b" "))


def test_file_holds_is_true_only_for_the_very_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tutti_agent import rollout

    monkeypatch.setattr(rollout, "COMPARE_BLOCK", 4)
    path = tmp_path / "f"
    data = b'{"a":1}\n{"b":2}\n'
    path.write_bytes(data)
    assert rollout.file_holds(path, data)
    for other in (data[:-1], data + b"\n", data[:-2] + b"3\n", b"", b"x" + data[1:]):
        assert not rollout.file_holds(path, other)
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(OSError):
        rollout.file_holds(tmp_path / "link", data)


def test_a_child_is_written_without_a_joined_copy_of_its_copied_lines(tmp_path: Path) -> None:
    """The copied bytes go to the file as they are: a join of them first would be a second
    copy of a 10,000-Turn child's 14.7 MB, its pages touched afresh on the fork's path."""
    import resource

    from tutti_agent.rollout import CopiedSpan, RolloutItem, RolloutLine

    payload = {"type": "message", "role": "user", "content": [{"text": "x" * 4000}]}
    line = json.dumps({"timestamp": "t", "ordinal": 0, "type": "response_item", "payload": payload})
    count, size = 8000, len(line) + 1
    data = b"".join(
        (line.replace('"ordinal":0', f'"ordinal":{i:04d}') + "\n").encode()
        for i in range(1, count + 1)
    )
    item = RolloutItem("response_item", payload)
    lines = [RolloutLine(i, "t", item, i * size) for i in range(1, count + 1)]
    copied = CopiedSpan(data, 0, lines)
    meta = RolloutItem("session_meta", {"id": "child"})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    writer, _ = RolloutWriter.create(tmp_path / "r.jsonl", 0, [meta], copied, copied_lines=False)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    writer.close()
    assert (tmp_path / "r.jsonl").read_bytes().endswith(data)
    assert faults < len(data) // 4096 // 2, f"{faults} page faults for {len(data):,} bytes"
