"""What the carried-row tests share (tests/daemon/test_carried_*.py, and the publisher's
direct-path tests: test_settle_direct.py, test_delta_path.py): a sink that keeps every event
handed to it and the thread that handed it, a publishing thread to start and stop, a publisher
counting its read-backs, the store's deliveries as a subscriber gets them, and a Session made
through the daemon."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from agenthost.daemon import Daemon
from agenthost.publisher import EventPublisher
from storage.models import ChangeEvent, SessionChanged
from storage.store import Store
from tests.support.daemon import wait_for
from transport.client import Client, EventSubscriber


class Sink:
    """An `EventSink` that wants every workspace (while `wanted`) and keeps, in the order the
    transport loop would get them, each event handed over and the thread that handed it. While
    `hold` is an unset Event, a hand-over through the loop (`publish_many`) of anything but
    deltas waits for it, `holding` set."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.threads: list[int] = []
        self.wanted = True
        self.lock = threading.Lock()
        self.hold: threading.Event | None = None
        self.holding = threading.Event()

    def wants(self, topic: str) -> bool:
        return self.wanted

    def publish_many(self, events: list[tuple[str, Any]]) -> bool:
        hold = self.hold
        if hold is not None and any(e["type"] != "message.delta" for _, e in events):
            self.holding.set()
            hold.wait(30)
        with self.lock:
            self.events.extend(dict(e) for _, e in events)
            self.threads.extend(threading.get_ident() for _ in events)
        return True

    def publish_now(self, frames: list[tuple[bytes, bytes]]) -> bool:
        """A hand-over on its caller's thread (a delta's, a settlement's): decoded, kept."""
        with self.lock:
            for _, body in frames:
                self.events.append(msgpack.unpackb(body, raw=False))
                self.threads.append(threading.get_ident())
        return True


def run_publisher(publisher: EventPublisher) -> threading.Thread:
    """`publisher`'s publishing thread, started."""
    thread = threading.Thread(target=publisher.run, daemon=True)
    thread.start()
    return thread


def stop_publisher(publisher: EventPublisher, thread: threading.Thread) -> None:
    """Stop `run_publisher`'s thread (after what is queued) and check it ended."""
    publisher.queue.put(None)
    thread.join(10)
    assert not thread.is_alive()


def read_counting_publisher(
    daemon: Daemon, sink: Sink, read_of: Callable[[Any], str | None]
) -> tuple[EventPublisher, list[str]]:
    """A publisher of its own on the daemon's store, and the read-backs it makes: for each
    change it projects by reading the store, `read_of(change)` (None: not one to count)."""
    assert daemon.store is not None
    publisher = EventPublisher(daemon.store, daemon.catalog, queue.SimpleQueue(), sink=sink)
    reads: list[str] = []
    project = publisher.project

    def counted(change: Any) -> Any:
        if (read := read_of(change)) is not None:
            reads.append(read)
        return project(change)

    publisher.project = counted  # type: ignore[method-assign]
    return publisher, reads


def session_read(change: Any) -> str | None:
    """`read_counting_publisher`'s count of Session read-backs (a removal reads nothing)."""
    return change.session_id if isinstance(change, SessionChanged) and not change.removed else None


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


def a_turn(
    store: Store, ws: str, sid: str, **settlement: Any
) -> tuple[list[ChangeEvent], list[ChangeEvent], str]:
    """A Turn as the Session actor writes one: its claim, then bind, reply and settlement in
    one batch (`settlement`: more of `record_settlement`'s fields). The two deliveries, and the
    Turn's id."""
    heard = Heard(store)
    try:
        turn, created = store.turns.claim_submit(ws, sid, f"req-{uuid.uuid4()}", "hello")
        assert created
        claim = heard.take()
        with store.db.write_batch():
            store.turns.record_provider_turn(ws, sid, turn.turn_id, f"p-{turn.turn_id}")
            reply = store.history.append_message(
                ws, sid, turn.turn_id, kind="assistant", text="the reply"
            )
            store.turns.record_settlement(
                ws, sid, turn.turn_id, outcome="completed",
                final_assistant_message_id=reply.message_id, **settlement,
            )  # fmt: skip
        out = heard.take()
    finally:
        heard.close()
    return claim, out, turn.turn_id


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
