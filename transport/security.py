"""ZeroMQ CURVE security for the network endpoints.

Everything here is libzmq's own CURVE (CurveZMQ) and pyzmq's `zmq.auth` ZAP handler; this
module only decides which endpoints need it and carries the keys. An ipc endpoint keeps the
NULL mechanism (its file mode is its protection); every other transport (tcp, ws, ...) is a
CURVE server whose clients must present a public key the `authorize` callback accepts, or the
ZAP handler refuses the handshake: the peer's frames are never delivered to the socket.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import zmq

if TYPE_CHECKING:
    # Imported by `start_authenticator` alone: it loads asyncio, which a daemon serving only
    # ipc endpoints (no CURVE) would otherwise import at every start.
    from zmq.auth.thread import ThreadAuthenticator

ZAP_DOMAIN = "agenthost"
NETWORK_HANDSHAKE_MS = 5000
"""How long a network connection may take to finish its CURVE handshake before libzmq drops it
(its default, 30 s, lets an unauthenticated flood pile up; a real client takes milliseconds)."""
_DEFAULT_HANDSHAKE_MS = 30_000


def needs_curve(endpoint: str) -> bool:
    """True for an endpoint another machine (or user) can reach without file permissions."""
    return not (endpoint.startswith("ipc://") or endpoint.startswith("inproc://"))


def is_loopback(endpoint: str) -> bool:
    """True for a tcp endpoint on 127/8, ::1 or localhost."""
    if not endpoint.startswith("tcp://"):
        return False
    host = urlparse(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class InsecureEndpoint(ValueError):
    """A network endpoint other hosts can reach, asked for without CURVE keys."""


@dataclass(frozen=True, slots=True)
class ServerCurve:
    """The daemon's CURVE identity and the test a client's public key must pass."""

    secret_key: bytes
    """z85 secret key of the server."""
    authorize: Callable[[bytes], bool]
    """Called by the ZAP thread with a client's z85 public key at each new connection."""


@dataclass(frozen=True, slots=True)
class ClientCurve:
    """What a client needs to reach a CURVE endpoint: the server's public key and its own pair
    (all z85)."""

    server_public_key: bytes
    public_key: bytes
    secret_key: bytes

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make `sock` a CURVE client; call before `connect`."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)


def configure_bind(sock: zmq.Socket[Any], endpoint: str, curve: ServerCurve | None) -> None:
    """Set the security mechanism for the next `bind` of `sock` to `endpoint`.

    libzmq copies a socket's options into each listener when it binds, so one ROUTER or PUB
    can serve ipc with NULL and tcp with CURVE: set, bind, set again, bind again. (libzmq
    refuses to reset ZAP_DOMAIN to empty, so bind the NULL endpoints first: `bind_order`.)
    """
    if curve is not None and needs_curve(endpoint):
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret_key)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        sock.setsockopt(zmq.HANDSHAKE_IVL, NETWORK_HANDSHAKE_MS)
    else:
        sock.setsockopt(zmq.CURVE_SERVER, 0)  # the NULL mechanism
        sock.setsockopt(zmq.HANDSHAKE_IVL, _DEFAULT_HANDSHAKE_MS)


def bind_order(endpoints: list[str]) -> list[int]:
    """Indexes of `endpoints`, the NULL (ipc) ones first, each group in the given order."""
    return sorted(range(len(endpoints)), key=lambda i: needs_curve(endpoints[i]))


class _Provider:
    """The `credentials_provider` zmq.auth calls for each CURVE handshake."""

    def __init__(self, authorize: Callable[[bytes], bool]) -> None:
        self._authorize = authorize

    def callback(self, domain: str, key: bytes) -> bool:
        try:
            return domain == ZAP_DOMAIN and bool(self._authorize(key))
        except Exception:  # noqa: BLE001 - a failing check denies; the ZAP thread lives on
            return False


def start_authenticator(ctx: zmq.Context[Any], curve: ServerCurve) -> ThreadAuthenticator:
    """Start pyzmq's ZAP handler on `ctx`. It must run before any CURVE endpoint is bound: a
    CURVE server with no ZAP handler accepts every client that knows its public key."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx, log=None)
    auth.start()
    auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_Provider(curve.authorize))
    return auth
