"""A Turn's reply and its settlement: the assistant Message's write waits, within a bound, for
the Turn's next write, so a reply whose completion follows a few milliseconds later lands with
the settlement as one transaction (one COMMIT, one `turn.updated`); a completion that does not
come within the bound finds the Message already durable. The provider's copy of the user
Message (`item` of kind `user`) is not routed to the Session actor at all: the submit's claim
wrote the canonical one.

An in-process daemon (real store file, real worker and tutti-agent app-server, workspace
checkpoints on); the worker's events are intercepted on the delivery thread and forwarded."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agenthost.daemon as daemon_module
from actors import session_turns
from actors.messages import DriverEvent
from agenthost.daemon import Daemon
from domain.turn_events import TurnBindingMoved, TurnItem, TurnStarted
from tests.daemon.split_start import started_and_binding
from tests.support.carried import hear_settled
from tests.support.daemon import WS, create_session, run_turn, settle, submit, wait_for
from tests.support.in_process import in_process_daemon
from tests.support.invariants import check_turn_events
from transport.client import Client, EventSubscriber

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _warm_session(c: Client) -> str:
    sid = create_session(c, title="reply and settlement")["agentSessionId"]
    run_turn(c, sid, "spawn")
    return sid


def _assistant(event: dict[str, Any]) -> bool:
    item = event.get("item")
    return isinstance(item, dict) and item.get("kind") == "assistant"


def test_a_reply_and_a_settlement_that_arrive_apart_land_as_one_transaction(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Turn's `turn.completed` reaches the actor 20 ms after its reply's `item` (held in
    the event sink, so the actor has handled the item with an empty inbox): the reply's
    Message and the settlement (with its `after` checkpoint) are one store transaction. The
    bound is raised to 30 s so a loaded machine's scheduling cannot outlast it."""
    monkeypatch.setattr(session_turns, "ASSISTANT_LINGER_S", 30.0)
    daemon, c = running
    sid = _warm_session(c)
    assert daemon.store is not None and daemon.supervisor is not None
    stats = daemon.store.db.write_stats
    forward = daemon._on_worker_event
    at_reply: list[int] = []
    turn_id: list[str] = []

    def bound() -> bool:
        turn = daemon.store.turns.get_turn(WS, sid, turn_id[0])  # type: ignore[union-attr]
        return bool(turn.root_provider_turn_id and turn.provider_turn_binding_json)

    def sink(provider: str, key: str, event: dict[str, Any]) -> None:
        if event.get("type") == "item" and _assistant(event):
            wait_for(lambda: bool(turn_id), 30)
            wait_for(bound, 30)  # the start's own transaction has landed
            at_reply.append(stats.transactions)
        elif event.get("type") == "turn.completed":
            time.sleep(0.02)
        forward(provider, key, event)

    daemon.supervisor.set_event_sink(sink)
    try:
        turn_id.append(submit(c, sid, "one reply")["turnId"])
        turn = settle(c, sid, turn_id[0])
    finally:
        daemon.supervisor.set_event_sink(forward)
    assert turn["outcome"] == "completed", turn
    assert [m["text"] for m in turn["messages"]] == ["one reply", "echo: one reply"]
    assert turn["finalAssistantMessageId"] == turn["messages"][1]["messageId"], turn
    assert (turn.get("workspace") or {}).get("after"), turn
    assert len(at_reply) == 1
    assert stats.transactions - at_reply[0] == 1


def test_a_reply_whose_completion_does_not_come_is_durable_within_the_bound(
    running: tuple[Daemon, Client],
) -> None:
    """The Turn's `turn.completed` is withheld until the reply's Message is durable: it
    becomes durable without it (the wait for the next write is bounded), and the Turn then
    settles with that Message as its final one."""
    daemon, c = running
    sid = _warm_session(c)
    assert daemon.store is not None and daemon.supervisor is not None
    forward = daemon._on_worker_event
    durable_first = threading.Event()
    turn_id: list[str] = []

    def reply_durable() -> bool:
        turn = daemon.store.turns.get_turn(WS, sid, turn_id[0])  # type: ignore[union-attr]
        return any(m.kind == "assistant" for m in turn.messages)

    def sink(provider: str, key: str, event: dict[str, Any]) -> None:
        if event.get("type") == "turn.completed":
            wait_for(lambda: bool(turn_id), 30)
            if wait_for(reply_durable, 10):
                durable_first.set()
        forward(provider, key, event)

    daemon.supervisor.set_event_sink(sink)
    try:
        turn_id.append(submit(c, sid, "no completion yet")["turnId"])
        turn = settle(c, sid, turn_id[0])
    finally:
        daemon.supervisor.set_event_sink(forward)
    assert durable_first.is_set()
    assert turn["outcome"] == "completed", turn
    assert turn["finalAssistantMessageId"] == turn["messages"][1]["messageId"], turn


def test_the_providers_user_item_is_not_routed_to_the_session_actor(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, c = running
    sid = _warm_session(c)
    routed: list[Any] = []
    real_route = daemon_module.route

    def spy(routes: Any, host: Any, ws: str, sid_: str, message: Any) -> None:
        routed.append(message)
        real_route(routes, host, ws, sid_, message)

    monkeypatch.setattr(daemon_module, "route", spy)
    turn = run_turn(c, sid, "who said it")
    events = [m.event for m in routed if isinstance(m, DriverEvent)]
    items = [e.kind for e in events if isinstance(e, TurnItem)]
    assert items == ["assistant"], items
    assert any(e.TYPE == "turn.completed" for e in events)
    assert [m["kind"] for m in turn["messages"]] == ["user", "assistant"]
    assert turn["messages"][0]["text"] == "who said it"


def test_a_turns_writes_after_its_claim_are_one_transaction(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's writes (the provider bind and binding) wait, within their bound, for the
    Turn's next write, as the reply waits for the settlement: a one-reply Turn is two write
    transactions, the claim and everything after it (one COMMIT, one `turn.updated`). Both
    bounds are raised to 30 s so a loaded machine's scheduling cannot outlast them. On a
    daemon whose start writes land alone this counts two after the claim."""
    monkeypatch.setattr(session_turns, "START_LINGER_S", 30.0)
    monkeypatch.setattr(session_turns, "ASSISTANT_LINGER_S", 30.0)
    daemon, c = running
    sid = _warm_session(c)
    assert daemon.store is not None
    stats = daemon.store.db.write_stats
    for n in range(3):
        at_claim = stats.transactions
        turn = run_turn(c, sid, f"one write {n}")
        assert turn["outcome"] == "completed", turn
        assert turn["rootProviderTurnId"], turn
        assert [m["text"] for m in turn["messages"]] == [f"one write {n}", f"echo: one write {n}"]
        assert (turn.get("workspace") or {}).get("after"), turn
        # The claim and the one transaction of the start, the reply and the settlement.
        assert stats.transactions - at_claim == 2, stats.transactions - at_claim


def test_a_short_turns_start_writes_are_written_by_its_settlement(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's provider bind and binding, still queued when the settlement is (held for
    the Turn's next write), are written by the settlement's own statement, and its reply by
    the settlement's own write: the Turn's write after its claim is the settlement alone (no
    batch of writes), not four, and the Turn settles
    bound, with its binding, its claim finished; its settling event, carried, shows the bind
    (`check_turn_events`, which reports a settling event built without it). Both bounds
    raised to 30 s, as above. On a daemon whose bind and binding are writes of their own this
    counts four batched writes; on one whose reply is a write of its own, two."""
    monkeypatch.setattr(session_turns, "START_LINGER_S", 30.0)
    monkeypatch.setattr(session_turns, "ASSISTANT_LINGER_S", 30.0)
    daemon, c = running
    sid = _warm_session(c)
    store, server = daemon.store, daemon.server
    assert store is not None and server is not None
    stats = store.db.write_stats
    heard: list[dict[str, Any]] = []
    turns: dict[str, dict[str, Any]] = {}
    with EventSubscriber(server.events_endpoint, (WS,)) as sub:
        wait_for(lambda: server.wants(WS))
        for n in range(3):
            at_claim = (stats.transactions, stats.batched)
            turn = run_turn(c, sid, f"bound by the settlement {n}")
            turns[turn["turnId"]] = turn
            assert turn["outcome"] == "completed", turn
            assert (stats.transactions - at_claim[0], stats.batched - at_claim[1]) == (2, 0)
            stored = store.turns.get_turn(WS, sid, turn["turnId"])
            assert (
                stored.root_provider_turn_id
                and stored.root_provider_turn_id == (turn["rootProviderTurnId"])
            )
            assert stored.provider_turn_binding_json, stored
            claims = store.db.rows(
                "SELECT status FROM submit_claims WHERE turn_id = ?", (turn["turnId"],)
            )
            assert [r[0] for r in claims] == ["finished"], claims
        hear_settled(sub, turns, heard)
    assert check_turn_events(heard, turns, turns) == []
    # Not vacuous: the settling event of a Turn built from its image without the bind (one of
    # these Turns': the warm-up Turn's may reach a subscriber that joined after it settled).
    at = next(
        i
        for i, e in enumerate(heard)
        if e["type"] == "turn.updated"
        and e["turn"]["phase"] == "settled"
        and e["turn"]["turnId"] in turns
    )
    unbound = {**heard[at]["turn"], "rootProviderTurnId": None}
    assert check_turn_events([*heard[:at], {**heard[at], "turn": unbound}, *heard[at + 1 :]],
                             turns, turns)  # fmt: skip


def test_a_binding_heard_after_the_starts_answer_waits_for_the_settlement_too(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Turn's `turn.binding` that reaches the Session actor after the answer to its
    `turn.start`, alone (the worker's events and its answers reach the actor by different
    threads: on a loaded machine the answer can overtake the event), waits for the
    settlement as the start's bind does: the Turn's writes after its claim are still two.
    Here the binding is held in the event sink until the answer has been handled, then sent
    on alone, the events after it 0.1 s later. Before, queueing it ended the wait and the
    bind and binding were written as a transaction of their own (three and four). (The
    app-server driver carries the binding on `turn.started`; the sink sends it apart, as the
    Claude driver's trailing bindings come.)"""
    monkeypatch.setattr(session_turns, "START_LINGER_S", 30.0)
    monkeypatch.setattr(session_turns, "ASSISTANT_LINGER_S", 30.0)
    daemon, c = running
    sid = _warm_session(c)
    store, supervisor = daemon.store, daemon.supervisor
    assert store is not None and supervisor is not None
    answered = threading.Event()
    turn_started = session_turns.TurnRunner._turn_started

    def _started(self: session_turns.TurnRunner, *args: Any) -> None:
        turn_started(self, *args)
        answered.set()

    monkeypatch.setattr(session_turns.TurnRunner, "_turn_started", _started)
    forward = daemon._on_worker_event
    lock = threading.Lock()
    held: list[tuple[str, str, dict[str, Any]]] = []
    waited: list[bool] = []

    def _release() -> None:
        waited.append(answered.wait(10))
        with lock:
            forward(*held.pop(0))  # the binding, alone
            time.sleep(0.1)
            while held:
                forward(*held.pop(0))
            waited.append(True)

    def one(provider: str, key: str, event: dict[str, Any]) -> None:
        with lock:
            if not waited and (held or event.get("type") == "turn.binding"):
                if not held:
                    threading.Thread(target=_release, daemon=True).start()
                held.append((provider, key, event))
                return
        forward(provider, key, event)

    def sink(provider: str, key: str, event: dict[str, Any]) -> None:
        for part in started_and_binding(event):
            one(provider, key, part)

    stats = store.db.write_stats
    supervisor.set_event_sink(sink)
    try:
        at_claim = (stats.transactions, stats.batched)
        turn = run_turn(c, sid, "a late binding")
    finally:
        supervisor.set_event_sink(forward)
    assert waited[:1] == [True], "the binding was not held until the start's answer"
    assert turn["outcome"] == "completed", turn
    assert (stats.transactions - at_claim[0], stats.batched - at_claim[1]) == (2, 0)
    stored = store.turns.get_turn(WS, sid, turn["turnId"])
    assert stored.root_provider_turn_id and stored.provider_turn_binding_json, stored


def test_a_warm_turns_start_request_is_built_once(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm Turn's `turn.start` is built with its runtime's home and generation (the worker
    refuses it on any other runtime), as one `TurnStart`: not built bare and then copied with
    them by `dataclasses.replace` (a value built twice on the actor's thread, once a Turn)."""
    from agenthost.workers import SupervisorPort
    from domain.worker_messages import TurnStart

    daemon, c = running
    sid = _warm_session(c)
    copies: list[str] = []
    real_replace = dataclasses.replace

    def counted(obj: Any, /, **changes: Any) -> Any:
        copies.append(type(obj).__name__)
        return real_replace(obj, **changes)

    sent: list[TurnStart] = []
    real_start = SupervisorPort.start_turn

    def start_turn(self: SupervisorPort, provider: str, request: TurnStart, timeout: float) -> Any:
        sent.append(request)
        return real_start(self, provider, request, timeout)

    # Counted wherever the module would copy by `replace` (it imports none today).
    monkeypatch.setattr(session_turns, "replace", counted, raising=False)
    monkeypatch.setattr(SupervisorPort, "start_turn", start_turn)
    for i in range(2):
        run_turn(c, sid, f"warm {i}")
    assert "TurnStart" not in copies, copies
    assert len(sent) == 2
    warm = [r for r in sent if r.runtime_generation is not None]
    assert warm and all(r.home is not None for r in warm), sent


def test_a_turns_start_reaches_the_session_actor_as_one_message_with_its_binding(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app-server driver sends a Turn's `turn.started` with its binding on it: per warm
    Turn the Session actor gets one driver event for the start (not a `turn.started` and a
    `turn.binding` back to back: one worker event, one delivery wake-up and one actor message
    fewer), and the store holds the bind and the binding as the two events wrote them."""
    daemon, c = running
    sid = _warm_session(c)
    assert daemon.store is not None
    routed: list[Any] = []
    real_route = daemon_module.route

    def spy(routes: Any, host: Any, ws: str, sid_: str, message: Any) -> None:
        routed.append(message)
        real_route(routes, host, ws, sid_, message)

    monkeypatch.setattr(daemon_module, "route", spy)
    for n in range(3):
        routed.clear()
        turn = run_turn(c, sid, f"one start {n}")
        assert turn["outcome"] == "completed", turn
        events = [m.event for m in routed if isinstance(m, DriverEvent)]
        assert not [e for e in events if isinstance(e, TurnBindingMoved)], events
        [started] = [e for e in events if isinstance(e, TurnStarted)]
        assert started.binding_json is not None, started
        assert json.loads(started.binding_json)["providerTurnId"] == started.provider_turn_id
        stored = daemon.store.turns.get_turn(WS, sid, turn["turnId"])
        assert stored.root_provider_turn_id == started.provider_turn_id, stored
        assert stored.provider_turn_binding_json == started.binding_json, stored


def test_a_start_carrying_its_binding_on_a_settled_turn_writes_the_binding_alone(
    running: tuple[Daemon, Client],
) -> None:
    """A `turn.started` with a binding is handled as `turn.started` then `turn.binding`: on a
    Turn already settled the start binds nothing (its provider turn stays), and the binding
    (a checkpoint that may move after settlement) is written."""
    daemon, c = running
    sid = _warm_session(c)
    assert daemon.store is not None
    turn = run_turn(c, sid, "settled first")
    bound = turn["rootProviderTurnId"]
    assert bound, turn
    late = '{"late": true}'
    daemon_module.route(
        daemon.routes,
        daemon.host,
        WS,
        sid,
        DriverEvent(TurnStarted(turn["turnId"], "another-provider-turn", late)),
    )

    def written() -> bool:
        stored = daemon.store.turns.get_turn(WS, sid, turn["turnId"])  # type: ignore[union-attr]
        return stored.provider_turn_binding_json == late

    wait_for(written, 30)
    stored = daemon.store.turns.get_turn(WS, sid, turn["turnId"])
    assert stored.root_provider_turn_id == bound, stored
    assert stored.phase == "settled", stored
