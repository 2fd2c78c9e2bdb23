"""pyzmq's socket option calls without an enum call each.

`zmq.backend.Socket.get` and `.set` (pyzmq 27, its Cython backend) first classify the option as
`SocketOption(option)`: an `EnumType.__call__` and an `Enum.__new__`, two Python frames (~1 µs
here) at every `zmq.EVENTS` or `zmq.RCVMORE` look. A streamed delta takes three such looks on
the worker supervisor's thread (the link's `RCVMORE` and `EVENTS`, the XPUB's `EVENTS` after
its send) and one on the worker's reader thread (deltapath, docs/performance.md). `install`
puts, in the backend's module namespace only, a lookup of the very same members in the enum's
own value map in place of that name: a known option gives the same member (so the same
`_opt_type`), an unknown one raises `ValueError` as the enum call does, and nothing else of pyzmq
or its callers changes. Where the backend is not that module (a pyzmq without it, or one that
no longer looks the name up) it does nothing.

Installed by the daemon's and the worker's ZeroMQ modules (`transport.worker_link`,
`transport.server`), not by the client (`transport.client`): a benchmark's client is compared
with a bare provider's.
"""

from __future__ import annotations

import importlib
from typing import Any

_installed = False


class _Options(dict[int, Any]):
    """`SocketOption`'s members by value; a value it lacks raises as `SocketOption(v)` does."""

    def __missing__(self, key: int) -> Any:
        raise ValueError(f"{key!r} is not a valid SocketOption")


def install() -> bool:
    """Replace the backend's `SocketOption` name by the member lookup (once); True when the
    lookup is in place."""
    global _installed
    if _installed:
        return True
    try:
        backend = importlib.import_module("zmq.backend.cython._zmq")
        from zmq.constants import SocketOption
    except ImportError:
        return False
    if getattr(backend, "SocketOption", None) is not SocketOption:
        return False
    members = _Options(SocketOption._value2member_map_)
    if not members:
        return False
    setattr(backend, "SocketOption", members.__getitem__)  # noqa: B010 - a module attribute
    _installed = True
    return True
