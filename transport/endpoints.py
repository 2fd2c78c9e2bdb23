"""Binding the daemon's sockets: ipc socket files (created 0600 in a 0700 run dir, a stale file
of a dead process removed, a live one refused) and the bind order of mixed NULL/CURVE lists."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from typing import Any

import zmq

from transport.security import (
    InsecureEndpoint,
    ServerCurve,
    bind_order,
    configure_bind,
    is_loopback,
    needs_curve,
)


class EndpointInUse(RuntimeError):
    """An ipc endpoint is already served by a live process (another daemon)."""


class Binder:
    """Binds endpoints for one server and remembers the ipc files to remove at close."""

    def __init__(self, curve: ServerCurve | None) -> None:
        self._curve = curve
        self.ipc_files: list[str] = []

    def bind_each(self, sock: zmq.Socket[Any], endpoints: list[str]) -> list[str]:
        """Bind every endpoint (NULL ones first, see `configure_bind`); the bound addresses in
        the order given."""
        bound = list(endpoints)
        for i in bind_order(endpoints):
            bound[i] = self.bind(sock, endpoints[i])
        return bound

    def bind(self, sock: zmq.Socket[Any], endpoint: str) -> str:
        path = ipc_path(endpoint)
        if path is not None:
            prepare_ipc_path(path)
        if self._curve is None and needs_curve(endpoint) and not is_loopback(endpoint):
            # `allow_remote` is only ever honoured behind CURVE.
            raise InsecureEndpoint(f"{endpoint}: a non-loopback endpoint needs CURVE keys")
        configure_bind(sock, endpoint, self._curve)
        sock.bind(endpoint)
        if path is not None:
            if path not in self.ipc_files:  # bound again after its directory was removed
                self.ipc_files.append(path)
            # The run dir is already 0700; the socket file gets 0600 as the contract says.
            os.chmod(path, 0o600)
            return endpoint
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        return last.decode() if isinstance(last, bytes) else str(last)

    def remove_ipc_files(self) -> None:
        for path in self.ipc_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.ipc_files.clear()


def rebind_missing(binder: Binder, bound: list[tuple[Any, list[str]]]) -> list[str]:
    """Bind each (socket, its endpoints) again on every ipc endpoint whose file has gone; the
    endpoints bound anew. The old listener stays: unbinding it would drop the connections it
    accepted, which still work (a connected Unix socket needs no file)."""
    again: list[str] = []
    for sock, endpoints in bound:
        for endpoint in endpoints:
            path = ipc_path(endpoint)
            if sock is not None and path is not None and not os.path.exists(path):
                binder.bind(sock, endpoint)
                again.append(endpoint)
    return again


def ipc_path(endpoint: str) -> str | None:
    if not endpoint.startswith("ipc://"):
        return None
    path = endpoint[len("ipc://") :]
    if not path or path.startswith("@"):
        return None  # abstract namespace: no file
    return path


def prepare_ipc_path(path: str) -> None:
    """Create the run dir 0700 and refuse to steal a socket a live process still serves."""
    run_dir = os.path.dirname(os.path.abspath(path))
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)  # makedirs' mode is masked by umask; the contract says 0700
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise EndpointInUse(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            os.unlink(path)  # stale socket of a process that died
            return
        raise
    finally:
        probe.close()
    raise EndpointInUse(f"{path} is served by another live process")
