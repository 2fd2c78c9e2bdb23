"""Counting the worker requests an in-process daemon sends (`tests.support.in_process`): what a
warm runtime saves is a request not sent, so tests and benchmarks count them by method."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from agenthost.daemon import Daemon
from tests.support.daemon import run_turn
from transport.client import Client


class SentRequests:
    """Counts the worker requests `daemon` sends, by method (each still sent), and times the
    round trips (sent → answered, ms) of the methods named in `timed`."""

    def __init__(self, daemon: Daemon, timed: Iterable[str] = ()) -> None:
        self.methods: Counter[str] = Counter()
        self.round_trips_ms: dict[str, list[float]] = {method: [] for method in timed}
        self._lock = threading.Lock()
        port = daemon.ctx.workers
        real: Callable[..., Any] = port._call  # type: ignore[attr-defined]  # every call, typed or `send`

        def request(provider: str, method: str, params: Any, timeout: float, *parse: Any) -> Any:
            with self._lock:
                self.methods[method] += 1
            started = time.perf_counter()
            fut = real(provider, method, params, timeout, *parse)
            if method in self.round_trips_ms:
                fut.add_done_callback(lambda _f: self._answered(method, started))
            return fut

        port._call = request  # type: ignore[attr-defined]

    def _answered(self, method: str, started: float) -> None:
        with self._lock:
            self.round_trips_ms[method].append((time.perf_counter() - started) * 1000)

    def take(self) -> Counter[str]:
        """The counts since the last `take` (and starts counting again)."""
        with self._lock:
            out, self.methods = self.methods, Counter()
        return out


def turn_after_worker_kill(
    daemon: Daemon, client: Client, sid: str, provider: str
) -> tuple[dict[str, Any], Counter[str]]:
    """SIGKILLs `provider`'s worker and runs one Turn on `sid` at once: the settled Turn and
    the worker requests the daemon sent for it, by method."""
    worker = next(w for w in client.call("host.status")["workers"] if w["provider"] == provider)
    sent = SentRequests(daemon)
    os.kill(worker["pid"], signal.SIGKILL)
    turn = run_turn(client, sid, "after the kill")
    return turn, sent.take()
