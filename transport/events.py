"""The events side of the API server: the PUB sockets (one with bare workspace topics, an
optional second one with terminated topics `workspaceId + "\\0"`) and who is
subscribed to what.

They are XPUB sockets: publishing is exactly PUB's (prefix filtering by ZeroMQ, `_EVENTS_HWM`
per subscriber), and they also hand the loop each subscription made or dropped. Without
verbose mode ZeroMQ reports a topic's first subscriber and its last unsubscription (a
disconnecting subscriber's subscriptions are dropped for it), so the set of topics read from
them is "some connected client wants this prefix". `wants(topic)` answers from that set, from
any thread, and the daemon's publisher skips the store reads and projection of an event no
one would receive. A subscription that reaches the daemon after an event was
skipped misses it, as it would miss it on a plain PUB (ZeroMQ's slow joiner).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import zmq

from transport.endpoints import Binder

log = logging.getLogger("transport.server")

EVENTS_HWM = 1000
"""Events queued per subscriber that does not read (PUB drops beyond it; a reading one keeps
up with bursts of hundreds): with events capped at `MAX_EVENT_BYTES` a subscriber that never
reads holds at most 1000 × 256 KiB of the daemon, typically far less (100,000 whole-Turn
events, unbounded, would take a daemon past 1 GB)."""
MAX_EVENT_BYTES = 256 << 10

_SUBSCRIBE = 1
_UNSUBSCRIBE = 0


class EventSockets:
    """Owned by the transport loop (sending and reading subscriptions); `wants` from any."""

    def __init__(self) -> None:
        self.pub: zmq.Socket[bytes] | None = None
        self.pub_exact: zmq.Socket[bytes] | None = None
        self.endpoints: list[str] = []
        self.exact_endpoints: list[str] = []
        self._topics: dict[zmq.Socket[bytes], set[bytes]] = {}
        # Swapped whole on each change, so readers on other threads never see it mid-update.
        self._prefixes: tuple[frozenset[bytes], frozenset[bytes]] = (frozenset(), frozenset())

    def bind(
        self,
        ctx: zmq.Context[Any],
        binder: Binder,
        endpoints: list[str],
        exact_endpoints: list[str],
        watch: Callable[[zmq.Socket[bytes]], None] | None = None,
    ) -> None:
        """Bind the sockets; `watch` is called with each before it binds (the connection
        guard counts what it accepts)."""
        self.pub = self._socket(ctx)
        if watch is not None:
            watch(self.pub)
        self.endpoints = binder.bind_each(self.pub, endpoints)
        if exact_endpoints:
            # The same bounds as the first socket: a subscriber that never reads costs the same.
            self.pub_exact = self._socket(ctx)
            if watch is not None:
                watch(self.pub_exact)
            self.exact_endpoints = binder.bind_each(self.pub_exact, exact_endpoints)

    def _socket(self, ctx: zmq.Context[Any]) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, EVENTS_HWM)
        self._topics[sock] = set()
        return sock

    @property
    def sockets(self) -> list[zmq.Socket[bytes]]:
        """The sockets the loop polls for subscription messages."""
        return [s for s in (self.pub, self.pub_exact) if s is not None]

    # -- subscriptions -----------------------------------------------------------------------

    def read_subscriptions(self, sock: zmq.Socket[bytes], limit: int = 1000) -> None:
        """Apply the subscription messages waiting on `sock` (loop thread)."""
        topics = self._topics[sock]
        changed = False
        for _ in range(limit):
            try:
                message = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not message:
                continue
            if message[0] == _SUBSCRIBE:
                topics.add(message[1:])
                changed = True
            elif message[0] == _UNSUBSCRIBE:
                topics.discard(message[1:])
                changed = True
        if changed:
            plain = frozenset(self._topics[self.pub]) if self.pub is not None else frozenset()
            exact = (
                frozenset(self._topics[self.pub_exact])
                if self.pub_exact is not None
                else frozenset()
            )
            self._prefixes = (plain, exact)

    def wants(self, topic: str) -> bool:
        """Whether some connected subscriber would receive an event published under `topic`
        (any thread; as of the last subscription the loop read)."""
        plain, exact = self._prefixes
        if not plain and not exact:
            return False
        raw = topic.encode("utf-8")
        if any(raw.startswith(prefix) for prefix in plain):
            return True
        if exact and b"\0" not in raw:
            terminated = raw + b"\0"
            return any(terminated.startswith(prefix) for prefix in exact)
        return False

    # -- sending -----------------------------------------------------------------------------

    def send(self, topic: bytes, payload: bytes) -> None:
        """Publish on each socket some subscription was read from (loop thread): one with
        none would drop the event itself, so it is not handed the frames at all (the window
        a subscription just made has is the one `wants` already has)."""
        assert self.pub is not None
        plain, exact = self._prefixes
        if plain:
            try:
                self.pub.send_multipart([topic, payload], zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                log.debug("event dropped: %s", exc)
        if self.pub_exact is None or not exact or b"\0" in topic:
            # A topic holding NUL could still prefix-match another (workspace ids never hold
            # one: the API refuses it); such an event is not published terminated at all.
            return
        try:
            # The one encoding of the event, under its terminated topic.
            self.pub_exact.send_multipart([topic + b"\0", payload], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("event dropped (exact): %s", exc)

    def close(self) -> None:
        for sock in (self.pub, self.pub_exact):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close()
        self.pub = self.pub_exact = None
        self._topics.clear()
        self._prefixes = (frozenset(), frozenset())
