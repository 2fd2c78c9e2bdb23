"""The reading side of `turn.updated`: the publisher projects an active Turn's change from the
store rows that changed, not from the whole Turn.

`agenthost.turn_events.updated_turn` is what the daemon's publishing thread runs for every
`TurnChanged`. Against a real store file and a Turn grown to 500 messages (appends, streamed
updates of the last message, late updates of earlier ones, interactions, a binding, the
settle), the message rows it fetches from SQLite must be exactly the messages the event
carries, with a few one-row aggregate statements to find where they start. Rows are counted
by a row tracer on every store connection. And on the same script (shorter: the former path
is quadratic), each event must equal the former path's (read the Turn whole, project it, cut
it after the last event) field for field.

The store file lives on tmpfs when there is one: thousands of fsynced writes, not the
property under test, would otherwise dominate the run.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from agenthost import projection
from agenthost.catalog import Catalog
from agenthost.turn_events import TurnDeltas, updated_turn
from storage.models import Turn
from storage.store import Store
from transport.client import merge_turn

WS, SID, PROVIDER = "ws-projection", "s-projection", "tutti-agent"
MESSAGES = 500
CAP = 64 << 20  # far above the Turn: no event is size-capped here


class RowCounter:
    """Message rows and digest statements the store's connections run while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.message_rows = 0
        self.digests = 0

    def hook(self, conn: apsw.Connection) -> None:
        conn.row_trace = self._row
        conn.exec_trace = self._exec

    def _row(self, cursor: apsw.Cursor, row: Any) -> Any:
        if self.on and any(d[0] == "payload_json" for d in cursor.description):
            self.message_rows += 1
        return row

    def _exec(self, cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if self.on and "SUM(version)" in sql:
            self.digests += 1
        return True

    def reset(self) -> None:
        self.message_rows = self.digests = 0


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[tuple[Store, RowCounter]]:
    counter = RowCounter()
    apsw.connection_hooks.append(counter.hook)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=shm or tmp_path) as home:
        store = Store.open(Path(home) / "store.db")
        try:
            yield store, counter
        finally:
            store.close()
            apsw.connection_hooks.remove(counter.hook)


Publish = Callable[..., dict[str, Any]]


def _grow(store: Store, turn_id: str, messages: int, publish: Publish) -> None:
    """A Turn's life after its user message, publishing after every write (`changed`: how
    many messages the event must carry, from the first changed one to the last)."""
    for k in range(1, messages):
        mid = f"m{k}"
        store.history.append_message(WS, SID, turn_id, kind="reasoning", text="a", message_id=mid)
        publish(changed=1)
        if k % 10 == 0:  # streamed: the last message updated in place
            for text in ("ab", "abc"):
                store.history.append_message(
                    WS, SID, turn_id, kind="reasoning", text=text, message_id=mid
                )
                publish(changed=1)
        if k % 50 == 0:  # a tool call completing after later messages: an earlier one changes
            store.history.append_message(
                WS, SID, turn_id, kind="tool", text="done", message_id=f"m{k - 7}"
            )
            assert publish(changed=8)["messagesFrom"] == k - 7
        if k % 100 == 0:  # interactions: the Turn's fields change, no message does
            store.history.open_interaction(
                WS, SID, turn_id, request_id=f"q{k}", kind="approval", input={"k": k}
            )
            assert publish(changed=0)["messages"] == []
            store.history.resolve_interaction(WS, SID, turn_id, f"q{k}", {"ok": True})
            assert publish(changed=0)["interactions"][-1]["status"] == "resolved"
        if k == messages // 2:
            store.turns.bind_provider_turn(WS, SID, turn_id, "provider-turn-1")
            assert publish(changed=0)["rootProviderTurnId"] == "provider-turn-1"
    # Two writes land before the publisher reads (it lags): one event carries both.
    store.history.append_message(WS, SID, turn_id, kind="tool", text="late", message_id="m3")
    store.history.append_message(WS, SID, turn_id, kind="assistant", text="bye", message_id="fin")
    assert publish(changed=messages - 3 + 1)["messagesFrom"] == 3
    assert publish(changed=0)["messages"] == []  # the second change: nothing new to carry
    store.turns.settle_turn(WS, SID, turn_id, outcome="completed", final_assistant_message_id="fin")
    settled = publish()
    assert "messagesTruncated" not in settled and len(settled["messages"]) == messages + 1


def _start(store: Store) -> tuple[tuple[str, str, str], Callable[[Turn], dict[str, Any]]]:
    catalog = Catalog()
    store.sessions.create_session(
        WS, session_id=SID, provider=PROVIDER, title="t", cwd="/", settings={}
    )
    turn, _ = store.turns.claim_submit(WS, SID, "r1", "hello")

    def project(t: Turn) -> dict[str, Any]:
        return projection.turn(t, PROVIDER, catalog)

    return (WS, SID, turn.turn_id), project


def test_an_active_turns_update_reads_only_the_changed_messages(
    counted: tuple[Store, RowCounter],
) -> None:
    store, counter = counted
    key, project = _start(store)
    deltas = TurnDeltas()
    state: dict[str, Any] | None = None
    totals = {"events": 0, "rows": 0}

    def publish(*, changed: int | None = None) -> dict[str, Any]:
        nonlocal state
        counter.reset()
        counter.on = True
        try:
            event = updated_turn(store, deltas, key, project, CAP)
        finally:
            counter.on = False
        totals["events"] += 1
        totals["rows"] += counter.message_rows
        if event.get("messagesTruncated"):
            # Fetched: exactly the messages the event carries, found with a few aggregates
            # (O(log) of how far back the first change is; two for a streamed last message).
            carried = len(event["messages"])
            assert counter.message_rows == carried == changed, (counter.message_rows, changed)
            assert carried == event["messageCount"] - event["messagesFrom"]
            assert counter.digests <= 2 * math.ceil(math.log2(carried + 1)) + 2, counter.digests
        state = merge_turn(state, event)
        assert state is not None
        return event

    first = publish()
    assert "messagesTruncated" not in first and len(first["messages"]) == 1
    _grow(store, key[2], MESSAGES, publish)
    assert len(deltas) == 0  # settled: forgotten
    # Merged by a client, the events are the Turn; over its life the publisher fetched O(N)
    # message rows (each about once, plus the whole settled Turn), not O(N²).
    assert state == project(store.turns.get_turn(*key))
    assert totals["rows"] <= 2 * totals["events"] + 3 * MESSAGES, totals


def test_the_events_are_the_former_whole_read_events_field_for_field(
    counted: tuple[Store, RowCounter],
) -> None:
    store, _ = counted
    key, project = _start(store)
    new, former = TurnDeltas(), TurnDeltas()
    seen: list[dict[str, Any]] = []

    def publish(*, changed: int | None = None) -> dict[str, Any]:
        event = updated_turn(store, new, key, project, CAP)
        assert event == former.event_turn(key, project(store.turns.get_turn(*key)), CAP)
        seen.append(event)
        return event

    publish()
    _grow(store, key[2], 160, publish)
    assert sum(1 for e in seen if e.get("messagesTruncated")) == len(seen) - 2
