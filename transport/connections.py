"""What the daemon's listeners may hold: every connection libzmq accepts is counted (a socket
monitor per listening socket, read on a thread of its own), capped globally and per network
endpoint, and refused or shed before the process nears its descriptor limit.

Why: libzmq 4.3.5 aborts the process when accept() on an ipc listener fails with EMFILE
(`errno_assert` in `ipc_listener_t::accept`, src/ipc_listener.cpp:297: EMFILE is missing from
the tolerated list, unlike the tcp listener's), and it accepts every connection a peer makes,
on its own I/O thread, with no cap. So the daemon must never be at its limit while a listener
is bound: the cap and a reserve keep accepted connections far below it, a connection over the
cap is shut down at once (libzmq then closes it: its engine reads EOF), and the oldest idle one
makes room for a new one. docs/design/connections.md has the reasoning and the residual window.

The guard also closes the ipc listeners a `run/` re-bind replaced (`replaced`): each is unbound,
through the transport loop, once no connection is left on it; past `OLD_LISTENERS_KEPT` per
endpoint, the oldest ones' idle connections are shut down (their clients reconnect, to the file
there now), so a daemon whose `run/` is removed again and again keeps a bounded number of them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import resource
import socket
import stat
import struct
import sys
import termios
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from transport import accept_shim
from transport.security import needs_curve

log = logging.getLogger("transport.server")

MIN_FD_RESERVE = 96
"""Descriptors never given to connections: the store's connections (3 each), worker links and
spawns (pipes), log files, module imports, the ZeroMQ context's own."""
IDLE_S = 1.0
"""A connection that delivered a message this recently is not idle (never shed)."""
_SUMMARY_S = 5.0
_FD_SAMPLE_S = 0.1
_POLL_MS = 200
_FAILURE_LOG_S = 60.0
"""At most one logged failure of the guard's loop a minute (each is counted: `failures`)."""
OLD_LISTENERS_KEPT = 2
"""Listeners a re-bind replaced that are kept per endpoint while connections are left on them;
past it, the oldest ones' idle connections are shut down so the listener can be closed."""
REPLACED_GRACE_S = 1.0
"""A replaced listener is never unbound sooner: a connection made just before its file went
(in its backlog) is accepted, and its `accepted` event read, by then."""

# A monitor event's first frame: the event (uint16) and its value, here a descriptor (int32).
_HEAD = struct.Struct("=Hi")
_NOBLOCK = int(zmq.NOBLOCK)
_ACCEPTED = int(zmq.EVENT_ACCEPTED)
_ACCEPT_FAILED = int(zmq.EVENT_ACCEPT_FAILED)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
# No EVENT_CLOSED: on a socket that only binds it is a listener's close, never a connection's
# (whose descriptor number another socket's connection may hold by the time it is read).
_EVENTS = int(
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_ACCEPT_FAILED
    | zmq.EVENT_MONITOR_STOPPED
)


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (bounded by the kernel's `nr_open`);
    return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = _nr_open()
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 1 << 20


def open_fds() -> int:
    """Descriptors this process holds (a failing count reads as 'at the limit')."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 1 << 30


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Caps derived from the descriptor limit (see `for_fd_limit`)."""

    fd_limit: int
    fd_reserve: int
    """Descriptors connections never take; past `fd_limit - fd_reserve` in use, every new
    connection is refused."""
    max_connections: int
    """Accepted connections held by all listeners together."""
    max_network_connections: int
    """Per network (CURVE) endpoint."""
    max_unproven: int
    """Per network API endpoint: connections that have not yet delivered a message (an
    unfinished or refused CURVE handshake, or an authenticated client not yet talking)."""

    @property
    def accept_reserve(self) -> int:
        """The top descriptor numbers no accepted connection ever holds: the accept shim closes
        one accepted there at once, before libzmq owns it (half the reserve; 0: none)."""
        return self.fd_reserve // 2

    @classmethod
    def for_fd_limit(cls, fd_limit: int) -> ConnectionLimits:
        """A third of what the reserve leaves goes to connections; the rest is margin for
        what libzmq accepts between our reading its monitor and shedding."""
        reserve = max(MIN_FD_RESERVE, fd_limit // 4)
        total = max(8, (fd_limit - reserve) // 3)
        return cls(
            fd_limit=fd_limit,
            fd_reserve=reserve,
            max_connections=total,
            max_network_connections=max(4, total // 4),
            max_unproven=max(2, min(64, total // 16)),
        )


@dataclass(slots=True)
class _Replaced:
    """A listener a re-bind replaced: its address (what libzmq knows it by), its endpoint."""

    address: str
    endpoint: str
    since: float


class Connection:
    """One accepted connection, keyed by its descriptor (libzmq's monitor reports the fd)."""

    __slots__ = ("fd", "endpoint", "network", "api", "inode", "accepted", "last_active", "peer")

    def __init__(self, fd: int, endpoint: str, api: bool, inode: int, now: float) -> None:
        self.fd = fd
        self.endpoint = endpoint
        self.network = needs_curve(endpoint)
        self.api = api
        self.inode = inode
        self.accepted = now
        self.last_active = 0.0
        """When it last delivered a message (0: never); written by the transport loop."""
        self.peer: bytes | None = None
        """Its ROUTER routing id once it sent a request (transport loop)."""


def _unread_input(fd: int) -> bool:
    """Whether bytes wait in the socket's receive queue (a request libzmq has not read yet)."""
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return False
    return int.from_bytes(buf, sys.byteorder) > 0


def accepted_inode(fd: int, endpoint: str) -> int | None:
    """The inode of the connection libzmq accepted on `endpoint` as `fd`, while `fd` still
    holds it: a socket that is not listening, whose local address is the endpoint's. None when
    the descriptor was closed since or reused by anything else.

    Why: the guard reads an `accepted` event after libzmq's I/O thread accepted, on another
    thread, and the kernel hands a closed descriptor's number to the next one made: an ipc
    listener bound again after `run/` was removed (`endpoints.rebind_missing`) takes the
    lowest free number, often one a dropped connection just freed. Taken for the connection,
    a listener would be shut down when the guard refuses or sheds it; libzmq's listener is
    blocking, so it then polls readable and accept4() fails with EINVAL, on which libzmq
    asserts (`ipc_listener.cpp:297`, SIGABRT). The inode is read first and the socket checked
    after: if the number changed hands in between, the inode names a closed socket, which
    `_shutdown`'s inode check never matches (docs/design/connections.md)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    # Family and type as given are not checked by the constructor; getsockname decodes the
    # address by its own family.
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
    except OSError:
        return None  # closed by libzmq since the fstat (a client that came and went at once)
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return None  # a listener
        if not _local_address_is(sock.getsockname(), endpoint):
            return None
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor stays libzmq's
    return st.st_ino


def _shutdown_socket(fd: int, inode: int) -> bool:
    """shutdown(SHUT_RDWR) on `fd` if it is the socket of that inode."""
    try:
        # Family and type given: no getsockopt calls to detect them (shutdown ignores both).
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_ino != inode:
            return False
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.detach()  # the descriptor stays its owner's


def _local_address_is(name: Any, endpoint: str) -> bool:
    """A connection accepted on `endpoint` has the listener's address as its own."""
    transport, _, address = endpoint.partition("://")
    if transport == "ipc":
        if address.startswith("@"):
            return bool(name == b"\0" + address[1:].encode())
        return bool(name == address)
    if transport == "tcp":
        return isinstance(name, tuple) and str(name[1]) == address.rsplit(":", 1)[-1]
    return True  # no other transport is bound by the daemon


class ConnectionGuard:
    """Counts and caps the connections of the sockets it watches; see the module docstring.

    `watch` each listening socket (on its owner's thread, before its first bind), `start`, then
    the transport loop calls `active(fd, peer)` for every message it reads; `busy(peer)` tells
    the guard a connection is waiting on its replies (never shed). `stop` before the watched
    sockets close. `replaced(address, endpoint)` hands over a listener a re-bind replaced;
    `unbind(address)` is called (on the guard's thread) when it is to be unbound.
    """

    def __init__(
        self,
        ctx: zmq.Context[Any],
        limits: ConnectionLimits,
        busy: Callable[[bytes], bool] = lambda peer: False,
        unbind: Callable[[str], object] | None = None,
    ) -> None:
        self.limits = limits
        self._ctx = ctx
        self._busy = busy
        self._unbind = unbind
        # Per listener address (the monitor's endpoint frame): connections accepted minus
        # those disconnected, from the monitor's own order — stale events included, unlike
        # `conns` (a connection closed before its `accepted` is read is counted, then not).
        self._held: dict[bytes, int] = {}
        self._replaced_lock = threading.Lock()
        self._replaced_new: list[_Replaced] = []
        self._replaced: list[_Replaced] = []
        self.listeners_closed = 0
        """Replaced listeners unbound (tests read it)."""
        self.conns: dict[int, Connection] = {}
        self._order: OrderedDict[int, Connection] = OrderedDict()
        # Per network endpoint, in accept order: its connections, and those not yet proven
        # (an entry proven since is skipped when met): O(1) per accept under a flood.
        self._network: dict[str, OrderedDict[int, Connection]] = {}
        self._unproven: dict[str, OrderedDict[int, Connection]] = {}
        self._early: dict[int, tuple[float, bytes | None]] = {}
        self._monitors: list[tuple[zmq.Socket[bytes], bool]] = []
        self._stop = threading.Event()
        # Written by `stop`: the guard's poll wakes at once rather than at its next timeout
        # (a daemon's stop waited up to `_POLL_MS` here).
        self._wake: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._binding = threading.Lock()
        self._thread: threading.Thread | None = None
        self._fds = 0
        self._fds_at = 0.0
        self.refused: Counter[str] = Counter()
        """Connections shut down at once, by why (whole life; host.status and tests read it)."""
        self.shed = 0
        """Idle connections shut down to make room for a new one."""
        self.stale = 0
        """`accepted` events read after their descriptor no longer held that connection
        (`accepted_inode`): not counted, never shut down."""
        self.failures = 0
        """Steps of the guard's loop that failed (an event it could not handle); it went on."""
        self._reported: Counter[str] = Counter()
        self._reported_shed = 0
        self._summary_at = 0.0

    def watch(self, sock: zmq.Socket[Any], *, api: bool) -> None:
        """Monitor `sock`'s accepted connections (call before it binds, on its thread)."""
        addr = f"inproc://agenthost-monitor-{id(self):x}-{len(self._monitors)}"
        sock.monitor(addr, _EVENTS)
        monitor: zmq.Socket[bytes] = self._ctx.socket(zmq.PAIR)
        # Unbounded before connecting: libzmq sends monitor events without blocking and drops
        # them at a full pipe, and a dropped `accepted` would be a connection never counted.
        monitor.setsockopt(zmq.RCVHWM, 0)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(addr)
        self._monitors.append((monitor, api))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agenthost-connections", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._wake is not None:
            os.eventfd_write(self._wake, 1)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            self._close_monitors()

    def _close_monitors(self) -> None:
        for monitor, _ in self._monitors:
            with contextlib.suppress(zmq.ZMQError):
                monitor.close(linger=0)
        self._monitors.clear()
        wake, self._wake = self._wake, None
        if wake is not None:
            os.close(wake)

    def binding(self) -> threading.Lock:
        """Held (`with guard.binding():`) while a watched socket binds once the guard runs: at
        the descriptor limit the guard shuts a connection down by its number, and a listener
        made between its check and its shutdown could take that number (`_shutdown`)."""
        return self._binding

    # -- the transport loop's side -----------------------------------------------------------

    def active(self, fd: int, peer: bytes | None) -> None:
        conn = self.conns.get(fd)
        if conn is None:
            # Its `accepted` event is not read yet: remembered, so the guard does not take a
            # client that is already talking for an idle newcomer.
            self._early[fd] = (time.monotonic(), peer)
            return
        conn.last_active = time.monotonic()
        if peer is not None:
            conn.peer = peer

    def stats(self) -> dict[str, Any]:
        """For host.status: what is held, what was refused and shed, and the limits."""
        return {
            "open": len(self.conns),
            "max": self.limits.max_connections,
            "refused": sum(self.refused.values()),
            "shed": self.shed,
            "fdLimit": self.limits.fd_limit,
            "fdReserve": self.limits.fd_reserve,
            "acceptReserve": self.limits.accept_reserve,
            "refusedAtAccept": accept_shim.refused_at_accept(),
        }

    # -- the guard thread --------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        for monitor, _ in self._monitors:
            poller.register(monitor, zmq.POLLIN)
        api_of = {monitor: api for monitor, api in self._monitors}
        if self._wake is not None:
            poller.register(self._wake, zmq.POLLIN)
        logged_at = float("-inf")
        while not self._stop.is_set():
            try:
                for sock, _ in poller.poll(_POLL_MS):
                    if sock in api_of:
                        self._drain(sock, api_of[sock])
                self._tick()
            except Exception:  # noqa: BLE001 - the guard must never take the daemon down
                # One event or tick failed: the guard goes on (a guard that stopped would cap
                # nothing and close no replaced listener again), logged at most once a minute,
                # and after a pause, so a monitor that keeps failing cannot spin the thread.
                self.failures += 1
                now = time.monotonic()
                if now - logged_at >= _FAILURE_LOG_S:
                    logged_at = now
                    log.exception(
                        "connection guard: a step failed (%d so far); going on", self.failures
                    )
                self._stop.wait(_POLL_MS / 1000)

    def _drain(self, monitor: zmq.Socket[Any], api: bool) -> None:
        # Parsed by hand (pyzmq's parser builds an enum per event): the guard must keep up with
        # libzmq's accepts, one Python thread against its I/O thread.
        for _ in range(10_000):
            try:
                frames = monitor.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2 or len(frames[0]) < _HEAD.size:
                continue
            event, fd = _HEAD.unpack_from(frames[0])
            address = frames[1]
            if event == _ACCEPTED:
                self._held[address] = self._held.get(address, 0) + 1
                self._accepted(fd, address.decode(errors="replace"), api)
            elif event == _DISCONNECTED:
                self._held[address] = self._held.get(address, 0) - 1
                self._forget(fd)
            elif event == _ACCEPT_FAILED:
                # ECONNABORTED: the accept shim closed it, accepted into the reserve.
                why = "descriptor reserve" if fd == errno.ECONNABORTED else "accept failed"
                self.refused[why] += 1

    def _forget(self, fd: int) -> Connection | None:
        self._order.pop(fd, None)
        conn = self.conns.pop(fd, None)
        if conn is not None and conn.network:
            for index in (self._network, self._unproven):
                group = index.get(conn.endpoint)
                if group is not None:
                    group.pop(fd, None)
        return conn

    def _accepted(self, fd: int, endpoint: str, api: bool) -> None:
        now = time.monotonic()
        inode = accepted_inode(fd, endpoint)
        if inode is None:
            # Closed by libzmq since, and the number maybe reused (a listener bound again,
            # another socket, a file): nothing of it is ours to count or ever shut down.
            self.stale += 1
            return
        self._forget(fd)  # a reused descriptor: its old connection is gone
        conn = Connection(fd, endpoint, api, inode, now)
        early = self._early.pop(fd, None)
        if early is not None:
            conn.last_active, conn.peer = early
        self.conns[fd] = self._order[fd] = conn
        limits = self.limits
        if self._fds_in_use(now) >= limits.fd_limit - limits.fd_reserve:
            self._refuse(conn, "descriptors")
            return
        if conn.network:
            mine = self._network.setdefault(endpoint, OrderedDict())
            mine[fd] = conn
            unproven = self._unproven.setdefault(endpoint, OrderedDict())
            if api and conn.last_active == 0.0:
                unproven[fd] = conn
            while len(unproven) > limits.max_unproven:
                _, oldest = unproven.popitem(last=False)
                if oldest.last_active == 0.0:
                    # The oldest unfinished handshake goes: a real client finishes in ms.
                    self._refuse(oldest, f"pending handshakes on {endpoint}")
                    if oldest is conn:
                        return
            if len(mine) > limits.max_network_connections and not self._shed_idle(now, endpoint):
                if not self._talking(conn, now):
                    self._refuse(conn, f"cap of {endpoint}")
                return
        # A client already talking keeps its connection (the margin covers it): its replies
        # would be lost with it.
        if (
            len(self.conns) > limits.max_connections
            and not self._shed_idle(now, None)
            and not self._talking(conn, now)
        ):
            self._refuse(conn, "connection cap")

    def _talking(self, conn: Connection, now: float) -> bool:
        """Delivered a message lately, or waits on its replies (never shed)."""
        if now - conn.last_active < IDLE_S:
            return True
        return conn.peer is not None and self._busy(conn.peer)

    def _shed_idle(self, now: float, endpoint: str | None) -> bool:
        """Shut the oldest idle connection (of `endpoint`, or any) down; False if none is."""
        scope = self._order if endpoint is None else self._network.get(endpoint, OrderedDict())
        newest = next(reversed(self._order), None)  # the one just accepted: never shed
        while True:
            victim = None
            for fd, conn in scope.items():
                if fd == newest:
                    break
                if self._talking(conn, now):
                    continue
                if _unread_input(conn.fd):
                    continue  # a request on its way in: not idle
                victim = conn
                break
            if victim is None:
                return False
            if self._shutdown(victim):
                self.shed += 1
                return True

    def _refuse(self, conn: Connection, why: str) -> None:
        self._shutdown(conn)
        self.refused[why] += 1

    def _shutdown(self, conn: Connection) -> bool:
        """Shut `conn`'s socket down (libzmq reads EOF and closes it), if its descriptor still
        holds the socket accepted: libzmq may have closed it and the number been reused.

        Checked and shut down through a duplicate of the descriptor, taken first: it keeps
        naming what the number held then, whatever becomes of the number (a listener any
        thread makes on it is never touched). At the descriptor limit no duplicate can be
        made; then the number itself is checked and shut down under `binding()`, so that no
        re-bound API listener can take it in between."""
        self._forget(conn.fd)
        try:
            dup = os.dup(conn.fd)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                with self._binding:
                    return _shutdown_socket(conn.fd, conn.inode)
            return False  # closed
        try:
            return _shutdown_socket(dup, conn.inode)
        finally:
            os.close(dup)

    def _fds_in_use(self, now: float) -> int:
        if now - self._fds_at >= _FD_SAMPLE_S:
            self._fds, self._fds_at = open_fds(), now
        return self._fds

    # -- listeners a re-bind replaced -------------------------------------------------------

    def replaced(self, address: str, endpoint: str) -> None:
        """A re-bind of `endpoint` replaced its listener bound at `address` (any thread): it is
        unbound once no connection is left on it (`_close_replaced`)."""
        with self._replaced_lock:
            self._replaced_new.append(_Replaced(address, endpoint, time.monotonic()))

    def _close_replaced(self, now: float) -> None:
        """Unbind each replaced listener no connection is left on; past `OLD_LISTENERS_KEPT`
        per endpoint, shut the oldest ones' idle connections down (their ZeroMQ clients
        reconnect, to the endpoint's file, as any shed client does).

        Never one that holds a connection: unbinding ends the connections the listener
        accepted (libzmq terminates its sessions), only once the transport loop next calls
        into the socket, and what a client sends meanwhile is dropped
        (docs/design/connections.md). A listener whose file is gone gains no connection but
        from its backlog, accepted within the grace period; the monitors are read to the end
        before the count is trusted."""
        if self._replaced_new:
            with self._replaced_lock:
                self._replaced.extend(self._replaced_new)
                self._replaced_new.clear()
        due = [r for r in self._replaced if now - r.since >= REPLACED_GRACE_S]
        if not due or self._unbind is None:
            return
        for monitor, api in self._monitors:
            self._drain(monitor, api)
        held: dict[str, list[_Replaced]] = {}
        for r in due:  # oldest first
            key = r.address.encode()
            if self._held.get(key, 0) > 0:
                held.setdefault(r.endpoint, []).append(r)
                continue
            self._replaced.remove(r)
            self._held.pop(key, None)
            self.listeners_closed += 1
            log.info(
                "closing the listener %s of %s: replaced after its file was removed, and no "
                "connection is left on it",
                r.address,
                r.endpoint,
            )
            self._unbind(r.address)
        for kept in held.values():
            for r in kept[: max(0, len(kept) - OLD_LISTENERS_KEPT)]:
                self._move_idle(r.address, now)

    def _move_idle(self, address: str, now: float) -> None:
        """Shut down the idle connections accepted on `address` (never one talking, waiting on
        its replies, or with a request in its receive queue)."""
        for conn in [c for c in self._order.values() if c.endpoint == address]:
            if self._talking(conn, now) or _unread_input(conn.fd):
                continue
            if self._shutdown(conn):
                self.shed += 1

    def _tick(self) -> None:
        now = time.monotonic()
        limits = self.limits
        if self._replaced or self._replaced_new:
            self._close_replaced(now)
        # Still at the threshold (the daemon's own use grew): idle connections make room.
        if self._fds_in_use(now) >= limits.fd_limit - limits.fd_reserve:
            for _ in range(16):
                if not self._shed_idle(now, None):
                    break
        if now - self._summary_at < _SUMMARY_S:
            return
        self._summary_at = now
        new = self.refused - self._reported
        shed = self.shed - self._reported_shed
        if new or shed:
            what = ", ".join(f"{why}: {n}" for why, n in sorted(new.items())) or "none"
            log.warning(
                "connections refused in the last %.0f s: %s; idle connections shed: %d;"
                " held %d of %d, descriptors %d of %d (reserve %d)",
                _SUMMARY_S,
                what,
                shed,
                len(self.conns),
                limits.max_connections,
                self._fds,
                limits.fd_limit,
                limits.fd_reserve,
            )
            self._reported = Counter(self.refused)
            self._reported_shed = self.shed
