"""`session.timeline`'s page (`agenthost.api.timeline_result`) is the wire projection of the
Session's Turns as `timeline` reads them, byte for byte once packed — every field of a Turn,
its Messages and its Interactions, for every kind of Turn (settled by each outcome, with a typed
error, active, with a workspace record, with pending and resolved Interactions) and for a
provider whose binding state reads the binding's JSON — and it builds no value per row that the
wire does not need, and its statements sort nothing. Pinned by what runs (values built,
decodes, query plans), never by timings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from store_builders import WS, new_session, settled_turn

from agenthost import projection
from agenthost.api import timeline_result
from agenthost.catalog import Catalog
from drivers.claude_transcript import encode_binding
from protocol.envelope import pack_result
from storage.models import Turn
from storage.store import Store
from tests.support.sql_trace import traced_selects

pytestmark = pytest.mark.timeout(60)

CHECKPOINT = {
    "cwd": "/work",
    "before": "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    "after": "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    "changedFiles": ["a.txt"],
    "headCommit": None,
    "repoRoot": None,
    "tooLarge": [],
}
CLAUDE_BINDING = encode_binding("m-1")
"""A real Claude checkpoint: the one binding Claude's state reads as bound."""


def _varied_session(store: Store, provider: str) -> str:
    """A Session with one Turn of each shape the projection tells apart."""
    sid = new_session(store, provider=provider)
    payload = {"providerItemId": "msg_1", "providerItemType": "agentMessage", "n": 2**40}
    settled_turn(store, sid, extra=[("reasoning", "thinking", payload)])
    settled_turn(store, sid, binding_json=CLAUDE_BINDING)
    settled_turn(store, sid, outcome="interrupted")
    failed, _ = store.turns.claim_submit(WS, sid, "r-failed", "x")
    store.turns.record_settlement(
        WS,
        sid,
        failed.turn_id,
        outcome="failed",
        error="model_timeout: tutti-agent timed out after 30 s",
        checkpoint_json=json.dumps(CHECKPOINT),
    )
    asked, _ = store.turns.claim_submit(WS, sid, "r-asked", "ask me")
    store.history.open_interaction(
        WS, sid, asked.turn_id, request_id="q1", kind="approval", input={"cmd": "ls"}
    )
    store.history.resolve_interaction(WS, sid, asked.turn_id, "q1", {"ok": True})
    store.history.open_interaction(
        WS, sid, asked.turn_id, request_id="q2", kind="question", input={"q": "why?"}
    )
    store.history.append_message(
        WS, sid, asked.turn_id, kind="assistant", text=None, payload={"a": [1, 2.5, None]}
    )
    return sid


@contextmanager
def _turns_built() -> Iterator[list[object]]:
    """Every `Turn` value constructed inside the block."""
    built: list[object] = []
    init = Turn.__init__

    def counting(self: Turn, *args: Any, **kwargs: Any) -> None:
        built.append(args)
        init(self, *args, **kwargs)

    Turn.__init__ = counting  # type: ignore[method-assign]
    try:
        yield built
    finally:
        Turn.__init__ = init  # type: ignore[method-assign]


@pytest.mark.parametrize("provider", ["tutti-agent", "claude-code"])
def test_the_timeline_page_is_the_projection_of_its_turns_byte_for_byte(
    store: Store, provider: str
) -> None:
    sid = _varied_session(store, provider)
    catalog = Catalog()
    for after, limit in ((0, 100), (0, 2), (1, 2), (4, 1)):
        turns, next_sequence = store.history.timeline(WS, sid, after_sequence=after, limit=limit)
        expected = {
            "turns": [projection.turn(t, provider, catalog) for t in turns],
            "nextSequence": next_sequence,
        }
        got = timeline_result(store, catalog, WS, sid, after, limit)
        assert got == expected, (after, limit)
        assert pack_result(got) == pack_result(expected), (after, limit)
    page = timeline_result(store, catalog, WS, sid, 0, 100)["turns"]
    assert [t["phase"] for t in page] == ["settled"] * 4 + ["active"]
    states = [t["providerForkBindingState"] for t in page]
    if provider == "claude-code":
        assert states == ["recovery_required", "bound", "recovery_required"] + ["unavailable"] * 2
    assert page[3]["errorReason"] == "model_timeout" and page[3]["workspace"] == CHECKPOINT
    assert [i["status"] for i in page[4]["interactions"]] == ["resolved", "pending"]


def test_the_timeline_page_builds_no_turn_value(store: Store) -> None:
    """Each Turn of the page goes from its row to the wire map: no `Turn` value per row."""
    sid = _varied_session(store, "tutti-agent")
    with _turns_built() as built:
        got = timeline_result(store, Catalog(), WS, sid, 0, 100)
    assert len(got["turns"]) == 5
    assert built == [], "a Turn value was built for the wire page"


def test_a_timeline_pages_statements_sort_nothing(store_path: Path) -> None:
    """Every statement of a page reads its rows in the order an index gives them: no sorter
    opened (a Turn's Interactions are put in the order opened by the store, in Python)."""
    with traced_selects() as seen:
        store = Store.open(store_path)
        try:
            sid = _varied_session(store, "tutti-agent")
            seen.clear()
            timeline_result(store, Catalog(), WS, sid, 0, 100)
            ran = list(seen)
            conn = store.db.connection()
            try:
                plans = {
                    sql: [str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings)]
                    for sql, bindings in ran
                }
            finally:
                store.db.release_thread_connection()
        finally:
            store.close()
    assert any("FROM interactions" in sql for sql in plans), plans
    for sql, plan in plans.items():
        assert not any("TEMP B-TREE" in step for step in plan), (sql, plan)


def test_each_turns_interactions_come_in_the_order_opened(store: Store) -> None:
    """Opened in an order their request ids do not sort in, on two Turns of one page: each
    Turn's Interactions in the order opened, in the page and in every Turn read."""
    sid = new_session(store)
    opened: dict[str, list[str]] = {}
    for n, requests in enumerate((["q9", "q1", "q5"], ["b", "a"])):
        turn, _ = store.turns.claim_submit(WS, sid, f"r{n}", "ask")
        for request_id in requests:
            store.history.open_interaction(
                WS, sid, turn.turn_id, request_id=request_id, kind="approval", input={}
            )
        opened[turn.turn_id] = requests
        if n == 0:
            store.history.resolve_interaction(WS, sid, turn.turn_id, "q1", {"ok": True})
            store.turns.settle_turn(WS, sid, turn.turn_id, outcome="completed")
    page = timeline_result(store, Catalog(), WS, sid, 0, 100)["turns"]
    assert {t["turnId"]: [i["requestId"] for i in t["interactions"]] for t in page} == opened
    turns, _ = store.history.timeline(WS, sid)
    assert {t.turn_id: [i.request_id for i in t.interactions] for t in turns} == opened
    active = turns[-1].turn_id
    tail = store.history.turn_since(WS, sid, active, None)
    assert [i.request_id for i in tail.turn.interactions] == opened[active]


def test_the_timeline_page_decodes_no_json_with_the_standard_librarys_decoder(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its payloads and workspace records are read by orjson (`storage.rows.json_column`:
    the standard library's values, at a third of its cost): no text goes to `json.loads`."""
    sid = _varied_session(store, "tutti-agent")
    decoded: list[str] = []
    standard = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        decoded.append(text)
        return standard(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    got = timeline_result(store, Catalog(), WS, sid, 0, 100)
    monkeypatch.undo()
    assert got["turns"][3]["workspace"] == CHECKPOINT
    assert got["turns"][0]["messages"][1]["payload"]["n"] == 2**40
    assert decoded == []


def _python_calls(fn: Any) -> dict[str, int]:
    """Python frames entered while `fn()` runs on this thread, per function name of
    `agenthost/projection.py`, plus `"<all>"` for every Python frame (comprehensions too)."""
    import sys

    counts: dict[str, int] = {"<all>": 0}

    def prof(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        counts["<all>"] += 1
        if frame.f_code.co_filename.endswith("typing.py"):
            counts["typing." + frame.f_code.co_name] = (
                counts.get("typing." + frame.f_code.co_name, 0) + 1
            )
        if frame.f_code.co_filename.endswith("agenthost/projection.py"):
            name = frame.f_code.co_name
            counts[name] = counts.get(name, 0) + 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


def test_a_settled_turn_is_projected_in_few_python_calls(store: Store) -> None:
    """A page of plain settled Turns (the timeline a GUI reads most): each Turn's projection
    is `turn_of_row`, `_turn`, its Messages' `message_of_row` and its workspace record, with no
    helper frame per closed-set word (`_one_of`), no comprehension frame per list and no
    `error_reason` for a Turn with no error. Counted, never timed."""
    sid = new_session(store, provider="tutti-agent")
    turns = 20
    for _ in range(turns):
        settled_turn(store, sid)
    catalog = Catalog()
    timeline_result(store, catalog, WS, sid, 0, turns)  # warm: statements compiled, imports
    got: dict[str, Any] = {}
    counts = _python_calls(lambda: got.update(timeline_result(store, catalog, WS, sid, 0, turns)))
    assert len(got["turns"]) == turns
    assert all(t["phase"] == "settled" and t["outcome"] == "completed" for t in got["turns"])
    for helper in ("_one_of", "_one_of_or_none", "error_reason", "<listcomp>"):
        assert counts.get(helper, 0) == 0, (helper, counts)
    assert counts["_turn"] == turns and counts["turn_of_row"] == turns, counts


def test_a_turns_workspace_record_is_projected_without_a_typing_call(store: Store) -> None:
    """A Turn with a workspace record: the record is decoded and shown as it was written, with
    no `typing.cast` frame per Turn (a Python function call that only returns its argument).
    Counted, never timed."""
    sid = new_session(store, provider="tutti-agent")
    turns = 10
    for i in range(turns):
        turn, _ = store.turns.claim_submit(WS, sid, f"r-{i}", "x")
        store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed", checkpoint_json=json.dumps(CHECKPOINT)
        )
    catalog = Catalog()
    timeline_result(store, catalog, WS, sid, 0, turns)
    got: dict[str, Any] = {}
    counts = _python_calls(lambda: got.update(timeline_result(store, catalog, WS, sid, 0, turns)))
    assert [t["workspace"] for t in got["turns"]] == [CHECKPOINT] * turns
    assert counts.get("typing.cast", 0) == 0, counts
    assert counts["_workspace"] == turns, counts


def _paged(store: Store, sid: str, max_chars: int) -> list[list[str]]:
    """Every page's Turn ids, paged with `after_sequence` = the last `next_sequence`."""
    pages: list[list[str]] = []
    after = 0
    while True:
        page = store.history.timeline_page(
            WS, sid, after_sequence=after, limit=1000, max_chars=max_chars
        )
        assert page.turn_rows, f"an empty page after {after}"
        pages.append([r[2] for r in page.turn_rows])
        assert set(page.message_rows) >= set(pages[-1])
        if page.next_sequence is None:
            return pages
        assert page.next_sequence == page.turn_rows[-1][3]
        after = page.next_sequence


def test_a_byte_bounded_page_is_read_in_runs_and_pages_on(store: Store) -> None:
    # 300 Turns of ~2.7 KiB of text with their echo: more than one run of reads a page, the
    # page cut at ~1 MiB, and the next page from the Turn after its last.
    sid = new_session(store)
    made = [settled_turn(store, sid, text=f"{i} " + "t" * 1200).turn_id for i in range(300)]
    pages = _paged(store, sid, 1 << 20)
    assert [t for p in pages for t in p] == made
    assert len(pages) == 1  # ~0.9 MiB in all
    pages = _paged(store, sid, 300 << 10)
    assert [t for p in pages for t in p] == made
    assert len(pages) > 2 and all(len(p) > 1 for p in pages)


def test_a_turns_interactions_count_toward_the_bound(store: Store) -> None:
    sid = new_session(store)
    small = settled_turn(store, sid, text="s").turn_id
    asked, _ = store.turns.claim_submit(WS, sid, "r-asked", "ask me")
    store.history.open_interaction(
        WS, sid, asked.turn_id, request_id="q", kind="question", input={"q": "x" * 4000}
    )
    # ~1.5 KB of text without the Interaction's input: one page of 3,000 would hold both.
    assert _paged(store, sid, 3000) == [[small], [asked.turn_id]]
