"""The store work a `turn.submit` and an
`updateTitle` do not need, cut — pinned by what runs, never by timings.

- A Session read (`get_session`: the actor's, the publisher's `session.upserted`, every
  `session.get`) finds the active Turn through `turns_active` (the partial index of the active
  Turns; `turns_by_phase` until schema v21), not by SQLite walking the
  Session's (session, sequence) index to avoid a sort, which reads every Turn it ever had.
- The settled, completed Turns with no provider binding (looked for after every runtime
  start, so once per Turn) are found through a partial index of exactly those, not by reading
  every settled Turn of the Session.
- The Session actor's Turn writes (binding, checkpoint, settlement) read nothing back, and an
  appended Message is built from what was inserted: the same rows and change events as
  a read-back, and the same Message a fresh read returns.
- The provider of a Session (fixed at create) is read once: the publisher's `turn.updated`
  and a `turn.submit` reply take it from memory, and a deleted Session is still refused by
  the reads that follow it.
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest

from agenthost.catalog import Catalog
from agenthost.publisher import EventPublisher
from domain.errors import SessionNotFound
from storage.models import ChangeEvent, SessionChanged, TurnChanged
from storage.rows import (
    HYDRATE_MESSAGES_SQL,
    INTERACTION_COLUMNS,
    MESSAGE_COLUMNS,
    SESSION_SELECT,
)
from storage.store import Store

WS = "ws-mutation"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "home" / "store.sqlite3")
    yield s
    s.close()


def _session(store: Store, provider: str = "tutti-agent") -> str:
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        WS, session_id=sid, provider=provider, title="t", cwd="/w", settings={}
    )
    return sid


def _settled(store: Store, sid: str, text: str, *, bound: bool = True) -> str:
    turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), text)
    if bound:
        store.turns.record_provider_turn(WS, sid, turn.turn_id, f"p-{turn.turn_id}")
    reply = store.history.append_message(WS, sid, turn.turn_id, kind="assistant", text="ok")
    store.turns.record_settlement(
        WS, sid, turn.turn_id, outcome="completed", final_assistant_message_id=reply.message_id
    )
    return turn.turn_id


def _plan(store: Store, sql: str, params: tuple[Any, ...]) -> list[str]:
    conn = store.db.connection()
    try:
        return [str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    finally:
        store.db.release_thread_connection()


@contextmanager
def _writer_statements(store: Store) -> Iterator[list[str]]:
    """Every statement the store's one writer connection runs inside the block."""
    seen: list[str] = []

    def trace(event: dict[str, Any]) -> None:
        if event.get("code") == apsw.SQLITE_TRACE_STMT:
            seen.append(" ".join(str(event["sql"]).split()))

    conn = store.db._writer_connection()
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    try:
        yield seen
    finally:
        conn.trace_v2(0, None)


def test_a_session_read_looks_its_active_turn_up_by_phase(store: Store) -> None:
    sid = _session(store)
    for i in range(3):
        _settled(store, sid, f"turn {i}")
    active, _ = store.turns.claim_submit(WS, sid, "r-active", "now")
    where = " WHERE s.workspace_id = ? AND s.session_id = ?"
    plan = _plan(store, SESSION_SELECT + where, (WS, sid))
    turn_steps = [step for step in plan if step.startswith("SEARCH t ")]
    assert turn_steps and all("turns_active" in step for step in turn_steps), plan
    # And it is still the active Turn, before and after it settles.
    assert store.sessions.get_session(WS, sid).active_turn_id == active.turn_id
    store.turns.record_settlement(WS, sid, active.turn_id, outcome="interrupted")
    assert store.sessions.get_session(WS, sid).active_turn_id is None


def test_a_timeline_page_looks_its_messages_up_by_turn(store: Store) -> None:
    """A page of Turns reads each Turn's Messages through `messages_by_turn`, not by walking
    the Session's position key over its whole history; each Turn's Messages stay in order."""
    sid = _session(store)
    for i in range(30):
        turn = _settled(store, sid, f"turn {i}")
        store.history.append_message(WS, sid, turn, kind="reasoning", text=f"after {i}")
    page, more = store.history.timeline(WS, sid, limit=20)
    assert more == page[-1].sequence and len(page) == 20
    for turn in page:
        positions = [m.position for m in turn.messages]
        assert positions == sorted(positions) and len(positions) == 3, turn
        assert [m.kind for m in turn.messages] == ["user", "assistant", "reasoning"]
    ids = tuple(t.turn_id for t in page)
    sql = HYDRATE_MESSAGES_SQL.format(marks=",".join("?" * len(ids)))
    plan = _plan(store, sql, (WS, sid, *ids))
    assert any("messages_by_turn" in step for step in plan), plan
    assert not any("autoindex_messages" in step for step in plan), plan


def test_turns_missing_a_binding_are_found_through_their_own_index(store: Store) -> None:
    sid = _session(store)
    bound = [_settled(store, sid, f"bound {i}") for i in range(3)]
    unbound = [_settled(store, sid, f"unbound {i}", bound=False) for i in range(2)]
    failed, _ = store.turns.claim_submit(WS, sid, "r-failed", "x")
    store.turns.record_settlement(WS, sid, failed.turn_id, outcome="failed", error="e")
    active, _ = store.turns.claim_submit(WS, sid, "r-active", "y")
    assert store.turns.turns_missing_binding(WS, sid) == unbound
    store.turns.record_provider_turn(WS, sid, unbound[0], "p-late")
    assert store.turns.turns_missing_binding(WS, sid) == unbound[1:]
    assert bound and active
    sql = (
        "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
        " AND phase = 'settled' AND outcome = 'completed' AND root_provider_turn_id IS NULL"
        " ORDER BY sequence"
    )
    plan = _plan(store, sql, (WS, sid))
    assert any("turns_unbound" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


def test_the_actors_turn_writes_read_nothing_back(store: Store) -> None:
    sid = _session(store)
    events: list[ChangeEvent] = []
    store.db.subscribe(events.append)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "hello")
    events.clear()
    with _writer_statements(store) as statements:
        store.turns.record_provider_turn(WS, sid, turn.turn_id, "p-1", '{"c":1}')
        with store.db.write_batch():
            message = store.history.append_message(
                WS, sid, turn.turn_id, kind="assistant", text="hi", payload={"k": [1, "é"]}
            )
            store.turns.record_turn_binding(WS, sid, turn.turn_id, '{"c":2}')
            changed = store.turns.record_settlement(
                WS, sid, turn.turn_id, outcome="completed",
                final_assistant_message_id=message.message_id,
            )  # fmt: skip
    read_backs = [
        s for s in statements if s.startswith(f"SELECT {MESSAGE_COLUMNS}")
        or s.startswith(f"SELECT {INTERACTION_COLUMNS}")
    ]  # fmt: skip
    assert read_backs == [], read_backs
    assert changed is True
    assert store.turns.record_settlement(WS, sid, turn.turn_id, outcome="failed") is False
    # The same change events as the reading writes gave (one TurnChanged per write, the
    # settle's Session touch), in commit order.
    assert events == [
        TurnChanged(WS, sid, turn.turn_id),
        TurnChanged(WS, sid, turn.turn_id),
        SessionChanged(WS, sid),
    ]
    fresh = store.turns.get_turn(WS, sid, turn.turn_id)
    assert fresh.phase == "settled" and fresh.outcome == "completed"
    assert fresh.root_provider_turn_id == "p-1"
    assert fresh.provider_turn_binding_json == '{"c":2}'
    assert fresh.final_assistant_message_id == message.message_id
    # The Message built from the insert is the one a fresh read returns, field for field.
    assert fresh.messages[-1] == message


def test_a_sessions_provider_is_read_once_and_a_deleted_session_is_still_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = _session(store, provider="codex")
    other = _session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    store.turns.record_settlement(WS, sid, turn.turn_id, outcome="interrupted")
    with pytest.raises(SessionNotFound):
        store.sessions.provider_of(WS, "no-such-session")
    assert store.sessions.provider_of(WS, sid) == "codex"
    publisher = EventPublisher(store, Catalog(), queue.SimpleQueue())
    event = publisher.project(TurnChanged(WS, sid, turn.turn_id))
    assert event is not None and event["turn"]["turnId"] == turn.turn_id

    def no_read(*_: Any) -> Any:
        raise AssertionError("the provider was read again")

    monkeypatch.setattr(store.sessions, "_one", no_read)
    assert store.sessions.provider_of(WS, sid) == "codex"
    assert publisher.project(TurnChanged(WS, sid, turn.turn_id)) is not None
    monkeypatch.undo()
    assert store.sessions.provider_of(WS, other) == "tutti-agent"
    # Deleted: the provider is still known (it never changes), but the reads that follow it
    # refuse the Session as before — no `turn.updated` is built for it, no timeline served.
    store.sessions.delete_session(WS, sid)
    assert store.sessions.provider_of(WS, sid) == "codex"
    with pytest.raises(SessionNotFound):
        publisher.project(TurnChanged(WS, sid, turn.turn_id))
    with pytest.raises(SessionNotFound):
        store.history.timeline(WS, sid)


def test_a_live_session_is_routed_from_memory_until_its_delete_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`session.pin`, `turn.submit` and the other plain mutations check the Session exists
    before routing it to its actor; once found live it is remembered, and its delete takes it
    out of that memory before the delete is answered: the next mutation reads the store
    again and is refused 404 (a stale memory would route it unread)."""
    from tests.support.in_process import in_process_daemon
    from transport.client import ApiError

    with in_process_daemon(tmp_path / "home") as (daemon, client):
        assert daemon.api is not None
        api = daemon.api.plumbing
        checks: list[tuple[str, str]] = []
        real = api._view.session_exists

        def counted(ws: str, sid: str) -> bool:
            checks.append((ws, sid))
            return real(ws, sid)

        monkeypatch.setattr(api._view, "session_exists", counted)
        sid = client.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})[
            "session"
        ]["agentSessionId"]
        title = {"workspaceId": WS, "agentSessionId": sid}
        # (A rename goes straight to the store, `agenthost.api_base.SessionLanes`: not routed.)
        client.call("session.pin", {**title, "pinned": True})
        assert checks == [(WS, sid)] and (WS, sid) in api.live_sessions
        client.call("session.pin", {**title, "pinned": False})
        client.call("session.pin", {**title, "pinned": True})
        assert checks == [(WS, sid)]  # routed from memory
        assert client.call("session.get", title)["session"]["pinned"] is True
        client.call("session.delete", title)
        assert (WS, sid) not in api.live_sessions
        with pytest.raises(ApiError) as refused:
            client.call("session.pin", {**title, "pinned": False})
        assert refused.value.status == 404
        assert refused.value.reason == "workspace_agent_session_not_found"
        assert checks == [(WS, sid), (WS, sid)]  # read again after the delete
        # A never-seen id is read (and refused) every time, never remembered.
        ghost = {"workspaceId": WS, "agentSessionId": str(uuid.uuid4()), "pinned": True}
        for _ in range(2):
            with pytest.raises(ApiError):
                client.call("session.pin", ghost)
        assert len(checks) == 4 and (WS, ghost["agentSessionId"]) not in api.live_sessions


def test_a_read_snapshot_holds_one_state_for_every_read_inside_it(store: Store) -> None:
    """The events publisher projects a batch inside `Store.read_snapshot`: every read of the
    thread in it (nested snapshot reads included) sees one state, the one committed when it
    began; a write committed by another thread meanwhile is seen after it."""
    import threading

    sid = _session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "r", "x")
    with store.db.read_snapshot():
        before = store.sessions.get_session(WS, sid).title
        writer = threading.Thread(target=lambda: store.sessions.update_title(WS, sid, "renamed"))
        writer.start()
        writer.join()
        assert store.sessions.get_session(WS, sid).title == before == "t"
        tail = store.history.turn_since(WS, sid, turn.turn_id, None)  # its own `_read`, nested
        assert tail.turn.phase == "active"
        with store.db.read_snapshot():  # a snapshot inside a snapshot is the same one
            assert store.sessions.get_session(WS, sid).title == "t"
    assert store.sessions.get_session(WS, sid).title == "renamed"
