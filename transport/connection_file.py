"""The connection file a client uses to reach a daemon over TCP (docs/user-guide.md
"Remote access with the connection file"): the daemon's endpoints and the CURVE keys to get in.

The daemon writes them (`run/connection.json`, and `agenthost keys add`: `agenthost.keys`);
clients read them here, without importing the daemon. A JSON object:

    {"transport": "tcp", "api": ENDPOINT, "events": ENDPOINT|null, "eventsExact": ENDPOINT|null,
     "serverPublicKey": Z85, "clientPublicKey": Z85, "clientSecretKey": Z85}
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zmq.utils import z85

from transport.security import ClientCurve

CONNECTION_ENV = "AGENTHOST_CONNECTION"


class KeyError_(ValueError):
    """A key name that is invalid, taken or unknown; or an unreadable key or connection file."""


@dataclass(frozen=True, slots=True)
class Connection:
    """A parsed connection file: where the daemon listens over TCP and the keys to get in."""

    api: str
    events: str | None
    curve: ClientCurve
    events_exact: str | None = None
    """The terminated-topic events endpoint (`eventsExact`), when advertised."""


def _read_private(path: Path) -> str:
    """The file's text, refused (as ssh refuses a private key) when others may read or write
    it: it holds this client's secret key, so anyone who can read it can connect as us. The
    mode is taken from the descriptor that is read, so a swap after the check cannot slip in."""
    with open(path, "rb") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        if mode & 0o077:
            raise KeyError_(
                f"{path}: permissions {mode:04o} are too open: this connection file holds the "
                "client's CURVE secret key, and others on this machine can read it. Run "
                f"`chmod 600 {path}` (and, if someone else may have read it, mint a new key "
                "with `agenthost keys add NAME` and `agenthost keys revoke` this one)"
            )
        return f.read().decode("utf-8")


def load_connection(path: Path) -> Connection:
    """Read a connection file; `KeyError_` names the file and what is wrong with it, and
    refuses one that others may read (`_read_private`)."""
    try:
        text = _read_private(Path(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyError_(f"{path}: cannot read the connection file: {exc}") from exc
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise KeyError_(f"{path}: cannot read the connection file: {exc}") from exc
    if not isinstance(data, Mapping):
        raise KeyError_(f"{path}: a connection file is a JSON object")
    api = data.get("api")
    if not isinstance(api, str) or not api:
        raise KeyError_(f'{path}: no "api" endpoint (is the daemon listening on TCP?)')
    events = data.get("events")
    if events is not None and not isinstance(events, str):
        raise KeyError_(f'{path}: "events" must be an endpoint or null')
    events_exact = data.get("eventsExact")  # absent in files of older daemons
    if events_exact is not None and not isinstance(events_exact, str):
        raise KeyError_(f'{path}: "eventsExact" must be an endpoint or null')
    keys: list[bytes] = []
    for field in ("serverPublicKey", "clientPublicKey", "clientSecretKey"):
        value = data.get(field)
        try:
            if not isinstance(value, str) or len(z85.decode(value.encode("ascii"))) != 32:
                raise ValueError(value)
        except (ValueError, KeyError):  # z85.decode: KeyError for a byte outside its alphabet
            raise KeyError_(f"{path}: {field} must be a 40-character z85 key") from None
        keys.append(value.encode("ascii"))
    return Connection(api, events or None, ClientCurve(*keys), events_exact or None)
