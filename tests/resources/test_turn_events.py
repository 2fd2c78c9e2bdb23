"""Through the real daemon: a `turn.updated` carries what changed, not the whole Turn.

While a Turn runs, each `turn.updated` carries the Turn's fields plus only the messages added
since that Turn's previous event (`messagesTruncated: true`, `messageCount`, `messagesFrom`);
its first and its settling event carry the whole Turn. So a Turn of N messages costs O(N)
bytes on the PUB, not O(N²) (as it would if every event carried every message). Clients merge by
message id and read a Turn they cannot complete (they joined late, or missed an event) with
`session.timeline`; the merged state equals `session.timeline` in `transport.client`,
`session_client.stream_turn` (so `agenthost say`) and a late joiner.

The model is the fake Responses API: a reply of many `reasoning` items, one Message each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from actors.session_actor import MAX_HELD_WRITES
from client.session_client import get_turn, stream_turn
from tests.resources.steps import steps_daemon
from tests.support.daemon import WS, create_session, submit, turn_of, wait_for
from transport.client import EventSubscriber, merge_turn

pytestmark = pytest.mark.timeout(120)

STEPS = 60
STEP_BYTES = 1000
OVERHEAD_BYTES = 2048
"""What a `turn.updated` may carry beside its messages: the Turn's other fields (two
interactions at most here) and the event envelope."""


def _size(value: Any) -> int:
    return len(msgpack.packb(value, use_bin_type=True))


def _turn_events(
    sub: EventSubscriber, sid: str, turn_id: str, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Every `turn.updated` of one Turn, up to and including its settling event."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = sub.next_message(1.0)
        if message is None:
            continue
        topic, event = message
        if (
            topic == WS
            and event.get("type") == "turn.updated"
            and event.get("agentSessionId") == sid
            and event["turn"]["turnId"] == turn_id
        ):
            out.append(event)
            if event["turn"]["phase"] == "settled":
                return out
    raise AssertionError(f"no settling event in {timeout}s ({len(out)} events)")


def test_a_long_turn_costs_linear_bytes_on_the_pub(tmp_path: Path) -> None:
    with steps_daemon(tmp_path / "home") as d:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        sub = EventSubscriber(d.events, (WS,))
        try:
            time.sleep(0.5)  # ZeroMQ's slow joiner
            turn = submit(c, sid, f"steps {STEPS} {STEP_BYTES}")
            events = _turn_events(sub, sid, turn["turnId"])
        finally:
            sub.close()
        whole = turn_of(c, sid, turn["turnId"])
        assert len(whole["messages"]) == STEPS + 2  # the user text, the steps, the reply
        active = [e for e in events if e["turn"]["phase"] == "active"]
        # One event per few messages: a burst of driver events lands as one write batch (one
        # event per Turn per batch), and a batch holds at most MAX_HELD_WRITES of them.
        assert len(active) >= STEPS // (MAX_HELD_WRITES + 1), "one event per few messages"
        # Each event while the Turn runs: bounded by the messages it adds, not by the Turn.
        count = active[0]["turn"].get("messageCount", len(active[0]["turn"]["messages"]))
        for event in active[1:]:
            t = event["turn"]
            assert t["messagesTruncated"] is True and t["messagesFrom"] == count, t
            assert t["messageCount"] - t["messagesFrom"] == len(t["messages"])
            carried = sum(_size(m) for m in t["messages"])
            assert _size(event) <= carried + OVERHEAD_BYTES
            count = t["messageCount"]
        # The settling event is the whole Turn (a client that lost an event heals there).
        settled = events[-1]["turn"]
        assert "messagesTruncated" not in settled and settled == whole
        # In all: linear in the Turn's size (every message about twice), where whole Turns
        # per event cost ~N/2 times the Turn.
        total = sum(_size(e) for e in events)
        assert total <= 3 * _size(whole) + len(events) * OVERHEAD_BYTES, (total, _size(whole))
        # A client merging the events by message id holds exactly what session.timeline says.
        state: dict[str, Any] | None = None
        for event in events:
            state = merge_turn(state, event["turn"])
            assert state is not None
            assert len(state["messages"]) == event["turn"].get(
                "messageCount", len(event["turn"]["messages"])
            )
            assert state["messages"] == whole["messages"][: len(state["messages"])]
        assert state == whole


def test_a_client_that_joins_late_reads_the_whole_turn_from_the_timeline(
    tmp_path: Path,
) -> None:
    """Joined mid-turn while another client listens, a subscriber's events carry only new
    messages: it cannot build the Turn from them, reads it whole with `session.timeline`,
    then merges what follows."""
    gate = threading.Event()
    n, held = 30, 20
    # The fake model holds after `response.created` and `held` of the n reasoning items; the
    # rest come after the gate, more than one write batch (MAX_HELD_WRITES), so the late
    # joiner sees the Turn active before it settles however the batches fall.
    assert n - held > MAX_HELD_WRITES
    with steps_daemon(tmp_path / "home", gate=gate, hold_after=1 + held) as d:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        # Someone listens from the start, so the Turn's events are built as it runs (with no
        # subscriber at all none would be, and a late joiner's first one is whole).
        early = EventSubscriber(d.events, (WS,))
        try:
            time.sleep(0.5)  # the subscription reaches the daemon
            turn = submit(c, sid, f"steps {n} 200")
            wait_for(lambda: len(turn_of(c, sid, turn["turnId"])["messages"]) == held + 1)
            _until_event_with(early, sid, turn["turnId"], held + 1)
            late = EventSubscriber(d.events, (WS,))
            try:
                time.sleep(0.5)  # the subscription reaches the daemon
                gate.set()
                events = _turn_events(late, sid, turn["turnId"])
            finally:
                late.close()
        finally:
            early.close()
        whole = turn_of(c, sid, turn["turnId"])
        first = events[0]["turn"]
        assert first["phase"] == "active" and first["messagesFrom"] >= held + 1, first
        assert merge_turn(None, first) is None  # a part of the Turn: read it whole
        state = get_turn(c, WS, sid, turn["turnId"], turn["sequence"])
        assert len(state["messages"]) >= held + 1
        for event in events:
            merged = merge_turn(state, event["turn"])
            state = merged if merged is not None else get_turn(c, WS, sid, turn["turnId"])
        assert state == whole


def test_with_nobody_listening_a_late_joiners_first_event_is_whole(tmp_path: Path) -> None:
    """While no client subscribes, the daemon builds no event of the Turn; the
    first one a late joiner receives carries the Turn whole (no timeline read needed)."""
    gate = threading.Event()
    n = 10
    with steps_daemon(tmp_path / "home", gate=gate, hold_after=1 + n) as d:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turn = submit(c, sid, f"steps {n} 200")
        wait_for(lambda: len(turn_of(c, sid, turn["turnId"])["messages"]) == n + 1)
        late = EventSubscriber(d.events, (WS,))
        try:
            time.sleep(0.5)  # the subscription reaches the daemon
            gate.set()
            events = _turn_events(late, sid, turn["turnId"])
        finally:
            late.close()
        first = events[0]["turn"]
        assert "messagesTruncated" not in first and len(first["messages"]) >= n + 1, first
        assert merge_turn(None, first) is not None


def _until_event_with(sub: EventSubscriber, sid: str, turn_id: str, count: int) -> None:
    """Read `sub` until a `turn.updated` of this Turn says it has `count` messages."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        event = sub.next(1.0)
        if (
            event is not None
            and event.get("type") == "turn.updated"
            and event.get("agentSessionId") == sid
            and event["turn"]["turnId"] == turn_id
            and event["turn"].get("messageCount", len(event["turn"]["messages"])) >= count
        ):
            return
    raise AssertionError(f"no event of turn {turn_id} with {count} messages")


def test_stream_turn_and_say_follow_a_multi_message_turn_to_the_timeline(
    tmp_path: Path,
) -> None:
    """`session_client.stream_turn` (what `agenthost say` runs): every update it hands on is
    the whole Turn so far, merged from events that carry only new messages."""
    with steps_daemon(tmp_path / "home") as d:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        spy = EventSubscriber(d.events, (WS,))
        updates: list[dict[str, Any]] = []
        try:
            time.sleep(0.5)
            final = stream_turn(
                c, WS, sid, "steps 60 300", events_endpoint=d.events, on_update=updates.append
            )
            seen = _turn_events(spy, sid, final["turnId"])
        finally:
            spy.close()
        whole = turn_of(c, sid, final["turnId"])
        assert final == whole
        assert any(
            e["turn"].get("messagesTruncated") and e["turn"]["messagesFrom"] > 0 for e in seen
        ), "the events carried only what changed"
        for update in updates:
            assert "messagesTruncated" not in update
            assert update["messages"] == whole["messages"][: len(update["messages"])]
        assert len({len(u["messages"]) for u in updates}) > 2, "followed live, not polled"


def test_the_gui_transcript_merges_a_multi_message_turn_to_the_timeline(tmp_path: Path) -> None:
    """The GUI's open transcript, headless: while the Turn runs (held by the model after its
    steps) and once it settles, its copy of the Turn equals `session.timeline`'s, built from
    events that carried only new messages."""
    import textual  # noqa: F401  (the GUI extra; make test installs it: fail, never skip)

    from client.engine.lifecycle import Engine
    from client.engine.values import EngineChange
    from client.gui.app import AgentHostApp

    gate = threading.Event()
    n = 40
    with steps_daemon(tmp_path / "home", gate=gate, hold_after=1 + n) as d:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        seen: list[dict[str, Any]] = []

        def spy(change: EngineChange) -> None:
            if change.event is not None and change.event.get("type") == "turn.updated":
                seen.append(dict(change.event["turn"]))

        async def main() -> None:
            engine = Engine.connect(d.api, d.events, WS)
            engine.subscribe(spy)
            app = AgentHostApp(engine, own_engine=True)
            async with app.run_test(size=(140, 48)) as pilot:

                async def until(pred: Any, timeout: float = 60.0) -> None:
                    deadline = time.monotonic() + timeout
                    while not pred():
                        assert time.monotonic() < deadline, "GUI condition not met in time"
                        await pilot.pause(0.1)

                await until(lambda: app.sessions_loaded and app.engine.session(sid) is not None)
                app.open_session(sid)
                await pilot.pause(0.5)
                turn = await asyncio.to_thread(submit, c, sid, f"steps {n} 200")

                def shown() -> dict[str, Any] | None:
                    return next((t for t in app.turns if t["turnId"] == turn["turnId"]), None)

                def same_as_timeline() -> bool:
                    return shown() == turn_of(c, sid, turn["turnId"])

                await until(lambda: len((shown() or {}).get("messages") or []) == n + 1)
                await until(same_as_timeline)
                assert (shown() or {})["phase"] == "active"
                gate.set()
                await until(lambda: (shown() or {}).get("phase") == "settled")
                await until(same_as_timeline)

        asyncio.run(main())
        assert any(t.get("messagesTruncated") and t["messagesFrom"] > 0 for t in seen), (
            "the GUI got events that carried only what changed"
        )


def _message(i: int, text: str = "m", version: int = 1) -> dict[str, Any]:
    return {
        "messageId": f"m{i}",
        "turnId": "t",
        "kind": "reasoning",
        "text": text,
        "payload": {},
        "version": version,
    }


def test_deltas_gaps_and_the_size_cap_without_a_daemon() -> None:
    """The publisher's side (`TurnDeltas`) against the client's (`merge_turn`): a missed event
    or a message past the cap is a gap the client sees; an in-place update is re-sent."""
    from agenthost.turn_events import TurnDeltas

    deltas, key, cap = TurnDeltas(), ("ws", "s", "t"), 64 << 10
    base = {"turnId": "t", "sequence": 1, "phase": "active", "interactions": []}
    msgs = [_message(0)]
    first = deltas.event_turn(key, {**base, "messages": msgs}, cap)
    assert "messagesTruncated" not in first  # a Turn's first event is whole
    held = merge_turn(None, first)
    msgs = [*msgs, _message(1), _message(2)]
    second = deltas.event_turn(key, {**base, "messages": msgs}, cap)
    assert (second["messagesFrom"], second["messageCount"]) == (1, 3)
    held = merge_turn(held, second)
    assert held is not None and held["messages"] == msgs
    msgs = [*msgs[:1], _message(1, "edited", 2), *msgs[2:], _message(3)]
    third = deltas.event_turn(key, {**base, "messages": msgs}, cap)
    assert [m["messageId"] for m in third["messages"]] == ["m1", "m2", "m3"]
    assert merge_turn(held, third) == {**base, "messages": msgs}
    msgs = [*msgs, _message(4)]
    missed = deltas.event_turn(key, {**base, "messages": msgs}, cap)
    assert missed["messagesFrom"] == 4
    msgs = [*msgs, _message(5, "x" * (cap + 1))]
    huge = deltas.event_turn(key, {**base, "messages": msgs}, cap)
    assert huge["messages"] == [] and huge["messagesFrom"] == huge["messageCount"] == 6
    assert merge_turn(merge_turn(held, third), huge) is None  # missed m4, m5 too big: re-read
    settled = deltas.event_turn(key, {**base, "phase": "settled", "messages": msgs}, 1 << 20)
    assert "messagesTruncated" not in settled and settled["messages"] == msgs
    assert len(deltas) == 0  # a settled Turn is forgotten
