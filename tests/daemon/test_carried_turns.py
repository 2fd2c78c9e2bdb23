"""Turn changes that carry the Turn their write left: a submit's claim emits the whole Turn as
committed, and the events thread publishes its `turn.updated` from it without reading the Turn
back — never when something newer of that Turn may already have been shown (an older write's
event delivered after a newer one's, after a read-back), after its Session's removal was
published, or when a change of its workspace went unpublished (docs/design/store.md, "Change
events that carry their row")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost import projection
from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher
from storage.models import ChangeEvent, NewMessage, TurnBound, TurnChanged
from storage.store import Store
from tests.support.carried import (
    Heard,
    Sink,
    a_turn,
    hear_settled,
    new_session,
    read_counting_publisher,
)
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(60)

WS = "ws-carried-turns"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home") as running:
        yield running


def _session(client: Client) -> str:
    return new_session(client, WS)


def _publisher(daemon: Daemon, sink: Sink) -> tuple[EventPublisher, list[str]]:
    """A publisher of its own on the daemon's store, counting its Turn read-backs."""
    return read_counting_publisher(
        daemon, sink, lambda change: change.turn_id if isinstance(change, TurnChanged) else None
    )


def _turn_events(sink: Sink) -> list[dict[str, Any]]:
    return [e["turn"] for e in sink.events if e["type"] == "turn.updated"]


_NO_CHECKPOINT = '{"state":"unavailable","reason":"disabled"}'


def _a_turn(store: Store, sid: str) -> tuple[list[ChangeEvent], list[ChangeEvent], str]:
    return a_turn(store, WS, sid, checkpoint_json=_NO_CHECKPOINT)


def _turn_change(changes: list[ChangeEvent]) -> TurnChanged:
    (change,) = [c for c in changes if isinstance(c, TurnChanged)]
    return change


def test_a_claim_carries_the_turn_it_committed(
    running: tuple[Daemon, Client],
) -> None:
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
        at_claim = store.turns.get_turn(WS, sid, turn.turn_id)
        claim = _turn_change(heard.take())
    finally:
        heard.close()
    assert claim.row == at_claim and claim.row is not None and claim.row.phase == "active"
    assert 0 < claim.seq <= store.db.write_seq
    # Not part of the change's identity: the same change, whatever it carries.
    assert claim == TurnChanged(WS, sid, turn.turn_id)

    # A settlement not handed its Turn carries none (nothing is read inside the writer's
    # baton, `test_mutation_reads`): its event is read back.
    store.turns.record_settlement(WS, sid, turn.turn_id, outcome="interrupted")
    _, settlement, _ = _a_turn(store, sid)
    assert _turn_change(settlement).row is None


def test_a_settlement_handed_its_turn_carries_the_turn_it_committed(
    running: tuple[Daemon, Client],
) -> None:
    """The Session actor hands its settlement the Turn as the store holds it (the claim's
    row with its writes applied): the settlement's change carries the settled Turn, equal to
    a fresh read; one with an Interaction, or whose row is not the one the settlement reads,
    carries none."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    heard = Heard(store)
    try:
        turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
        with store.db.write_batch():
            store.turns.record_provider_turn(WS, sid, turn.turn_id, "p-1")
            store.turns.record_turn_binding(WS, sid, turn.turn_id, '{"c":1}')
            reply = store.history.append_message(
                WS, sid, turn.turn_id, kind="assistant", text="the reply", payload={"k": "é"}
            )
        image = store.turns.get_turn(WS, sid, turn.turn_id)
        heard.take()
        store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id, checkpoint_json='{"c":2}', turn=image,
        )  # fmt: skip
        settlement = _turn_change(heard.take())
        assert settlement.row == store.turns.get_turn(WS, sid, turn.turn_id)
        assert settlement.row is not None and settlement.row.phase == "settled"
        assert 0 < settlement.seq <= store.db.write_seq

        other, _ = store.turns.claim_submit(WS, sid, "req-2", "again")
        asked = store.history.open_interaction(
            WS, sid, other.turn_id, request_id="q", kind="approval", input={}
        )
        with_interaction = store.turns.get_turn(WS, sid, other.turn_id)
        assert with_interaction.interactions == (asked,)
        heard.take()
        store.turns.record_settlement(
            WS, sid, other.turn_id, outcome="interrupted", turn=with_interaction
        )
        assert _turn_change(heard.take()).row is None

        # An image whose row is not the one the settlement reads (a bind it missed) is not
        # trusted: read back.
        third, _ = store.turns.claim_submit(WS, sid, "req-3", "once more")
        store.turns.record_provider_turn(WS, sid, third.turn_id, "p-3")
        heard.take()
        store.turns.record_settlement(WS, sid, third.turn_id, outcome="completed", turn=third)
        assert _turn_change(heard.take()).row is None
    finally:
        heard.close()


def test_a_trusted_settlement_copies_its_turn_once(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settlement compares the image it was handed with the row it read column by
    column: the only `Turn` it builds is the settled one its change carries (a copy of the
    image to compare was a second `dataclasses.replace` per Turn on the actor's thread), built
    field by field (`dataclasses.replace` walked the fields inside the writer's baton)."""
    import storage.turns as turns_module

    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
    image = store.turns.get_turn(WS, sid, turn.turn_id)
    copies: list[str] = []
    real = turns_module.Turn

    def counted(*args: Any, **kwargs: Any) -> Any:
        copies.append("Turn")
        return real(*args, **kwargs)

    monkeypatch.setattr(turns_module, "Turn", counted)
    heard = Heard(store)
    try:
        heard.take()
        store.turns.record_settlement(WS, sid, turn.turn_id, outcome="completed", turn=image)
        settlement = _turn_change(heard.take())
    finally:
        heard.close()
    assert settlement.row == store.turns.get_turn(WS, sid, turn.turn_id)
    assert copies == ["Turn"]


def test_a_settlement_handed_its_start_writes_writes_them_as_they_would_have_landed(
    running: tuple[Daemon, Client],
) -> None:
    """The Session actor hands its settlement the Turn's bind and binding it still had
    queued (`TurnBound`): the settlement's statement writes them as the two lone writes would
    have just before it — the provider's turn id unless the Turn is bound to another (that
    bind's `Conflict` wrote nothing), the binding JSON, the claim finished — and its change
    carries exactly the Turn it committed; on a Turn already settled it writes them alone."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)

    def claims(turn_id: str) -> list[str]:
        rows = store.db.rows("SELECT status FROM submit_claims WHERE turn_id = ?", (turn_id,))
        return [str(r[0]) for r in rows]

    heard = Heard(store)
    try:
        turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
        reply = store.history.append_message(
            WS, sid, turn.turn_id, kind="assistant", text="the reply", payload={}
        )
        image = store.turns.get_turn(WS, sid, turn.turn_id)
        heard.take()
        assert store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id, turn=image,
            bound=TurnBound("p-1", '{"c":1}'),
        )  # fmt: skip
        settled = store.turns.get_turn(WS, sid, turn.turn_id)
        assert _turn_change(heard.take()).row == settled
        assert (settled.root_provider_turn_id, settled.provider_turn_binding_json) == (
            "p-1", '{"c":1}',
        )  # fmt: skip
        assert claims(turn.turn_id) == ["finished"]

        # Bound to another provider turn already: that id stays, the binding is written.
        other, _ = store.turns.claim_submit(WS, sid, "req-2", "again")
        store.turns.record_provider_turn(WS, sid, other.turn_id, "p-2")
        image = store.turns.get_turn(WS, sid, other.turn_id)
        heard.take()
        assert store.turns.record_settlement(
            WS, sid, other.turn_id, outcome="completed", turn=image,
            bound=TurnBound("p-elsewhere", '{"c":2}'),
        )  # fmt: skip
        settled = store.turns.get_turn(WS, sid, other.turn_id)
        assert _turn_change(heard.take()).row == settled
        assert (settled.root_provider_turn_id, settled.provider_turn_binding_json) == (
            "p-2", '{"c":2}',
        )  # fmt: skip

        # A Turn already settled: no settlement, the bind and binding still land.
        third, _ = store.turns.claim_submit(WS, sid, "req-3", "once more")
        store.turns.record_settlement(WS, sid, third.turn_id, outcome="interrupted")
        assert claims(third.turn_id) == ["finished"]
        assert not store.turns.record_settlement(
            WS, sid, third.turn_id, outcome="completed", bound=TurnBound("p-3", '{"c":3}')
        )
        settled = store.turns.get_turn(WS, sid, third.turn_id)
        assert (settled.outcome, settled.root_provider_turn_id) == ("interrupted", "p-3")
        assert settled.provider_turn_binding_json == '{"c":3}'
    finally:
        heard.close()


def test_a_settlement_handed_its_reply_writes_it_as_the_lone_appends_would_have(
    running: tuple[Daemon, Client],
) -> None:
    """The Session actor hands its settlement the Turn's new Messages it still had queued
    (`NewMessage`: its reply): the settlement inserts them first, in order, last in the
    Session, exactly as the lone appends would have just before it (ids, kinds, texts,
    payloads, versions, positions), names its final Message among them, and its change
    carries exactly the Turn it committed; on a Turn already settled it inserts them alone,
    and a fork's fence refuses them there as it refused the appends."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    lone = _session(client)

    heard = Heard(store)
    try:
        # The same Turn written both ways: lone appends then a settlement, and one settlement.
        expected_turn, _ = store.turns.claim_submit(WS, lone, "req-1", "hello")
        for kind, text, payload in (("reasoning", "hm", {"r": 1}), ("assistant", "the reply", {})):
            last = store.history.append_message(
                WS, lone, expected_turn.turn_id, kind=kind, text=text, payload=payload
            )
        store.turns.record_settlement(
            WS, lone, expected_turn.turn_id, outcome="completed",
            final_assistant_message_id=last.message_id,
        )  # fmt: skip
        expected = store.turns.get_turn(WS, lone, expected_turn.turn_id)

        turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
        image = store.turns.get_turn(WS, sid, turn.turn_id)
        news = (
            NewMessage(str(uuid.uuid4()), "reasoning", "hm", {"r": 1}),
            NewMessage(str(uuid.uuid4()), "assistant", "the reply", {}),
        )
        heard.take()
        assert store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed",
            final_assistant_message_id=news[1].message_id, turn=image, messages=news,
        )  # fmt: skip
        settled = store.turns.get_turn(WS, sid, turn.turn_id)
        assert _turn_change(heard.take()).row == settled
        assert settled.final_assistant_message_id == news[1].message_id
        assert [m.message_id for m in settled.messages[1:]] == [m.message_id for m in news]

        def shape(t: Any) -> list[tuple[Any, ...]]:
            return [(m.kind, m.text, m.payload, m.version, m.position) for m in t.messages]

        assert shape(settled) == shape(expected)
        assert (settled.phase, settled.outcome) == (expected.phase, expected.outcome)

        # Not handed its image: the settling change is read back, the reply still written
        # first (its final Message found by the lookup in the same transaction).
        other, _ = store.turns.claim_submit(WS, sid, "req-2", "again")
        reply = NewMessage(str(uuid.uuid4()), "assistant", "second", {})
        assert store.turns.record_settlement(
            WS, sid, other.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id, messages=(reply,),
        )  # fmt: skip
        again = store.turns.get_turn(WS, sid, other.turn_id)
        assert [m.text for m in again.messages] == ["again", "second"]
        assert again.messages[1].position == settled.messages[-1].position + 2

        # A Turn already settled: no settlement, the Messages still land (as the appends).
        late = NewMessage(str(uuid.uuid4()), "assistant", "late", {})
        assert not store.turns.record_settlement(
            WS, sid, other.turn_id, outcome="failed", messages=(late,)
        )
        after = store.turns.get_turn(WS, sid, other.turn_id)
        assert (after.outcome, after.messages[-1].text) == ("completed", "late")
    finally:
        heard.close()


def test_the_claim_is_published_without_a_read(
    running: tuple[Daemon, Client],
) -> None:
    """Each event is its write's committed state, projected as a read of the Turn would be —
    the store already holds the settled Turn when the claim's event is built."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    claim, settlement, turn_id = _a_turn(store, sid)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(claim)
    publisher._publish(settlement)
    active, settled = _turn_events(sink)
    assert reads == [turn_id] and publisher.carried_turns == 1  # the settlement's read
    assert active["phase"] == "active" and [m["text"] for m in active["messages"]] == ["hello"]
    claimed = _turn_change(claim).row
    assert claimed is not None
    assert active == projection.turn(claimed, "tutti-agent", daemon.catalog)
    whole = store.turns.get_turn(WS, sid, turn_id)
    assert settled == projection.turn(whole, "tutti-agent", daemon.catalog)


def test_an_older_turn_row_delivered_after_a_newer_one_is_read_back(
    running: tuple[Daemon, Client],
) -> None:
    """Events reach the thread in the order their writers' threads deliver them: the claim's
    row, delivered after the settlement's was published, must not show the Turn active
    again."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    claim, settlement, turn_id = _a_turn(store, sid)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(settlement)
    publisher._publish(claim)  # delivered late: read back, the current state
    assert [t["phase"] for t in _turn_events(sink)] == ["settled", "settled"]
    assert reads == [turn_id, turn_id]

    # Both in one batch, in commit order: the claim's own row (a delta of the Turn queued
    # between them would leave between their events), then the settlement's read.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(claim + settlement)
    assert [t["phase"] for t in _turn_events(sink)] == ["active", "settled"]
    assert reads == [turn_id]

    # A read-back shown first: a row older than the read is read back too.
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish([TurnChanged(WS, sid, turn_id)])
    publisher._publish(claim)
    assert [t["phase"] for t in _turn_events(sink)] == ["settled", "settled"]
    assert reads == [turn_id, turn_id]


def test_a_turn_row_after_its_sessions_removal_is_not_published(
    running: tuple[Daemon, Client],
) -> None:
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    claim, _, turn_id = _a_turn(store, sid)
    heard = Heard(store)
    try:
        store.sessions.delete_session(WS, sid)
        removed = heard.take()
    finally:
        heard.close()
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    publisher._publish(removed)
    publisher._publish(claim)  # read back: refused, the Session is gone
    assert [e["type"] for e in sink.events] == ["session.removed"]
    assert reads == [turn_id]


def test_a_turn_row_older_than_a_change_nobody_wanted_is_read_back(
    running: tuple[Daemon, Client],
) -> None:
    """The settlement went unpublished (no subscriber then); one connects, and the claim's
    event arrives late: it must not show the Turn active as the newest."""
    daemon, client = running
    store = daemon.store
    assert store is not None
    sid = _session(client)
    claim, settlement, turn_id = _a_turn(store, sid)
    sink = Sink()
    publisher, reads = _publisher(daemon, sink)
    sink.wanted = False
    publisher._publish(settlement)
    assert sink.events == [] and reads == []  # not wanted: not even read
    sink.wanted = True
    publisher._publish(claim)
    assert [t["phase"] for t in _turn_events(sink)] == ["settled"] and reads == [turn_id]


def test_a_streamed_turns_events_show_what_the_store_committed(
    running: tuple[Daemon, Client],
) -> None:
    """Through the whole daemon: each claim's and settlement's event is built from its row,
    and what a subscriber heard passes `check_turn_events` with the stored Turns; the check
    catches a settling event that is not the committed Turn (a reply cut, a Message's
    payload changed), and a Turn heard active again after it settled."""
    from tests.support.daemon import create_session, run_turn, wait_for
    from tests.support.invariants import check_turn_events
    from transport.client import EventSubscriber

    daemon, client = running
    server, publisher = daemon.server, daemon.publisher
    assert server is not None and publisher is not None
    sid = create_session(client, WS)["agentSessionId"]
    heard: list[dict[str, Any]] = []
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        carried = publisher.carried_turns
        turns = [run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS) for _ in range(4)]
        stored = {t["turnId"]: t for t in turns}
        hear_settled(sub, stored, heard)
    # Each Turn's claim and settlement (the Session actor hands it the Turn it wrote).
    assert publisher.carried_turns - carried == 2 * len(turns)
    assert check_turn_events(heard, stored, stored) == []
    # Not vacuous: a settling event built from a row that is not the committed one, or a Turn
    # heard active again after it settled, fails it.
    at = next(
        i
        for i, e in enumerate(heard)
        if e["type"] == "turn.updated" and e["turn"]["phase"] == "settled"
    )
    settled = heard[at]["turn"]
    stale = {**settled, "messages": settled["messages"][:1], "finalAssistantMessageId": None}
    tampered = [*heard[:at], {**heard[at], "turn": stale}, *heard[at + 1 :]]
    assert check_turn_events(tampered, stored, stored)
    # A Message's payload is the committed one too (a carried settlement builds it from
    # what the Session actor inserted).
    reply = {**settled["messages"][-1], "payload": {"tampered": True}}
    repaid = {**settled, "messages": [*settled["messages"][:-1], reply]}
    tampered = [*heard[:at], {**heard[at], "turn": repaid}, *heard[at + 1 :]]
    assert check_turn_events(tampered, stored, stored)
    active = next(
        e
        for e in heard
        if e["type"] == "turn.updated"
        and e["turn"]["turnId"] == settled["turnId"]
        and e["turn"]["phase"] == "active"
    )
    assert check_turn_events([*heard, active], stored, stored)


def test_a_turn_of_many_messages_written_in_batches_settles_carried(tmp_path: Path) -> None:
    """A Turn whose forty Messages land over several batches and single writes: the
    settlement's Turn, built from the claim's row and each write as it landed, is the Turn the
    store holds (every Message, payload and version; the binding) and is published without
    a read. (A settlement is rightly read back when the publisher, behind the writer, read a
    batch's row-less change back at a `write_seq` past the settlement: on a loaded machine
    that can happen to a Turn, so Turns are run until two settled carried, six at most.)"""
    from model_fakes.responses import ResponsesServer
    from tests.resources.steps import steps_reply
    from tests.support.daemon import create_session, run_turn, wait_for
    from tests.support.invariants import check_turn_events
    from transport.client import EventSubscriber

    home = tmp_path / "home"
    settled_carried: list[str] = []
    with ResponsesServer(steps_reply) as model:
        home.mkdir(mode=0o700)
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{model.base_url}"\n'
        )
        with in_process_daemon(home) as (daemon, client):
            server, publisher = daemon.server, daemon.publisher
            assert server is not None and publisher is not None
            turn_event = publisher._turn_event

            def seeing(change: TurnChanged, turns_read: set[TurnChanged]) -> Any:
                event = turn_event(change, turns_read)
                carried = event is not None and change not in turns_read
                if carried and event["turn"]["phase"] == "settled":
                    settled_carried.append(event["turn"]["turnId"])
                return event

            publisher._turn_event = seeing  # type: ignore[method-assign]
            sid = create_session(client, WS)["agentSessionId"]
            heard: list[dict[str, Any]] = []
            turns: list[dict[str, Any]] = []
            with EventSubscriber(server.events_endpoint, (WS,)) as sub:
                wait_for(lambda: server.wants(WS))
                while len(settled_carried) < 2 and len(turns) < 6:
                    turns.append(run_turn(client, sid, "steps 40 60", WS))
                    hear_settled(sub, [turns[-1]["turnId"]], heard)
    stored = {t["turnId"]: t for t in turns}
    assert len(settled_carried) >= 2, (len(turns), settled_carried)
    for turn in turns:
        assert turn["outcome"] == "completed" and len(turn["messages"]) == 42, turn
    assert check_turn_events(heard, stored, stored) == []
    for e in heard:
        if e["type"] == "turn.updated" and e["turn"]["phase"] == "settled":
            whole = stored[e["turn"]["turnId"]]
            assert e["turn"]["messages"] == whole["messages"]
            assert e["turn"]["providerForkBindingState"] == whole["providerForkBindingState"]


def test_a_turn_whose_batch_was_lost_settles_read_back(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch holding a Turn's reply and settlement loses its COMMIT (SQLite turns it into a
    rollback) after the Session actor applied the reply to its image: the queue retries the
    writes (the reply inserted again under a new id), and the settlement, whose image may name
    a Message that no longer exists, is read back — its event is the Turn as committed. The
    reply is left a write of its own in the batch (as a reply the settlement cannot take is:
    one with another write of its Turn queued), not taken by the settlement."""
    from actors.turn_writes import TurnWrites
    from tests.support.daemon import settle, submit, wait_for
    from tests.support.invariants import check_turn_events
    from transport.client import EventSubscriber

    take_bound = TurnWrites.take_bound

    def bound_only(self: TurnWrites, turn_id: str) -> Any:
        for queued in self._durable:
            queued.message = None
        return take_bound(self, turn_id)

    monkeypatch.setattr(TurnWrites, "take_bound", bound_only)
    daemon, client = running
    server, publisher, store = daemon.server, daemon.publisher, daemon.store
    assert server is not None and publisher is not None and store is not None
    sid = _session(client)
    writer = store.db._writer_connection()
    refused: list[int] = []
    appended: list[str] = []
    append = store.history.append_message

    def appending(*args: Any, **kwargs: Any) -> Any:
        message = append(*args, **kwargs)
        appended.append(message.message_id)
        return message

    def refuse_once() -> bool:
        if refused or not appended:
            return False
        refused.append(1)
        return True  # the COMMIT of the batch holding the reply becomes a ROLLBACK

    heard: list[dict[str, Any]] = []
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        carried = publisher.carried_turns
        writer.set_commit_hook(refuse_once)
        store.history.append_message = appending  # type: ignore[method-assign]
        try:
            turn_id = submit(client, sid, f"/stream say {uuid.uuid4().hex}", WS)["turnId"]
            whole = settle(client, sid, turn_id, WS)
        finally:
            writer.set_commit_hook(None)
            store.history.append_message = append  # type: ignore[method-assign]
        hear_settled(sub, [turn_id], heard)
    # The reply was inserted twice (once in the lost batch); the Turn holds the second.
    assert refused and len(appended) == 2 and whole["outcome"] == "completed"
    assert whole["messages"][-1]["messageId"] == appended[1]
    assert check_turn_events(heard, [turn_id], {turn_id: whole}) == []
    assert publisher.carried_turns - carried == 1  # the claim's only


def test_a_settlement_that_took_its_reply_and_lost_its_commit_writes_the_same_reply_again(
    running: tuple[Daemon, Client],
) -> None:
    """The settlement that took its Turn's reply (`NewMessage`) loses its COMMIT: nothing of it
    exists, and the queue retries the same write — the reply inserted under the id it was given
    when the settlement was queued, once; the Turn completes with it as its final Message and
    every event a subscriber heard agrees with the store."""
    from tests.support.daemon import settle, submit, wait_for
    from tests.support.invariants import check_turn_events
    from transport.client import EventSubscriber

    daemon, client = running
    server, store = daemon.server, daemon.store
    assert server is not None and store is not None
    sid = _session(client)
    writer = store.db._writer_connection()
    refused: list[int] = []
    taken: list[tuple[str, ...]] = []
    record = store.turns.record_settlement

    def recording(*args: Any, **kwargs: Any) -> Any:
        taken.append(tuple(m.message_id for m in kwargs.get("messages", ())))
        return record(*args, **kwargs)

    def refuse_once() -> bool:
        if refused or not any(taken):
            return False
        refused.append(1)
        return True  # the settlement's COMMIT becomes a ROLLBACK

    heard: list[dict[str, Any]] = []
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        writer.set_commit_hook(refuse_once)
        store.turns.record_settlement = recording  # type: ignore[method-assign]
        try:
            turn_id = submit(client, sid, f"/stream say {uuid.uuid4().hex}", WS)["turnId"]
            whole = settle(client, sid, turn_id, WS)
        finally:
            writer.set_commit_hook(None)
            store.turns.record_settlement = record  # type: ignore[method-assign]
        hear_settled(sub, [turn_id], heard)
    assert refused and whole["outcome"] == "completed", whole
    # Tried twice with the same reply; the Turn holds it once, as its final Message.
    assert len(taken) == 2 and taken[0] == taken[1] and len(taken[0]) == 1, taken
    assert [m["messageId"] for m in whole["messages"][1:]] == list(taken[0])
    assert whole["finalAssistantMessageId"] == taken[0][0]
    assert check_turn_events(heard, [turn_id], {turn_id: whole}) == []
