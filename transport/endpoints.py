"""Binding the daemon's sockets: ipc socket files (created 0600 in a 0700 run dir, a stale file
of a dead process removed, a live one refused) and the bind order of mixed NULL/CURVE lists."""

from __future__ import annotations

import contextlib
import errno
import logging
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

log = logging.getLogger(__name__)


class EndpointInUse(RuntimeError):
    """An ipc endpoint is already served by a live process (another daemon)."""


class Binder:
    """Binds endpoints for one server and remembers the ipc files to remove at close, and the
    listeners a re-bind replaced (`rebind`), until they are unbound (`unbind`)."""

    def __init__(self, curve: ServerCurve | None) -> None:
        self._curve = curve
        self.ipc_files: list[str] = []
        # Per ipc endpoint: its listeners, oldest first, each as (socket, the address libzmq
        # knows it by); the last one is the endpoint's file.
        self._listeners: dict[str, list[tuple[zmq.Socket[Any], str]]] = {}
        self._replaced: list[tuple[str, str]] = []

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
            if path not in self.ipc_files:
                self.ipc_files.append(path)
            self._listeners.setdefault(endpoint, []).append((sock, endpoint))
            # The run dir is already 0700; the socket file gets 0600 as the contract says.
            os.chmod(path, 0o600)
            return endpoint
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        return last.decode() if isinstance(last, bytes) else str(last)

    def rebind(self, sock: zmq.Socket[Any], endpoint: str) -> str:
        """Bind the ipc `endpoint` again (its file was removed): a new listener on `sock`, under
        an address of its own, linked into the endpoint's path; the address returned. The
        listeners it replaces stay bound (connections made through them keep working) and are
        handed out by `take_replaced`, to be unbound once nothing uses them.

        Why an address of its own: libzmq knows a listener by the address it was bound to
        (`zmq_unbind` terminates every listener of the socket bound to the string given), and a
        listener bound again at the same path would share it with the ones it replaces, so
        none of them could be unbound alone. So the new listener is bound at a spare name
        beside the endpoint's file (`.api.1`, no longer than `api.sock`), which is then
        hard-linked (or, where links are refused, renamed) to the endpoint's path and removed:
        clients reach it at the usual path, and libzmq knows it, and its connections, by the
        spare name. Where neither can be done, it is bound at the path itself spelled with a
        doubled slash (`_path_alias`): the same file, an address of its own."""
        path = ipc_path(endpoint)
        if path is None:
            raise ValueError(f"{endpoint}: only a file-backed ipc endpoint is bound again")
        prepare_ipc_path(path)
        mine = self._listeners.setdefault(endpoint, [])
        taken = {address for _, address in mine}
        n = 1
        while (spare := _spare_endpoint(path, n)) in taken:
            n += 1
        spare_path = spare[len("ipc://") :]
        configure_bind(sock, spare, self._curve)
        sock.bind(spare)  # libzmq unlinks a file left at that name first
        try:
            os.chmod(spare_path, 0o600)
            _link_into_place(spare_path, path)
        except BaseException as exc:
            with contextlib.suppress(zmq.ZMQError):
                sock.unbind(spare)
            if not isinstance(exc, OSError):
                raise
            # Neither linked nor renamed into place: bound at the path itself, under a spelling
            # of it no other listener holds.
            log.warning("%s cannot be linked or renamed (%s): bound at an alias of it", path, exc)
            prepare_ipc_path(path)  # never over a live daemon's socket
            spare = _path_alias(path, taken)
            configure_bind(sock, spare, self._curve)
            sock.bind(spare)
            os.chmod(path, 0o600)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spare_path)
        if path not in self.ipc_files:
            self.ipc_files.append(path)
        if mine:
            self._replaced.append((mine[-1][1], endpoint))  # the older ones were handed out
        mine.append((sock, spare))
        return spare

    def take_replaced(self) -> list[tuple[str, str]]:
        """(address, endpoint) of each listener a `rebind` replaced since the last call."""
        out, self._replaced = self._replaced, []
        return out

    def unbind(self, address: str) -> bool:
        """Unbind a replaced listener by its address (libzmq closes it, and any connection it
        still holds); False if no replaced listener has that address."""
        for listeners in self._listeners.values():
            current = listeners[-1][1]
            for i, (sock, bound) in enumerate(listeners[:-1]):
                # Never at the current listener's address (after a re-bind at the path itself,
                # the first listener shares it).
                if bound == address and address != current:
                    del listeners[i]
                    sock.unbind(address)
                    return True
        return False

    def remove_ipc_files(self) -> None:
        for path in self.ipc_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.ipc_files.clear()
        self._listeners.clear()
        self._replaced.clear()


def rebind_missing(binder: Binder, bound: list[tuple[Any, list[str]]]) -> list[str]:
    """Bind each (socket, its endpoints) again on every ipc endpoint whose file has gone; the
    endpoints bound anew (`Binder.rebind`). The old listener stays until nothing uses it: the
    connections it accepted still work (a connected Unix socket needs no file)."""
    again: list[str] = []
    for sock, endpoints in bound:
        for endpoint in endpoints:
            path = ipc_path(endpoint)
            if sock is not None and path is not None and not os.path.exists(path):
                binder.rebind(sock, endpoint)
                again.append(endpoint)
    return again


def _spare_endpoint(path: str, n: int) -> str:
    """`ipc://<dir>/.api.<n>` for `<dir>/api.sock`: a name no longer than the endpoint's own
    while n < 1000, so it fits wherever the endpoint does."""
    head, name = os.path.split(path)
    stem = name[: -len(".sock")] if name.endswith(".sock") else name
    return f"ipc://{os.path.join(head, f'.{stem}.{n}')}"


def _path_alias(path: str, taken: set[str]) -> str:
    """`ipc://<dir>//api.sock` (then `///`, ...): the endpoint's own file, spelled so that libzmq,
    which knows a listener by the string it was bound to (and the kernel, which reports the
    path as bound), tells it from every listener in `taken`. The last resort of a re-bind where
    the spare name can be neither linked nor renamed into place: the listener is reached at the
    usual path and can still be unbound alone. Each extra slash makes the name one byte longer;
    past the kernel's 107 the bind fails as any too-long ipc path does."""
    head, name = os.path.split(path)
    n = 2
    while (alias := f"ipc://{head}{'/' * n}{name}") in taken:
        n += 1
    return alias


def _link_into_place(spare: str, path: str) -> None:
    """Give the socket at `spare` the name `path` too; never over a live daemon's socket (a
    stale file there is removed, as at a first bind). Where the hard link is refused (a file
    system without them, a sandbox denying `link`), the file is renamed into place instead:
    the listener keeps its own address all the same, so it too can be unbound alone. Unlike
    the link, the rename is not atomic against a socket made at `path` after the check; the
    home's lock, held all along, keeps any other daemon of the home from making one."""
    try:
        os.link(spare, path)
    except FileExistsError:
        prepare_ipc_path(path)  # raises EndpointInUse for a live one
        os.link(spare, path)
    except OSError as exc:
        log.warning("%s cannot be hard-linked (%s): renamed into place", path, exc)
        prepare_ipc_path(path)
        os.rename(spare, path)


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
