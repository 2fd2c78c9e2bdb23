"""The child process of `test_listener_fd_reuse`: a connection guard reads an `accepted` event
after that connection's descriptor number went to an ipc listener bound again (as after `run/`
was removed), and the guard refuses "the connection". Real ZeroMQ sockets, the real guard and
the real re-bind (`endpoints.rebind_missing`); only the moment the guard reads its monitor is
chosen, by starting its thread late, where in the daemon a busy machine chooses it.

Exits 0 when the listener still accepts a connection afterwards, 1 when it does not, 2 when the
descriptor did not go to the listener (the scenario was not reached); libzmq aborts the process
(SIGABRT, `Invalid argument (src/ipc_listener.cpp:…)`) when the guard shut the listener down.
Run: `python listener_reuse_child.py <short dir>` with the repository on PYTHONPATH."""

from __future__ import annotations

import os
import resource
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from transport.connections import ConnectionGuard, ConnectionLimits
from transport.endpoints import Binder, rebind_missing

REFUSE_ALL = ConnectionLimits(
    fd_limit=1 << 20, fd_reserve=0, max_connections=0, max_network_connections=0, max_unproven=0
)
"""A cap of no connection: the guard refuses (shuts down) whatever it counts."""


def _sockets() -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                out.add(int(name))
        except OSError:
            continue
    return out


def _listening(fd: int) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
    try:
        return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    finally:
        sock.detach()


def _until(ok: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def main(run: Path) -> int:
    path = str(run / "api.sock")
    endpoint = f"ipc://{path}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    guard = ConnectionGuard(ctx, REFUSE_ALL)
    guard.watch(router, api=True)
    binder = Binder(None)
    binder.bind(router, endpoint)

    # A raw connection libzmq accepts as descriptor N, then drops (it reads EOF) and closes.
    before = _sockets()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    _until(lambda: _sockets() - before - {client.fileno()}, "libzmq's accept")
    (accepted,) = _sockets() - before - {client.fileno()}
    client.shutdown(socket.SHUT_RDWR)
    _until(lambda: accepted not in _sockets(), "libzmq to close the dropped connection")
    # N is made the lowest free number, as a burst of dropped connections leaves it.
    held = []
    while (probe := os.open(os.devnull, os.O_RDONLY)) < accepted:  # the lowest free number
        held.append(probe)
    os.close(probe)
    # `run/` removed: the endpoint is bound again on the same socket; the new listener is N.
    os.unlink(path)
    # (No `guard.binding()`: the guard's thread does not run yet; and the same child runs
    # against a guard without it, to show the abort.)
    again = rebind_missing(binder, [(router, [endpoint])])
    if again != [endpoint] or not _listening(accepted):
        print(f"descriptor {accepted} did not go to the new listener", file=sys.stderr)
        return 2
    # Only now does the guard read the `accepted` event of descriptor N.
    guard.start()
    # (`stale` read leniently, for the same reason.)
    read = lambda: getattr(guard, "stale", 0) + sum(guard.refused.values())  # noqa: E731
    _until(lambda: read() > 0, "the guard to read the event")
    print(f"guard: stale={getattr(guard, 'stale', None)} refused={dict(guard.refused)}", flush=True)
    # The listener still listens: a new connection gets through the kernel (a listener shut
    # down refuses it) and libzmq accepts it (the guard sees it, and refuses it in turn).
    refused = sum(guard.refused.values())
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        _until(lambda: sum(guard.refused.values()) > refused, "libzmq to accept", timeout=5)
        served = True
    except (ConnectionRefusedError, SystemExit) as exc:
        print(f"not accepted: {exc!r}", flush=True)
        served = False
    print(f"served: {served}", flush=True)
    guard.stop()
    router.close()
    ctx.term()
    for fd in held:
        os.close(fd)
    probe.close()
    client.close()
    return 0 if served else 1


def at_the_limit(run: Path) -> int:
    """At the descriptor limit the guard cannot duplicate a descriptor to shut it down; it then
    shuts the number down under `binding()`, so not while a listener is being bound. Exits 0
    when the refusal waited for the bind, 1 when it did not."""
    path = str(run / "api.sock")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    guard = ConnectionGuard(ctx, REFUSE_ALL)
    guard.watch(router, api=True)
    router.bind(f"ipc://{path}")
    before = _sockets()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    _until(lambda: _sockets() - before - {client.fileno()}, "libzmq's accept")
    # No free descriptor below the soft limit: every dup() fails with EMFILE.
    top = max(int(n) for n in os.listdir("/proc/self/fd"))
    held = []
    while (probe := os.open(os.devnull, os.O_RDONLY)) < top:  # each the lowest free number
        held.append(probe)
    os.close(probe)
    limit = probe  # every number below it is in use
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    client.settimeout(0.5)
    waited = True
    with guard.binding():  # a bind in progress
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        guard.start()
        try:
            while client.recv(64):  # libzmq's greeting; EOF would be the guard's shutdown
                pass
            waited = False
        except TimeoutError:
            pass
        waited = waited and sum(guard.refused.values()) == 0
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    client.settimeout(10)
    try:
        while client.recv(64):  # refused once the bind is done: EOF
            pass
        _until(lambda: sum(guard.refused.values()) == 1, "the refusal")
        refused = True
    except (TimeoutError, SystemExit):
        refused = False
    print(f"waited for the bind: {waited}; refused after it: {refused}", flush=True)
    guard.stop()
    router.close()
    ctx.term()
    for fd in held:
        os.close(fd)
    client.close()
    return 0 if waited and refused else 1


if __name__ == "__main__":
    run = Path(sys.argv[1])
    sys.exit(at_the_limit(run) if sys.argv[2:] == ["at-the-limit"] else main(run))
