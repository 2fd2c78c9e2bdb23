"""The statements a short Turn's writes run inside the writer's baton: a submit's claim reads
what it needs in one statement (the Session live, a claim of the request, the active Turn, the
next sequence and position), and a settlement handed its Turn's image learns from it that the
final Message is the Turn's and that no Interaction is pending, without a statement each; both
still refuse what they refused (a deleted Session, a second active Turn, a final Message of
another Turn)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import fields, replace
from types import FrameType

import apsw
import pytest
from store_builders import (
    TRANSACTION_STATEMENTS,
    WS,
    bare_operation,
    new_session,
    writer_statements,
)

from actors.session_turns import turn_bound, turn_with_message
from domain.errors import (
    ForkInProgress,
    InvalidArgument,
    SessionBusy,
    SessionNotFound,
    TurnNotFound,
)
from storage.models import Message, NewMessage, Turn
from storage.store import Store

pytestmark = pytest.mark.timeout(30)


def _statements(store: Store) -> AbstractContextManager[list[str]]:
    """The statements the writer connection runs inside the block, but the transaction's own
    (BEGIN, COMMIT, savepoints)."""
    return writer_statements(store, skip=TRANSACTION_STATEMENTS)


def _selects(ran: list[str]) -> int:
    return sum(1 for s in ran if s.startswith("SELECT"))


def test_a_claim_reads_what_it_needs_in_one_statement(store: Store) -> None:
    """One read and the fence's check (law 3, its own statement: folded into the read it cost
    more CPU than it saved, docs/performance.md, baton), then its three inserts and the
    Session's touch; a store reading each fact apart runs five reads and the check."""
    sid = new_session(store)
    store.db._writer_connection()
    with _statements(store) as ran:
        turn, created = store.turns.claim_submit(WS, sid, "req-1", "hello")
    assert created
    assert _selects(ran) == 2, ran  # the claim's read, the fence
    assert len(ran) == 6, ran  # + the Turn, its user Message, the claim, the touch
    assert store.turns.get_turn(WS, sid, turn.turn_id) == turn

    # What it refused, it still refuses; a replay still answers the claimed Turn.
    assert store.turns.claim_submit(WS, sid, "req-1", "hello") == (turn, False)
    with pytest.raises(SessionBusy):
        store.turns.claim_submit(WS, sid, "req-2", "again")
    store.turns.record_settlement(WS, sid, turn.turn_id, outcome="completed")
    second, _ = store.turns.claim_submit(WS, sid, "req-2", "again")
    assert (second.sequence, second.messages[0].position) == (2, 2)
    with pytest.raises(SessionNotFound):
        store.turns.claim_submit(WS, "no-such-session", "req-3", "x")
    store.turns.record_settlement(WS, sid, second.turn_id, outcome="completed")
    # Fenced: a new claim is refused, a replay still answered (a read).
    fenced = new_session(store)
    replayed, _ = store.turns.claim_submit(WS, fenced, "req-f", "before")
    store.turns.record_settlement(WS, fenced, replayed.turn_id, outcome="completed")
    _fence(store, fenced)
    with pytest.raises(ForkInProgress) as refused:
        store.turns.claim_submit(WS, fenced, "req-g", "during")
    assert refused.value.params["operationId"] == "op-1"
    assert store.turns.claim_submit(WS, fenced, "req-f", "before")[0].turn_id == (replayed.turn_id)
    store.sessions.delete_session(WS, sid)
    with pytest.raises(SessionNotFound):
        store.turns.claim_submit(WS, sid, "req-4", "gone")


def test_a_settlement_handed_its_turn_reads_neither_its_final_message_nor_interactions(
    store: Store,
) -> None:
    """Handed its image (the Turn as the store holds it: its Messages named, no Interaction),
    the settlement neither looks the final Message up nor supersedes pending Interactions by
    statement; not handed one, it does both. A final Message the image does not name (another
    Turn's) is still looked up, and refused."""
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
    reply = store.history.append_message(
        WS, sid, turn.turn_id, kind="assistant", text="the reply", payload={}
    )
    image = store.turns.get_turn(WS, sid, turn.turn_id)
    with _statements(store) as ran:
        assert store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id, turn=image,
        )  # fmt: skip
    assert not any("FROM messages" in s or "UPDATE interactions" in s for s in ran), ran
    assert store.turns.get_turn(WS, sid, turn.turn_id).final_assistant_message_id == (
        reply.message_id
    )

    other, _ = store.turns.claim_submit(WS, sid, "req-2", "again")
    mine = store.history.append_message(
        WS, sid, other.turn_id, kind="assistant", text="mine", payload={}
    )
    image = store.turns.get_turn(WS, sid, other.turn_id)
    with pytest.raises(InvalidArgument):
        store.turns.record_settlement(
            WS, sid, other.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id, turn=image,
        )  # fmt: skip
    with _statements(store) as ran:
        store.turns.record_settlement(
            WS, sid, other.turn_id, outcome="completed",
            final_assistant_message_id=mine.message_id,
        )  # fmt: skip
    assert any("FROM messages" in s for s in ran) and any("UPDATE interactions" in s for s in ran)


def test_a_settlement_handed_its_reply_inserts_it_in_its_own_write(store: Store) -> None:
    """Handed its Turn's reply (`messages`), the settlement inserts it after its own three
    reads and before its `UPDATE`: one position read and the insert, where the reply's lone
    append ran the fence, the liveness, the Turn's row, the position and the insert in a
    write of its own (a savepoint in the Turn's batch). Eight statements for the two, not
    eleven."""
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
    image = store.turns.get_turn(WS, sid, turn.turn_id)
    reply = NewMessage(str(uuid.uuid4()), "assistant", "the reply", {})
    with _statements(store) as ran:
        assert store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id, turn=image, messages=(reply,),
        )  # fmt: skip
    assert [s.split(" ", 2)[:2] for s in ran] == [
        ["SELECT", "deleted"],  # the Session live
        ["SELECT", "workspace_id,"],  # the Turn's row
        ["SELECT", "operation_id"],  # the fence (law 3)
        ["SELECT", "(SELECT"],  # the next position
        ["INSERT", "INTO"],  # the reply
        ["UPDATE", "turns"],
        ["UPDATE", "submit_claims"],
        ["UPDATE", "sessions"],
    ], ran
    settled = store.turns.get_turn(WS, sid, turn.turn_id)
    assert [m.message_id for m in settled.messages] == [
        turn.messages[0].message_id,
        reply.message_id,
    ]
    assert settled.final_assistant_message_id == reply.message_id


def _fence(store: Store, sid: str) -> None:
    """An active fork operation of `sid` (its fence held), written beside the store."""
    conn = apsw.Connection(store.path)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")  # the operation row alone, no child
        bare_operation(conn, 1, "prepared", ws=WS, source=sid)
    finally:
        conn.close()


def test_a_settlement_refuses_in_order_and_a_settled_turn_is_not_fenced(store: Store) -> None:
    """The Session live, the Turn's row, the fence (law 3: inside the settlement's own
    transaction), each its own statement, refused in that order; a Turn already settled is
    answered `False`, not refused by a fence."""
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
    image = store.turns.get_turn(WS, sid, turn.turn_id)
    assert store.turns.record_settlement(WS, sid, turn.turn_id, outcome="completed", turn=image)
    assert store.turns.get_turn(WS, sid, turn.turn_id).phase == "settled"

    with pytest.raises(SessionNotFound):
        store.turns.record_settlement(WS, "no-such-session", turn.turn_id, outcome="completed")
    with pytest.raises(TurnNotFound):
        store.turns.record_settlement(WS, sid, "no-such-turn", outcome="completed")
    second, _ = store.turns.claim_submit(WS, sid, "req-2", "again")
    _fence(store, sid)
    with pytest.raises(ForkInProgress) as refused:
        store.turns.record_settlement(WS, sid, second.turn_id, outcome="completed")
    assert refused.value.params["operationId"] == "op-1"
    assert store.turns.get_turn(WS, sid, second.turn_id).phase == "active"
    # Settled already: answered `False` as before, the fence not in its way.
    assert store.turns.record_settlement(WS, sid, turn.turn_id, outcome="completed") is False


def _python_calls(fn: Callable[[], object]) -> dict[str, int]:
    """Python functions `fn` called, by name (`sys.setprofile` on this thread: the store runs a
    writer alone's body on its caller's thread, inside the writer's baton)."""
    calls: dict[str, int] = {}

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            name = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
            calls[name] = calls.get(name, 0) + 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_a_carried_settlement_builds_its_turn_without_dataclasses_replace(store: Store) -> None:
    """The settled Turn its event carries is built field by field, not by `replace` (whose walk
    of the fields ran inside the writer's baton), and equals a fresh read."""
    sid = new_session(store)
    turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
    image = store.turns.get_turn(WS, sid, turn.turn_id)
    carried: list[object] = []
    store.db.subscribe(lambda e: carried.append(getattr(e, "row", None)))
    calls = _python_calls(
        lambda: store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed", turn=image, checkpoint_json='{"a":1}'
        )
    )
    assert "dataclasses.py:replace" not in calls, calls
    assert store.turns.get_turn(WS, sid, turn.turn_id) in carried


def test_turn_with_message_is_replace_with_the_message_appended() -> None:
    """Every field of `Turn` set to a value of its own: `turn_with_message` keeps them all (a
    field added to `Turn` and not to it fails here)."""
    values: dict[str, object] = {}
    for i, f in enumerate(fields(Turn)):
        values[f.name] = (
            (Message(f"m{i}", "t", "user", "x", {}, 1, i),) if f.name == "messages" else f"v{i}"
        )
    turn = Turn(**values)  # type: ignore[arg-type]
    message = Message("new", "t", "assistant", "y", {}, 1, 99)
    assert turn_with_message(turn, message) == replace(turn, messages=(*turn.messages, message))


def test_turn_bound_is_replace_with_what_the_binding_wrote() -> None:
    """Every field of `Turn` set to a value of its own: `turn_bound` keeps them all but the
    provider turn id and the binding JSON it is given (None keeps each)."""
    values: dict[str, object] = {f.name: f"v{i}" for i, f in enumerate(fields(Turn))}
    values["messages"] = ()
    turn = Turn(**values)  # type: ignore[arg-type]
    assert turn_bound(turn, "p", None) == replace(turn, root_provider_turn_id="p")
    assert turn_bound(turn, None, "{}") == replace(turn, provider_turn_binding_json="{}")
    assert turn_bound(turn, "p", "{}") == replace(
        turn, root_provider_turn_id="p", provider_turn_binding_json="{}"
    )
    assert turn_bound(turn, None, None) == turn
