"""What the carried-row tests share (tests/daemon/test_carried_rows.py, test_carried_turns.py):
a sink that keeps every event handed to it, the store's deliveries as a subscriber gets them,
and a Session made through the daemon."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from storage.models import ChangeEvent
from storage.store import Store
from tests.support.daemon import wait_for
from transport.client import Client, EventSubscriber


class Sink:
    """Wants every workspace (while `wanted`); keeps every event handed over."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.wanted = True

    def wants(self, topic: str) -> bool:
        return self.wanted

    def publish_many(self, events: list[tuple[str, Any]]) -> bool:
        self.events.extend(dict(e) for _, e in events)
        return True


class Heard:
    """The store's deliveries, as a subscriber gets them."""

    def __init__(self, store: Store) -> None:
        self.changes: list[ChangeEvent] = []
        self._stop = store.db.subscribe_batches(self.changes.extend)

    def take(self) -> list[ChangeEvent]:
        out, self.changes[:] = list(self.changes), []
        return out

    def close(self) -> None:
        self._stop()


def new_session(client: Client, ws: str) -> str:
    """A tutti-agent Session created through the daemon in workspace `ws`: its id."""
    sid = str(uuid.uuid4())
    status, _ = client.call_raw(
        "session.create", {"workspaceId": ws, "agentSessionId": sid, "provider": "tutti-agent"}
    )
    assert status == 200
    return sid


def hear_settled(
    sub: EventSubscriber, turn_ids: Iterable[str], heard: list[dict[str, Any]]
) -> None:
    """Keep what `sub` hears in `heard` until a settled `turn.updated` of every Turn in
    `turn_ids` was heard (30 s at most)."""
    wanted = set(turn_ids)

    def settled() -> bool:
        while (event := sub.next(0.2)) is not None:
            if isinstance(event, dict):
                heard.append(dict(event))
        return wanted <= {
            e["turn"]["turnId"]
            for e in heard
            if e["type"] == "turn.updated" and e["turn"]["phase"] == "settled"
        }

    wait_for(settled, 30)
