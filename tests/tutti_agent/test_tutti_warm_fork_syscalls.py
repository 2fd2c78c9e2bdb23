"""A warm app-server's repeated `thread/fork` of one unchanged source, as the host asks it
(`loaded: false`, `turnItems: false`, `turnColumns: true`): after the first fork, each one
opens only its child and the child's directory and stats the source once and the child once —
the source's copied span is not opened nor read again, the child not stat'ed twice — and its
child still holds the source's prefix byte for byte, its answer the file's `updatedAt` and
the source's preview. Counts of real system calls on real files, never timings."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.tutti_agent.items import explicit_turn
from tests.tutti_agent.storeutil import write_root
from tutti_agent.model import BuiltinModel
from tutti_agent.server import AppServer
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)


@contextmanager
def _counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    """Every `os.open`, `os.stat`, `os.fstat` and `os.pread` made meanwhile, by call."""
    calls: dict[str, list[str]] = {"open": [], "stat": [], "fstat": [], "pread": []}
    for name in calls:
        real = getattr(os, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls[_name].append(str(args[0]))
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, counted)
    yield calls
    monkeypatch.undo()


def test_a_warm_fork_opens_and_stats_only_what_it_must(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ThreadStore(tmp_path / "home")
    items = [*explicit_turn("t1", "the first question", "a1"), *explicit_turn("t2", "q2", "a2")]
    thread_id = write_root(store, items)
    source_path = store.path_of(thread_id)
    source_lines = source_path.read_bytes().splitlines(keepends=True)
    out = io.StringIO()
    server = AppServer(store, BuiltinModel(), out)

    def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
        out.seek(0)
        out.truncate()
        server.handle_line(json.dumps({"id": 1, "method": method, "params": params}))
        answer: dict[str, Any] = orjson.loads(out.getvalue().split("\n", 1)[0])
        assert "error" not in answer, answer
        return answer["result"]

    fork = {
        "threadId": thread_id,
        "lastTurnId": "t2",
        "loaded": False,
        "turnItems": False,
        "turnColumns": True,
    }
    try:
        ask("initialize", {"clientInfo": {"name": "t", "version": "0"}})
        ask("thread/fork", fork)  # the first: reads the source and its span
        for _ in range(3):
            with _counting(monkeypatch) as calls:
                thread = ask("thread/fork", fork)["thread"]
            child = Path(thread["path"])
            # The child (created) and its directory (fsynced): the source is not opened.
            assert calls["open"] == [str(child), str(child.parent)]
            assert calls["pread"] == []
            # The source's freshness and the child's size and mtime, one `stat` each.
            assert sorted(calls["stat"]) == sorted([str(source_path), str(child)])
            assert calls["fstat"] == []
            child_lines = child.read_bytes().splitlines(keepends=True)
            assert child_lines[1:-1] == source_lines[1:]
            assert thread["turnIds"] == ["t1", "t2"]
            assert thread["preview"] == "the first question"
            assert thread["updatedAt"] == int(os.stat(child).st_mtime)
    finally:
        server.shutdown()


def test_a_grown_source_is_read_again_for_its_next_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept span is the parse's: a source that grew is parsed again, its span read again,
    and the child holds the grown prefix."""
    store = ThreadStore(tmp_path / "home")
    thread_id = write_root(store, explicit_turn("t1", "q1", "a1"))
    out = io.StringIO()
    server = AppServer(store, BuiltinModel(), out)

    def fork(last: str) -> Path:
        out.seek(0)
        out.truncate()
        params = {"threadId": thread_id, "lastTurnId": last, "loaded": False, "turnItems": False}
        server.handle_line(json.dumps({"id": 1, "method": "thread/fork", "params": params}))
        answer: dict[str, Any] = orjson.loads(out.getvalue().split("\n", 1)[0])
        assert "error" not in answer, answer
        return Path(answer["result"]["thread"]["path"])

    try:
        server.handle_line(json.dumps({"id": 0, "method": "initialize", "params": {}}))
        fork("t1")
        writer = store.open_writer(store.load(thread_id))
        for item in explicit_turn("t2", "q2", "a2"):
            writer.append(item)
        writer.close()
        source_path = store.path_of(thread_id)
        with _counting(monkeypatch) as calls:
            child = fork("t2")
        assert str(source_path) in calls["open"]  # the grown file read again
        source_lines = source_path.read_bytes().splitlines(keepends=True)
        assert child.read_bytes().splitlines(keepends=True)[1:-1] == source_lines[1:]
    finally:
        server.shutdown()
