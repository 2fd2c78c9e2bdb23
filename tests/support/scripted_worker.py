"""A scripted stand-in for a driver worker, run as a program with the arguments a supervisor
gives `python -m drivers.worker` (only `--connect ENDPOINT` is read): a real PAIR that says
hello, then does exactly what each request asks and sends no heartbeat, so a frame the host
leaves unread stays unread. The supervisor's loop tests and `bench.supervisor_deltas` run it in
place of a worker, through a `python` shim (`shim`).

Requests: `burst {sid, n, pauseMs}` (one delta, a pause, the other n - 1 back to back, then the
answer), `stream {sid, n, every}` (answered at once; n deltas from a thread of their own, a
millisecond's pause after every `every`-th, then a `turn.completed`); anything else is answered
`{"method": …}`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq


def shim(directory: Path) -> Path:
    """An executable `python` in `directory` that runs this program with the arguments a
    supervisor gives its workers."""
    python = directory / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    python.chmod(0o755)
    return python


class Scripted:
    def __init__(self, endpoint: str) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context().socket(zmq.PAIR)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(endpoint)
        self.lock = threading.Lock()  # the socket is shared with a stream's thread

    def send(self, msg: dict[str, Any]) -> None:
        with self.lock:
            self.sock.send(msgpack.packb(msg, use_bin_type=True))

    def delta(self, sid: str, i: int) -> None:
        event = {"type": "message.delta", "turnId": "t", "itemId": "i", "kind": "assistant"}
        self.send({"t": "evt", "agentSessionId": sid, "event": {**event, "delta": str(i)}})

    def stream(self, sid: str, n: int, every: int) -> None:
        for i in range(n):
            self.delta(sid, i)
            if every and i % every == 0:
                time.sleep(0.001)
        end = {"type": "turn.completed", "turnId": "t", "providerTurnId": "p"}
        self.send({"t": "evt", "agentSessionId": sid, "event": {**end, "outcome": "completed"}})

    def serve(self) -> None:
        self.send({"t": "hello", "provider": "scripted", "pid": os.getpid(), "version": "1"})
        parent = os.getppid()
        while os.getppid() == parent:  # ends with the host that spawned it
            with self.lock:  # never held while waiting: a stream's thread sends between looks
                try:
                    frame: bytes | None = self.sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    frame = None
            if frame is None:
                time.sleep(0.0005)
                continue
            msg = msgpack.unpackb(frame, raw=False)
            if msg.get("t") == "req":
                self.answer(msg["id"], msg["method"], msg["params"])

    def answer(self, req_id: int, method: str, params: dict[str, Any]) -> None:
        if method == "burst":
            # One delta, a pause (the host's loop is held in its sink meanwhile), then the
            # rest back to back and the answer: they all arrive while the loop is away.
            self.delta(params["sid"], 0)
            time.sleep(params["pauseMs"] / 1000)
            for i in range(1, params["n"]):
                self.delta(params["sid"], i)
        elif method == "stream":
            args = (params["sid"], params["n"], params["every"])
            threading.Thread(target=self.stream, args=args, daemon=True).start()
        self.send({"t": "res", "id": req_id, "ok": True, "result": {"method": method}})


if __name__ == "__main__":
    Scripted(sys.argv[sys.argv.index("--connect") + 1]).serve()
