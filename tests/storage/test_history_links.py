"""A fork child reads its cloned Messages from its source's rows through a history link: every
read equals what a copy of the boundary returned (rule v2 ids, the child's Turns, rewritten
payloads), through chains of forks, a deleted source and later changes of the source; a linked
row is frozen by the store; an old store migrates."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn

from agenthost import projection
from agenthost.api import timeline_result
from agenthost.catalog import Catalog
from storage import rows as rows_module
from storage.fork_child import OrdinalPrefixes, ordinal_id
from storage.fork_snapshot import decode_frozen
from storage.history_links import history_link, visible_rows
from storage.models import ForkOperation, ForkPrepareRequest, Message, ProviderForkEvidence, Turn
from storage.rows import message_from_row, turn_from_row
from storage.schema import SCHEMA_VERSION, migrate, user_version
from storage.sqlite import dumps
from storage.store import Store
from tests.support.invariants import history_copy_problem, history_link_problem
from tests.support.store_reads import drop_history_link_schema

History = list[tuple[str, int, tuple[tuple[Any, ...], ...]]]
"""A Session's Turns as read: (Turn id, sequence, its Messages' columns) in order."""


def _fork(store: Store, sid: str, turn_id: str) -> tuple[ForkOperation, str]:
    target = str(uuid.uuid4())
    op, _ = store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id=f"req-{uuid.uuid4()}",
            target_session_id=target,
            turn_id=turn_id,
            driver_kind="tutti-agent",
            driver_version="0.0.10",
            binding_mode="host_copy",
            runtime_identity={},
        ),
    )
    store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(
        WS,
        op.operation_id,
        ProviderForkEvidence(
            child_provider_session_id=f"child-{op.operation_id}",
            provider_turn_ids=op.source_provider_turn_ids,
            binding_mode=op.binding_mode,
            receipt={"forkedFromId": op.source_provider_session_id, "sha256": "ab"},
            turn_bindings=None,
        ),
    )
    committed, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed
    store.fork_transitions.acknowledge_fork(WS, op.operation_id)
    return committed, target


def _columns(m: Message) -> tuple[Any, ...]:
    return (m.message_id, m.turn_id, m.kind, m.text, m.payload, m.version, m.position)


def _history(turns: list[Turn]) -> History:
    return [(t.turn_id, t.sequence, tuple(_columns(m) for m in t.messages)) for t in turns]


def _read(store: Store, sid: str) -> History:
    turns = store.history.timeline(WS, sid, limit=1000)[0]
    # `session.timeline`'s page (the Messages as rows) holds the very same Turns and Messages.
    page = store.history.timeline_page(WS, sid, limit=1000)
    assert turns == [
        turn_from_row(
            r, [message_from_row(m) for m in page.message_rows[r[2]]], page.interactions[r[2]]
        )
        for r in page.turn_rows
    ]
    return _history(turns)


def _copied(source: History, through: int, op: ForkOperation, target: str) -> History:
    """What the copy of the boundary wrote: the source's Turns 1..through, every Message with
    rule v2's ids (no payload here holds a reference: none is rewritten)."""
    p = OrdinalPrefixes.of(op.operation_id, WS, op.source_session_id, target)
    out: History = []
    for _, sequence, messages in source:
        if sequence > through:
            break
        turn = ordinal_id(p.turn, sequence)
        out.append(
            (
                turn,
                sequence,
                tuple((ordinal_id(p.message, m[6]), turn, *m[2:]) for m in messages),
            )
        )
    return out


def _turns(store: Store, sid: str, rng: random.Random, n: int) -> None:
    for i in range(n):
        extra = [
            (
                rng.choice(["reasoning", "tool_call", "notice"]),
                rng.choice(["", "é\nx", "plain", "a" * rng.randint(0, 50)]),
                rng.choice([{}, {}, {"k": rng.randint(0, 9)}]),
            )
            for _ in range(rng.randint(0, 3))
        ]
        turn = settled_turn(store, sid, text=f"turn {i} {rng.random()}", extra=extra)
        if rng.random() < 0.3:  # a streamed Message updated in place after its Turn settled
            m = turn.messages[-1]
            store.history.append_message(
                WS,
                sid,
                turn.turn_id,
                kind=m.kind,
                text=f"{m.text} (edited)",
                message_id=m.message_id,
            )


@pytest.mark.parametrize("seed", range(6))
def test_a_linked_childs_reads_equal_the_copy_through_chains_changes_and_deletes(
    store: Store, seed: int
) -> None:
    """Random histories forked into chains (a fork of a fork of a fork): each child reads
    exactly what the copy of its boundary returned at its commit, also after its source and
    its source's source go on, change the very rows it links, and are deleted."""
    rng = random.Random(seed)
    root = new_session(store)
    _turns(store, root, rng, rng.randint(1, 5))
    expected: dict[str, History] = {}
    sessions = [root]
    for _ in range(3):
        source = rng.choice(sessions)
        history = _read(store, source)
        through = rng.randint(1, len(history))
        op, child = _fork(store, source, history[through - 1][0])
        assert history_link(store.db.connection(), WS, child) is not None
        expected[child] = _copied(history, through, op, child)
        assert _read(store, child) == expected[child]
        sessions.append(child)
        # The child goes on, and may change a Message it reads through its link.
        _turns(store, child, rng, rng.randint(0, 2))
        own = _read(store, child)
        expected[child] = own
        if rng.random() < 0.5:
            turn_id, _, messages = own[0]
            m = messages[-1]
            store.history.append_message(
                WS, child, turn_id, kind=m[2], text="changed in the child", message_id=m[0]
            )
            expected[child] = _read(store, child)
            changed = expected[child][0][2][-1]
            assert (changed[0], changed[3], changed[5]) == (m[0], "changed in the child", m[5] + 1)
        # The source changes a linked row: its children keep what they read.
        src_history = _read(store, source)
        turn_id, _, messages = src_history[0]
        m = messages[0]
        store.history.append_message(
            WS, source, turn_id, kind=m[2], text=f"source edit {rng.random()}", message_id=m[0]
        )
        if source in expected:  # the source's own change: it shows it
            expected[source] = _read(store, source)
        for sid, history in expected.items():
            assert _read(store, sid) == history, sid
    for sid in sessions[:-1]:
        if rng.random() < 0.6:
            store.sessions.delete_session(WS, sid)
    for sid, history in expected.items():
        if (WS, sid) in set(store.sessions.deleted_sessions()):
            continue
        assert _read(store, sid) == history, sid
        assert store.history.turn_since(WS, sid, history[0][0], None).turn.messages == tuple(
            Message(*m) for m in history[0][2]
        )
    _laws_hold(store)


def _laws_hold(store: Store) -> None:
    """The invariant checker's laws of a child's history, over every committed fork."""
    conn = store.db.connection()
    rows = conn.execute(
        "SELECT o.operation_id, o.source_session_id, o.target_session_id, s.snapshot_json"
        " FROM fork_operations o JOIN fork_snapshots s USING (op_seq)"
        " WHERE o.status = 'committed'"
    ).fetchall()
    assert rows
    for op_id, source, target, raw in rows:
        names = {"operation_id": op_id, "source_session_id": source, "target_session_id": target}
        document = decode_frozen(raw)
        assert history_copy_problem(conn, WS, names, document) is None, op_id
        assert history_link_problem(conn, WS, names, document) is None, op_id


def test_a_fork_of_a_fork_of_a_fork_reads_the_root_rows_with_its_own_ids(store: Store) -> None:
    root = new_session(store)
    for i in range(3):
        settled_turn(store, root, text=f"t{i}", extra=[("reasoning", f"r{i}", {"n": i})])
    chain = [root]
    ops: list[ForkOperation] = []
    for _ in range(3):
        last = _read(store, chain[-1])[-1][0]
        op, child = _fork(store, chain[-1], last)
        chain.append(child)
        ops.append(op)
    conn = store.db.connection()
    link = history_link(conn, WS, chain[-1])
    assert link is not None
    assert [level.session_id for level in link.levels] == chain[-2::-1]
    # Nothing copied: no child holds a Message row of its cloned Turns.
    for child in chain[1:]:
        rows = conn.execute(
            "SELECT COUNT(*) FROM messages WHERE workspace_id = ? AND session_id = ?", (WS, child)
        ).fetchone()
        assert rows == (0,)
    root_rows = visible_rows(conn, WS, root, 3)
    last_rows = visible_rows(conn, WS, chain[-1], 3)
    p = OrdinalPrefixes.of(ops[-1].operation_id, WS, chain[-2], chain[-1])
    assert [r[2:] for r in last_rows] == [r[2:] for r in root_rows]
    assert [r[0] for r in last_rows] == [ordinal_id(p.message, r[6]) for r in root_rows]
    assert [r[1] for r in last_rows] == [ordinal_id(p.turn, r[7]) for r in root_rows]
    # The newest child's Turns name their final Message among the rows it reads.
    for turn in store.history.timeline(WS, chain[-1])[0]:
        assert turn.final_assistant_message_id == turn.messages[-1].message_id


def test_a_deleted_source_leaves_its_childs_history_whole(store: Store) -> None:
    root = new_session(store)
    turns = [settled_turn(store, root, text=f"t{i}") for i in range(3)]
    before = _read(store, root)
    op, child = _fork(store, root, turns[-1].turn_id)
    read = _read(store, child)
    store.sessions.delete_session(WS, root)
    assert _read(store, child) == read == _copied(before, 3, op, child)
    # And the child can still be forked (its rows read through the deleted source's).
    _, grandchild = _fork(store, child, read[-1][0])
    assert [len(t[2]) for t in _read(store, grandchild)] == [len(t[2]) for t in read]
    _laws_hold(store)


def test_the_store_refuses_to_change_or_remove_a_linked_row(store: Store) -> None:
    """The guard of schema v11: a row a child reads may change only once the child holds its
    own row at that position (the store writes it first); any other write is refused."""
    root = new_session(store)
    turn = settled_turn(store, root, text="hello")
    _, child = _fork(store, root, turn.turn_id)
    conn = store.db.connection()
    with pytest.raises(apsw.ConstraintError, match="frozen"):
        conn.execute("UPDATE messages SET text = 'x' WHERE session_id = ?", (root,))
    with pytest.raises(apsw.ConstraintError, match="kept"):
        conn.execute("DELETE FROM messages WHERE session_id = ?", (root,))
    # Through the store, the child first gets the row as it reads it, then the source changes.
    reply = turn.messages[-1]
    read = _read(store, child)
    store.history.append_message(
        WS, root, turn.turn_id, kind="assistant", text="later", message_id=reply.message_id
    )
    assert _read(store, child) == read
    assert _read(store, root)[0][2][-1][3] == "later"
    own = conn.execute(
        "SELECT text, version FROM messages WHERE session_id = ? AND position = ?",
        (child, reply.position),
    ).fetchall()
    assert own == [(reply.text, reply.version)]


def test_a_new_message_of_a_linked_child_comes_after_every_linked_one(store: Store) -> None:
    root = new_session(store)
    turn = settled_turn(store, root, text="hello")
    _, child = _fork(store, root, turn.turn_id)
    top = max(m.position for m in turn.messages)
    nxt = settled_turn(store, child, text="next")
    assert min(m.position for m in nxt.messages) == top + 1


def test_an_old_store_migrates_and_its_copied_children_stay_as_they_are(tmp_path: Path) -> None:
    """A store of the previous schema whose child holds copied rows: the migration adds the
    link table and its guard, the copied child reads its own rows as before (no link), and a
    fork made after the migration links."""
    path = tmp_path / "old.sqlite3"
    store = Store.open(path)
    root = new_session(store)
    turn = settled_turn(store, root, text="hello", extra=[("reasoning", "why", {"k": 1})])
    op, child = _fork(store, root, turn.turn_id)
    linked = _read(store, child)
    store.close()
    # Make it the store the previous schema left: the child's rows copied, no link, v10.
    conn = apsw.Connection(str(path))
    for m in linked[0][2]:
        conn.execute(
            "INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
            " payload_json, version, position, created_at_ms, session_key)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0,"
            " (SELECT session_key FROM session_keys WHERE session_id = ?))",
            (WS, child, m[0], m[1], m[2], m[3], dumps(m[4]), m[5], m[6], child),
        )
    drop_history_link_schema(conn)
    conn.execute("PRAGMA user_version = 11")
    conn.close()
    old = apsw.Connection(str(path))
    assert migrate(old) == 11 and user_version(old) == SCHEMA_VERSION
    old.close()
    store = Store.open(path)
    try:
        assert history_link(store.db.connection(), WS, child) is None
        assert _read(store, child) == linked
        _, again = _fork(store, root, turn.turn_id)
        assert history_link(store.db.connection(), WS, again) is not None
        assert [t[2][0][2:] for t in _read(store, again)] == [t[2][0][2:] for t in linked]
    finally:
        store.close()


def _counting_init(built: list[object]) -> Any:
    """`Turn.__init__` that records each Turn built."""
    init = Turn.__init__

    def counting(self: Turn, *args: Any, **kwargs: Any) -> None:
        built.append(args)
        init(self, *args, **kwargs)

    return counting


def test_the_timelines_wire_page_is_the_projection_of_its_turns_without_a_message_value(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`session.timeline`'s result (`agenthost.api.timeline_result`) is, field for field, the
    projection of `timeline`'s Turns — on a root with payloads and updated Messages and on
    a linked child that changed a linked row, page by page — and builds no `Message` value:
    its Messages go from their rows to the wire, and no `Turn` value either: each Turn goes
    from its row to the wire."""
    rng = random.Random(7)
    root = new_session(store)
    _turns(store, root, rng, 6)
    history = _read(store, root)
    _, child = _fork(store, root, history[3][0])
    _turns(store, child, rng, 2)
    turn_id, _, messages = _read(store, child)[1]
    store.history.append_message(
        WS, child, turn_id, kind=messages[0][2], text="own", message_id=messages[0][0]
    )
    catalog = Catalog()
    for sid in (root, child):
        provider = store.sessions.provider_of(WS, sid)
        for after, limit in ((0, 1000), (0, 2), (2, 3), (5, 1)):
            turns, next_sequence = store.history.timeline(
                WS, sid, after_sequence=after, limit=limit
            )
            expected = {
                "turns": [projection.turn(t, provider, catalog) for t in turns],
                "nextSequence": next_sequence,
            }
            built: list[object] = []
            counted = rows_module.message_from_row

            def counting(r: Any, counted: Any = counted, built: list[object] = built) -> Message:
                built.append(r)
                return counted(r)  # type: ignore[no-any-return]

            monkeypatch.setattr(rows_module, "message_from_row", counting)
            turns_built: list[object] = []
            monkeypatch.setattr(Turn, "__init__", _counting_init(turns_built))
            try:
                got = timeline_result(store, catalog, WS, sid, after, limit)
            finally:
                monkeypatch.setattr(rows_module, "message_from_row", counted)
                monkeypatch.undo()
            assert got == expected, (sid, after, limit)
            assert any(t["messages"] for t in got["turns"])
            assert built == [], "a Message value was built for the wire page"
            assert turns_built == [], "a Turn value was built for the wire page"
