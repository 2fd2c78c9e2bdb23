"""Connection floods against a daemon's listeners (real sockets): ZeroMQ clients that finish
their handshake and then idle, raw connections that never send a byte (a handshake never
finished: on ipc, or on a CURVE TCP endpoint without a key), held open for a while."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import zmq


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Flood:
    """What a flood opened; `held` counts the connections the daemon had not refused when the
    flood finished connecting (a refused one may still have connected first)."""

    attempted: int = 0
    held: int = 0
    sockets: list[socket.socket] = field(default_factory=list)


@contextlib.contextmanager
def raw_flood(address: str | tuple[str, int], count: int) -> Iterator[Flood]:
    """`count` raw connections to an ipc path (str) or a TCP (host, port), never sending; a
    connection refused (reset, full backlog) is counted out, not retried."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    flood = Flood()
    try:
        for _ in range(count):
            flood.attempted += 1
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(0.5)
            try:
                s.connect(address)
            except OSError:
                s.close()
                continue
            flood.sockets.append(s)
        flood.held = len(flood.sockets)
        yield flood
    finally:
        for s in flood.sockets:
            s.close()


@contextlib.contextmanager
def dealer_flood(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, count: int
) -> Iterator[list[zmq.Socket[bytes]]]:
    """`count` ZeroMQ DEALERs connected to `endpoint` (their handshake completes), idle; a
    connection the daemon sheds is remade by ZeroMQ itself, as a real client's would be."""
    dealers: list[zmq.Socket[bytes]] = []
    try:
        for _ in range(count):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            dealers.append(s)
        yield dealers
    finally:
        for s in dealers:
            s.close()
