"""`drivers.turn_ends.TurnEnds` on real files: a Turn's end found from a file's end
across reads that split lines (and lines longer than a read), the line remembered and checked
again in place, a file cut back or rewritten searched again, a line that only names the Turn
(its start) or is torn not taken for its end, and the no-search check's answer from a tail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drivers import turn_ends
from drivers.turn_ends import TurnEnds


def line(kind: str, turn_id: str, pad: int = 0) -> bytes:
    payload = {"type": kind, "turn_id": turn_id, "last_agent_message": "x" * pad}
    record = {"timestamp": "t", "ordinal": 0, "type": "event_msg", "payload": payload}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def filler(n: int, size: int) -> bytes:
    record = {"timestamp": "t", "ordinal": 0, "type": "response_item", "payload": {}}
    one = json.dumps({**record, "pad": "y" * size}, separators=(",", ":")).encode() + b"\n"
    return one * n


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_a_turns_end_is_found_from_the_files_end_across_split_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(turn_ends, "CHUNK_BYTES", chunk)
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(
        line("task_started", "A")
        + line("task_complete", "A", pad=300)
        + filler(5, 100)
        + line("task_started", "B")
        + filler(3, 50)
    )
    ends = TurnEnds()
    assert ends.missing(tmp_path, "A", None, lambda: [path], search=True) is False
    assert ends.missing(tmp_path, "B", None, lambda: [path], search=True) is True  # started only
    assert ends.missing(tmp_path, "C", None, lambda: [path], search=True) is True


def test_the_line_is_remembered_and_a_cut_or_rewrite_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "rollout.jsonl"
    head = filler(2, 10) + line("task_started", "A")
    path.write_bytes(head + line("task_complete", "A") + filler(1, 10))
    ends = TurnEnds()
    assert ends.missing(tmp_path, "A", None, lambda: [path], search=True) is False
    # Remembered: found again with no search at all.
    assert ends.missing(tmp_path, "A", None, lambda: [], search=False) is False
    path.write_bytes(head)  # cut back to before the Turn's end
    assert ends.missing(tmp_path, "A", None, lambda: [], search=False) is None
    assert ends.missing(tmp_path, "A", None, lambda: [path], search=True) is True
    path.write_bytes(head + line("task_complete", "A")[:-5])  # its end torn
    assert ends.missing(tmp_path, "A", None, lambda: [path], search=True) is True


def test_the_no_search_check_reads_a_tail_and_the_search_the_lineage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turn_ends, "TAIL_BYTES", 200)
    own, parent = tmp_path / "own.jsonl", tmp_path / "parent.jsonl"
    parent.write_bytes(line("task_complete", "P") + filler(1, 10))
    own.write_bytes(line("turn_aborted", "A") + filler(4, 100) + line("task_complete", "B"))
    ends = TurnEnds()
    assert ends.missing(tmp_path, "B", own, lambda: [], search=False) is False  # in the tail
    assert ends.missing(tmp_path, "A", own, lambda: [], search=False) is None  # before it
    assert ends.missing(tmp_path, "A", own, lambda: [own, parent], search=True) is False
    assert ends.missing(tmp_path, "P", own, lambda: [own, parent], search=True) is False
    assert ends.missing(tmp_path, "Q", own, lambda: [own, parent], search=True) is True
