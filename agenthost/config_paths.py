"""The address checks of the configuration: a TCP listen endpoint is loopback unless remote
access is allowed, and every ipc socket path (an endpoint's, the home's own `run/api.sock` and
`run/events.sock`) fits a Unix socket address (`IPC_PATH_MAX`)."""

from __future__ import annotations

import ipaddress
import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from agenthost.config_values import ConfigError
from domain.home_layout import API_SOCKET, EVENTS_SOCKET

if TYPE_CHECKING:
    from agenthost.config_schema import Config

# Linux `sun_path` is 108 bytes with its terminating NUL: an ipc endpoint's path must fit.
IPC_PATH_MAX = 107


def check_listen(endpoint: str, allow_remote: bool, *, source: str = "--listen") -> None:
    """TCP listens on loopback only unless explicitly allowed (`--allow-remote` or
    `daemon.allow_remote = true`); an ipc path must fit a Unix socket address."""
    if endpoint.startswith("ipc://"):
        check_ipc_length(endpoint[len("ipc://") :], f"{source} {endpoint}")
        return
    if not endpoint.startswith("tcp://"):
        raise ConfigError(f"{source} {endpoint}: not a tcp:// or ipc:// endpoint")
    try:
        parsed = urlparse(endpoint)
        host = parsed.hostname or ""
        # `*` asks the system for a free port; anything else must be a port number.
        port = parsed.port if not endpoint.endswith(":*") else 1
    except ValueError as exc:
        raise ConfigError(f"{source} {endpoint}: not a valid tcp:// endpoint ({exc})") from None
    if port is None or not 1 <= port <= 65535:
        raise ConfigError(
            f"{source} {endpoint}: needs a port from 1 to 65535 (tcp://127.0.0.1:7777), or * "
            "for any free one"
        )
    if host == "localhost" or allow_remote:
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ConfigError(f"{source} {endpoint}: not a loopback address (allow it with --allow-remote)")


def check_ipc_length(path: str, what: str) -> None:
    if path.startswith("@"):
        return  # abstract: refused for other reasons (agenthost.home.check_ipc_endpoint)
    size = len(os.fsencode(os.path.abspath(path)))
    if size > IPC_PATH_MAX:
        raise ConfigError(
            f"{what}: the socket path is {size} bytes, over the {IPC_PATH_MAX}-byte limit of a "
            "Unix socket address; use a shorter path"
        )


def check_home_paths(config: Config) -> None:
    """The home's own ipc sockets must fit a Unix socket address; checked before anything is
    created, so a too-long `AGENTHOST_HOME` leaves no half-made home behind."""
    for name in (API_SOCKET, EVENTS_SOCKET):
        path = config.run_dir / name
        size = len(os.fsencode(str(path)))
        if size > IPC_PATH_MAX:
            longest = len(os.fsencode(str(config.run_dir / EVENTS_SOCKET)))
            raise ConfigError(
                f"AGENTHOST_HOME {config.home} is too long: its socket {path} would be "
                f"{size} bytes, over the {IPC_PATH_MAX}-byte limit of a Unix socket path; "
                f"choose a home at least {longest - IPC_PATH_MAX} bytes shorter "
                "(--home or AGENTHOST_HOME, e.g. ~/.agenthost)"
            )
