"""A fault-injecting relay on real ZeroMQ sockets between a client and the REAL daemon.

It forwards every request and reply unchanged, logs what passed, and on command drops
requests, holds replies, or answers a request with a given error in the daemon's stead (as a
flaky network or an overloaded proxy would). The daemon behind it is never faked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq


@dataclass(frozen=True, slots=True)
class Seen:
    method: str
    params: dict[str, Any]
    request_id: str
    fate: str  # "forwarded" | "dropped" | "answered"


class Relay:
    def __init__(self, frontend: str, backend: str) -> None:
        self.frontend = frontend
        self.backend = backend
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._lock = threading.Lock()
        self.seen: list[Seen] = []
        self._drop: dict[str, int | None] = {}
        self._hold: set[str] = set()
        self._answer: dict[str, tuple[int, dict[str, Any]]] = {}
        self._held: list[list[bytes]] = []
        self._release = False
        self._routes: dict[str, tuple[bytes, str]] = {}
        self.on_request: Callable[[str, dict[str, Any]], None] | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-relay", daemon=True)
        self._thread.start()
        self._ready.wait(5)

    # -- rules -------------------------------------------------------------------------------

    def drop_requests(self, method: str, count: int | None = None) -> None:
        """Drop the next `count` requests of `method` (all of them if None)."""
        with self._lock:
            self._drop[method] = count

    def hold_replies(self, method: str) -> None:
        with self._lock:
            self._hold.add(method)

    def answer(self, method: str, status: int, error: dict[str, Any]) -> None:
        """Answer requests of `method` with this error reply without forwarding them."""
        with self._lock:
            self._answer[method] = (status, error)

    def clear(self, method: str) -> None:
        with self._lock:
            self._drop.pop(method, None)
            self._answer.pop(method, None)
            self._hold.discard(method)

    def release_held(self) -> int:
        """Deliver held replies now (in order); returns how many."""
        with self._lock:
            count = len(self._held)
            self._release = True
        return count

    def requests(self, method: str, fate: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.method == method and (fate is None or s.fate == fate)]

    # -- loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        front = self._ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.LINGER, 0)
        front.bind(self.frontend)
        back = self._ctx.socket(zmq.DEALER)
        back.setsockopt(zmq.LINGER, 0)
        back.connect(self.backend)
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        self._ready.set()
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(20))
                if front in events:
                    self._on_request(front, back, front.recv_multipart())
                if back in events:
                    self._on_reply(front, back.recv_multipart()[-1])
                with self._lock:
                    release, self._release = self._release, False
                    held = self._held if release else []
                    if release:
                        self._held = []
                for frames in held:
                    front.send_multipart(frames)
        finally:
            front.close()
            back.close()

    def _on_request(
        self, front: zmq.Socket[bytes], back: zmq.Socket[bytes], frames: list[bytes]
    ) -> None:
        identity, body = frames[0], frames[-1]
        request = msgpack.unpackb(body, raw=False)
        method, params, rid = request["method"], dict(request.get("params") or {}), request["id"]
        hook = self.on_request
        if hook is not None:
            hook(method, params)
        with self._lock:
            fate = "forwarded"
            if method in self._answer:
                fate = "answered"
            elif method in self._drop:
                count = self._drop[method]
                fate = "dropped"
                if count is not None:
                    if count <= 1:
                        del self._drop[method]
                    else:
                        self._drop[method] = count - 1
            self.seen.append(Seen(method, params, rid, fate))
            self._routes[rid] = (identity, method)
            answer = self._answer.get(method)
        if fate == "forwarded":
            back.send(body)
        elif fate == "answered" and answer is not None:
            reply = {"v": 1, "id": rid, "status": answer[0], "error": answer[1]}
            front.send_multipart([identity, msgpack.packb(reply, use_bin_type=True)])

    def _on_reply(self, front: zmq.Socket[bytes], body: bytes) -> None:
        reply = msgpack.unpackb(body, raw=False)
        with self._lock:
            identity, method = self._routes.pop(reply.get("id"), (None, ""))
            if identity is None:
                return
            if method in self._hold:
                self._held.append([identity, body])
                return
        front.send_multipart([identity, body])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ctx.term()


def wait_until(pred: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.02)
