"""The connection guard goes on after one of its steps fails: a guard thread that stopped would
cap nothing and close no replaced listener again (a clean-clone CI once saw it die of one
connection's `EBADF`). The failure is counted (`failures`) and logged; the next connection is
counted as before."""

from __future__ import annotations

import itertools
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from transport import connections
from transport.connections import ConnectionGuard, ConnectionLimits
from transport.endpoints import Binder

pytestmark = pytest.mark.timeout(60)

ROOMY = ConnectionLimits(
    fd_limit=1 << 20,
    fd_reserve=0,
    max_connections=100,
    max_network_connections=100,
    max_unproven=100,
)


def _until(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_failed_step_is_counted_and_the_next_connection_is_guarded(
    short_tmp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(Path(short_tmp) / "api.sock")
    real = connections.accepted_inode
    calls = itertools.count()

    def fails_once(fd: int, endpoint: str) -> int | None:
        if next(calls) == 0:
            raise RuntimeError("one event the guard cannot handle")
        return real(fd, endpoint)

    monkeypatch.setattr(connections, "accepted_inode", fails_once)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    guard = ConnectionGuard(ctx, ROOMY)
    guard.watch(router, api=True)
    Binder(None).bind(router, f"ipc://{path}")
    guard.start()
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        first.connect(path)
        _until(lambda: guard.failures == 1)
        second.connect(path)
        _until(lambda: guard.stats()["open"] == 1)  # the guard still reads and counts
    finally:
        guard.stop()
        router.close()
        ctx.term()
        first.close()
        second.close()
