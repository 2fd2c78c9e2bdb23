"""Whether the GUI is waiting on the daemon: the requests a person waits on (send, open a
session, the list, the everyday controls, diff and restore) are timed from the thread that
makes them; one unanswered after `WAIT_NOTICE_S` makes the session bar say "waiting for the
daemon…" (instead of what it cannot know now, such as "can fork") and a toast say so once, long
before the request's own deadline (30 s) ends it. Nothing runs while no request is out: each
request starts one timer on the app's loop (a message, thread safe and non-blocking)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

from textual.message import Message
from textual.message_pump import MessagePump

from client.engine.lifecycle import Engine
from protocol.methods import Method

P = TypeVar("P")
R = TypeVar("R")

WAIT_NOTICE_S = 1.0
"""A request unanswered this long is said to be waiting for the daemon."""

NOT_ANSWERING = "the daemon is not answering"
"""Why nothing forks while a request waits: a fork would wait as long, and whether a Turn can
fork is what the daemon would say."""


class WaitChanged(Message):
    """A request started or ended: the app checks (now, or `after` seconds) whether the GUI
    waits on the daemon."""

    def __init__(self, after: float) -> None:
        super().__init__()
        self.after = after


class DaemonWaits:
    """The requests out now, by when each started."""

    def __init__(self, engine: Engine, target: MessagePump) -> None:
        self.engine = engine
        self.target = target
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self._next = 0

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        with self._lock:
            token = self._next
            self._next += 1
            self._started[token] = time.monotonic()
        self.target.post_message(WaitChanged(WAIT_NOTICE_S))
        try:
            yield
        finally:
            with self._lock:
                del self._started[token]
            self.target.post_message(WaitChanged(0.0))

    def request(self, method: Method[P, R], params: P) -> R:
        """`engine.request`, timed."""
        with self.track():
            return self.engine.request(method, params)

    def overdue(self) -> bool:
        """A request has been out for `WAIT_NOTICE_S` or longer."""
        with self._lock:
            oldest = min(self._started.values(), default=None)
        return oldest is not None and time.monotonic() - oldest >= WAIT_NOTICE_S
