"""Canonical history on a real SQLite file: sessions, turns, messages, interactions, claims,
goal control, runtime operations, events and reopen."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import apsw
import pytest
from store_builders import WS, new_session, settled_turn

from domain.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    SessionBusy,
    SessionIdTaken,
    SessionNotFound,
    TurnNotFound,
)
from storage.models import SessionChanged, TurnChanged
from storage.store import Store
from tests.support.store_reads import (
    begin_goal_control,
    begin_runtime_operation,
    find_session,
    finish_goal_control,
    finish_runtime_operation,
)

pytestmark = pytest.mark.timeout(30)


def test_connection_uses_wal_full_sync_and_foreign_keys(store: Store) -> None:
    conn = store.db.connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_create_and_get_session_round_trips_every_field(store: Store) -> None:
    s = store.sessions.create_session(
        WS,
        session_id="s1",
        provider="codex",
        title="T",
        cwd="/w",
        settings={"a": [1]},
        model="m",
        rail_placement="left",
        visibility="hidden",
    )
    got = store.sessions.get_session(WS, "s1")
    assert got == s
    assert (got.kind, got.provider, got.settings, got.model) == ("root", "codex", {"a": [1]}, "m")
    assert (got.rail_placement, got.visibility, got.lineage, got.goal) == (
        "left",
        "hidden",
        None,
        None,
    )


def test_session_id_taken_even_after_delete_is_conflict(store: Store) -> None:
    new_session(store, session_id="s1")
    with pytest.raises(SessionIdTaken):
        new_session(store, session_id="s1")
    store.sessions.delete_session(WS, "s1")
    with pytest.raises(Conflict):
        new_session(store, session_id="s1")


def test_deleted_session_is_not_found_and_not_listed(store: Store) -> None:
    sid = new_session(store)
    store.sessions.delete_session(WS, sid)
    assert find_session(store, WS, sid) is None
    with pytest.raises(SessionNotFound):
        store.sessions.get_session(WS, sid)
    assert store.sessions.list_sessions(WS) == ([], None)


def test_other_workspace_ids_are_not_found(store: Store) -> None:
    sid = new_session(store)
    with pytest.raises(SessionNotFound):
        store.sessions.get_session("other", sid)
    with pytest.raises(SessionNotFound):
        store.turns.claim_submit("other", sid, "r", "x")


def test_list_sessions_pages_in_stable_created_then_id_order(store_path: Path) -> None:
    clock = iter([1000] * 4 + [2000] * 100)
    store = Store.open(store_path, clock=lambda: next(clock))
    ids = ["b", "a", "d", "c", "e"]
    for sid in ids:
        store.sessions.create_session(
            WS, session_id=sid, provider="p", title=sid, cwd="/", settings={}
        )
    seen, cursor = [], None
    while True:
        page, cursor = store.sessions.list_sessions(WS, cursor=cursor, limit=2)
        seen += [s.session_id for s in page]
        if cursor is None:
            break
    # The first four share created_at 1000 (tie broken by id); "e" came later.
    assert seen == ["a", "b", "c", "d", "e"]
    with pytest.raises(InvalidArgument):
        store.sessions.list_sessions(WS, cursor="garbage")
    store.close()


def test_submit_claim_replay_returns_same_turn_without_second_turn(store: Store) -> None:
    sid = new_session(store)
    t1, created1 = store.turns.claim_submit(WS, sid, "req-1", "hi")
    t2, created2 = store.turns.claim_submit(WS, sid, "req-1", "hi")
    assert (created1, created2) == (True, False)
    assert t1.turn_id == t2.turn_id
    assert store.history.timeline(WS, sid)[0] == [t2]
    assert [m.kind for m in t1.messages] == ["user"] and t1.messages[0].text == "hi"


def test_a_new_submit_claim_returns_the_turn_exactly_as_stored(store: Store) -> None:
    # claim_submit builds the Turn it inserted instead of reading it back: it must
    # equal a fresh read field for field, its user Message included, after earlier Turns too.
    sid = new_session(store)
    first, _ = store.turns.claim_submit(WS, sid, "r1", "first")
    store.history.append_message(
        WS, sid, first.turn_id, kind="assistant", text="ok", payload={"a": 1}
    )
    store.turns.settle_turn(WS, sid, first.turn_id, outcome="completed")
    turn, created = store.turns.claim_submit(WS, sid, "r2", "second")
    assert created
    assert turn == store.turns.get_turn(WS, sid, turn.turn_id)
    assert turn.sequence == 2 and turn.messages[0].position == 3
    assert store.turns.claim_submit(WS, sid, "r2", "second") == (turn, False)


def test_settle_turn_of_a_deleted_session_only_with_include_deleted(store: Store) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    store.db.connection().execute("UPDATE sessions SET deleted = 1 WHERE session_id = ?", (sid,))
    store.db.release_thread_connection()
    with pytest.raises(SessionNotFound):
        store.turns.settle_turn(WS, sid, turn.turn_id, outcome="failed")
    settled, changed = store.turns.settle_turn(
        WS, sid, turn.turn_id, outcome="failed", include_deleted=True
    )
    assert changed and settled.phase == "settled"
    with pytest.raises(SessionNotFound):
        store.turns.settle_turn(
            WS, "no-such-session", turn.turn_id, outcome="failed", include_deleted=True
        )


def test_submit_while_turn_active_is_busy(store: Store) -> None:
    sid = new_session(store)
    store.turns.claim_submit(WS, sid, "r1", "a")
    with pytest.raises(SessionBusy):
        store.turns.claim_submit(WS, sid, "r2", "b")


def test_turn_sequences_are_host_assigned_and_contiguous(store: Store) -> None:
    sid = new_session(store)
    turns = [settled_turn(store, sid, text=str(i)) for i in range(3)]
    assert [t.sequence for t in turns] == [1, 2, 3]
    assert {t.sequence_provenance for t in turns} == {"host"}


def test_settle_supersedes_pending_interactions_and_finishes_claim(store: Store) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "ask")
    store.history.open_interaction(
        WS, sid, turn.turn_id, request_id="q1", kind="question", input={}
    )
    claim = store.db.connection().execute("SELECT status FROM submit_claims").fetchone()[0]
    assert claim == "active"
    settled, changed = store.turns.settle_turn(WS, sid, turn.turn_id, outcome="interrupted")
    assert changed and settled.phase == "settled" and settled.outcome == "interrupted"
    assert [i.status for i in settled.interactions] == ["superseded"]
    assert (
        store.db.connection().execute("SELECT status FROM submit_claims").fetchone()[0]
        == "finished"
    )
    again, changed = store.turns.settle_turn(WS, sid, turn.turn_id, outcome="failed")
    assert not changed and again.outcome == "interrupted"


def test_settle_rejects_final_message_of_another_turn(store: Store) -> None:
    sid = new_session(store)
    first = settled_turn(store, sid)
    turn, _ = store.turns.claim_submit(WS, sid, "r2", "x")
    with pytest.raises(InvalidArgument):
        store.turns.settle_turn(
            WS,
            sid,
            turn.turn_id,
            outcome="completed",
            final_assistant_message_id=first.final_assistant_message_id,
        )


def test_resolve_interaction_only_when_pending(store: Store) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    opened = store.history.open_interaction(
        WS, sid, turn.turn_id, request_id="q", kind="approval", input={"cmd": "ls"}
    )
    assert opened.status == "pending"
    replay = store.history.open_interaction(
        WS, sid, turn.turn_id, request_id="q", kind="approval", input={"cmd": "ls"}
    )
    assert replay == opened
    done = store.history.resolve_interaction(WS, sid, turn.turn_id, "q", {"decision": "approve"})
    assert (done.status, done.output) == ("resolved", {"decision": "approve"})
    with pytest.raises(Conflict):
        store.history.resolve_interaction(WS, sid, turn.turn_id, "q", {"decision": "decline"})
    with pytest.raises(NotFound):
        store.history.resolve_interaction(WS, sid, turn.turn_id, "nope", {})


def test_a_delivered_answer_resolves_an_interaction_its_turns_end_superseded(
    store: Store,
) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    store.history.open_interaction(WS, sid, turn.turn_id, request_id="q", kind="approval", input={})
    store.turns.record_settlement(WS, sid, turn.turn_id, outcome="completed")
    with pytest.raises(Conflict):  # an answer nobody delivered does not rewrite the end
        store.history.resolve_interaction(WS, sid, turn.turn_id, "q", {"decision": "approve"})
    done = store.history.resolve_interaction(
        WS, sid, turn.turn_id, "q", {"decision": "approve"}, delivered=True
    )
    assert (done.status, done.output) == ("resolved", {"decision": "approve"})
    with pytest.raises(Conflict):  # answered once
        store.history.resolve_interaction(
            WS, sid, turn.turn_id, "q", {"decision": "x"}, delivered=True
        )


def test_append_message_with_same_id_updates_in_place_and_bumps_version(store: Store) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    m1 = store.history.append_message(
        WS, sid, turn.turn_id, kind="assistant", text="par", message_id="m"
    )
    m2 = store.history.append_message(
        WS, sid, turn.turn_id, kind="assistant", text="partial", payload={"k": 1}, message_id="m"
    )
    assert (m2.version, m2.position, m2.text, m2.payload) == (2, m1.position, "partial", {"k": 1})
    positions = [m.position for m in store.turns.get_turn(WS, sid, turn.turn_id).messages]
    assert positions == sorted(positions) and len(positions) == 2


def test_bind_provider_turn_refuses_rebinding_to_another_id(store: Store) -> None:
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    store.turns.bind_provider_turn(WS, sid, turn.turn_id, "p1", '{"c":1}')
    same = store.turns.bind_provider_turn(WS, sid, turn.turn_id, "p1")
    assert same.provider_turn_binding_json == '{"c":1}'
    with pytest.raises(Conflict):
        store.turns.bind_provider_turn(WS, sid, turn.turn_id, "p2")
    store.turns.record_turn_binding(WS, sid, turn.turn_id, '{"c":2}')
    assert store.turns.get_turn(WS, sid, turn.turn_id).provider_turn_binding_json == '{"c":2}'


def test_unknown_turn_is_typed_not_found(store: Store) -> None:
    sid = new_session(store)
    with pytest.raises(TurnNotFound):
        store.turns.get_turn(WS, sid, "missing")
    with pytest.raises(TurnNotFound):
        store.history.append_message(WS, sid, "missing", kind="assistant", text="x")


def test_timeline_pages_by_sequence(store: Store) -> None:
    sid = new_session(store)
    for i in range(5):
        settled_turn(store, sid, text=str(i))
    page, nxt = store.history.timeline(WS, sid, limit=2)
    assert [t.sequence for t in page] == [1, 2] and nxt == 2
    page, nxt = store.history.timeline(WS, sid, after_sequence=4, limit=2)
    assert [t.sequence for t in page] == [5] and nxt is None


def test_active_turn_is_reported_on_session_and_by_query(store: Store) -> None:
    sid = new_session(store)
    assert store.turns.active_turn(WS, sid) is None
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    assert store.sessions.get_session(WS, sid).active_turn_id == turn.turn_id
    active = store.turns.active_turn(WS, sid)
    assert active is not None and active.turn_id == turn.turn_id


def test_goal_set_and_clear_record_goal_controls(store: Store) -> None:
    sid = new_session(store)
    assert store.goals.set_goal(WS, sid, "ship it").goal == "ship it"
    assert store.goals.clear_goal(WS, sid).goal is None
    rows = store.db.connection().execute("SELECT action, status FROM goal_controls").fetchall()
    assert sorted(rows) == [("clear", "finished"), ("set", "finished")]
    control = begin_goal_control(store, WS, sid, "set", "later")
    assert store.sessions.get_session(WS, sid).goal is None
    assert finish_goal_control(store, WS, control).goal == "later"


def test_a_session_keeps_only_its_newest_finished_goal_controls(store: Store) -> None:
    """Each goal set or cleared records a control; the record does not grow without bound."""
    from storage.session_controls import KEPT_GOAL_CONTROLS

    sid, other = new_session(store), new_session(store)
    store.goals.set_goal(WS, other, "the other's")
    for n in range(KEPT_GOAL_CONTROLS + 36):
        store.goals.set_goal(WS, sid, f"goal {n}")
    control = begin_goal_control(store, WS, sid, "set", "in flight")
    store.goals.clear_goal(WS, sid)
    rows = (
        store.db.connection()
        .execute("SELECT session_id, goal, status FROM goal_controls ORDER BY created_at_ms, rowid")
        .fetchall()
    )
    mine = [(goal, status) for s, goal, status in rows if s == sid]
    finished = [goal for goal, status in mine if status == "finished"]
    assert len(finished) == KEPT_GOAL_CONTROLS
    assert finished[-2:] == [f"goal {KEPT_GOAL_CONTROLS + 35}", None]
    assert ("in flight", "active") in mine  # an active control is never pruned
    assert [(goal, status) for s, goal, status in rows if s == other] == [
        ("the other's", "finished")
    ]
    assert finish_goal_control(store, WS, control).goal == "in flight"


def test_runtime_context_is_merged_and_provider_identity_kept(store: Store) -> None:
    sid = new_session(store, provider_session_id="p-1")
    s = store.sessions.update_runtime(WS, sid, runtime_context={"extra": True})
    assert s.provider_session_id == "p-1"
    assert s.runtime_context == {
        "driverKind": "tutti-agent",
        "driverVersion": "0.0.10",
        "extra": True,
    }


def test_runtime_operation_begin_and_finish(store: Store) -> None:
    sid = new_session(store)
    op = begin_runtime_operation(store, WS, sid, "compact")
    finish_runtime_operation(store, WS, op)
    finish_runtime_operation(store, WS, op)  # idempotent
    with pytest.raises(NotFound):
        finish_runtime_operation(store, WS, "nope")


def test_events_are_delivered_after_commit_and_not_on_rollback(store: Store) -> None:
    seen: list[object] = []
    visible_at_delivery: list[bool] = []

    def listener(event: object) -> None:
        seen.append(event)
        # A fresh thread has its own connection: it sees only committed data.
        out: list[bool] = []
        t = threading.Thread(target=lambda: out.append(find_session(store, WS, "s1") is not None))
        t.start()
        t.join()
        visible_at_delivery.append(out[0])

    store.db.subscribe(listener)
    new_session(store, session_id="s1", provider_session_id=None)
    assert seen == [SessionChanged(WS, "s1")] and visible_at_delivery == [True]
    with pytest.raises(SessionIdTaken):
        new_session(store, session_id="s1", provider_session_id=None)
    assert len(seen) == 1
    turn, _ = store.turns.claim_submit(WS, "s1", "r", "x")
    assert TurnChanged(WS, "s1", turn.turn_id) in seen


def test_failing_subscriber_does_not_break_the_write(store: Store) -> None:
    def bad(event: object) -> None:
        raise RuntimeError("listener bug")

    store.db.subscribe(bad)
    new_session(store, session_id="s1")
    assert store.sessions.get_session(WS, "s1").provider_session_id == "prov-src"


def test_reopen_keeps_everything(store_path: Path) -> None:
    s = Store.open(store_path)
    sid = new_session(s)
    turn = settled_turn(s, sid)
    s.close()
    s2 = Store.open(store_path)
    assert s2.turns.get_turn(WS, sid, turn.turn_id) == turn
    s2.close()


def test_closed_store_refuses_new_connections(store_path: Path) -> None:
    s = Store.open(store_path)
    s.close()
    with pytest.raises((RuntimeError, apsw.Error)):
        s.sessions.get_session(WS, "x")


def test_a_turn_checkpoint_record_lands_with_its_settlement_and_is_read_back(
    store: Store,
) -> None:
    new_session(store, session_id="s1")
    turn, _ = store.turns.claim_submit(WS, "s1", "r1", "hi")
    assert store.turns.turn_checkpoint(WS, "s1", turn.turn_id) is None  # none taken yet
    after = {
        "cwd": "/w",
        "before": "t1",
        "after": "t2",
        "changedFiles": [{"path": "a", "kind": "added"}],
    }
    assert store.turns.record_settlement(
        WS, "s1", turn.turn_id, outcome="completed", checkpoint_json=json.dumps(after)
    )
    assert store.turns.turn_checkpoint(WS, "s1", turn.turn_id) == after
    assert store.turns.get_turn(WS, "s1", turn.turn_id).checkpoint_json == json.dumps(after)
    # A second settlement changes nothing, its record included.
    assert not store.turns.record_settlement(
        WS, "s1", turn.turn_id, outcome="failed", checkpoint_json='{"state": "unavailable"}'
    )
    assert store.turns.turn_checkpoint(WS, "s1", turn.turn_id) == after
    with pytest.raises(TurnNotFound):
        store.turns.turn_checkpoint(WS, "s1", "no-such-turn")
    with pytest.raises(SessionNotFound):
        store.turns.turn_checkpoint(WS, "nope", turn.turn_id)


def test_a_timeline_gives_each_message_its_own_payload_empty_or_not(store: Store) -> None:
    """Messages stored with an empty payload are read back without the JSON parser: each one
    still gets a mapping of its own (changing one changes no other), and a non-empty payload
    is read back whole."""
    sid = new_session(store)
    settled_turn(store, sid, extra=[("tool_call", "ls", {"name": "ls", "args": [1, "a"]})])
    settled_turn(store, sid, extra=[("reasoning", "thinking", {})])
    turns, _ = store.history.timeline(WS, sid)
    messages = [m for t in turns for m in t.messages]
    payloads = {m.text: m.payload for m in messages}
    assert payloads["ls"] == {"name": "ls", "args": [1, "a"]}
    empties = [m.payload for m in messages if m.text != "ls"]
    assert len(empties) == 5 and all(p == {} for p in empties)  # 2 users, 2 replies, 1 item
    assert len({id(p) for p in empties}) == len(empties)
