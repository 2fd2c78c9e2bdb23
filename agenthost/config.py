"""Daemon configuration: `AGENTHOST_HOME` and the optional `agenthost.toml` (PROTOCOL.md
"Configuration"). Every key is optional; an unknown key is an error at start-up, named.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

PROVIDERS = ("tutti-agent", "codex", "claude-code")
_PROVIDER_KEYS: dict[str, frozenset[str]] = {
    "tutti-agent": frozenset({"command", "model", "model_base_url"}),
    "codex": frozenset({"command", "model", "model_base_url"}),
    "claude-code": frozenset({"cli_path", "model", "model_base_url", "api_key"}),
}
_TOP_KEYS = frozenset({"providers", "daemon"})
_DAEMON_KEYS = frozenset(
    {
        "listen",
        "allow_remote",
        "idle_actor_seconds",
        "fork_sync_budget_ms",
        # Resource bounds (issue 15 #5, #7; issue 14 §6), independent of the number of Sessions.
        "actor_threads",
        "store_connections",
        "max_runtimes_per_provider",
    }
)


class ConfigError(ValueError):
    """The configuration file is unreadable or names a key we do not know."""


@dataclass(frozen=True, slots=True)
class Config:
    home: Path
    providers: Mapping[str, Mapping[str, str | list[str]]] = field(default_factory=dict)
    """Per provider: string values, except `command`, which may also be an argv list."""
    listen: tuple[str, ...] = ()
    allow_remote: bool = False
    idle_actor_seconds: float = 30.0
    fork_sync_budget_s: float = 2.0
    actor_threads: int = 32
    store_connections: int = 16
    max_runtimes_per_provider: int = 64

    @property
    def store_path(self) -> Path:
        return self.home / "store.sqlite3"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def runtimes_dir(self) -> Path:
        return self.home / "runtimes"


def default_home() -> Path:
    env = os.environ.get("AGENTHOST_HOME")
    if env:
        return Path(env).expanduser().resolve()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "agenthost"


def load_config(home: Path | None = None, path: Path | None = None) -> Config:
    """`path` (`--config`) must exist; without it, `<home>/agenthost.toml` is optional."""
    home = (home or default_home()).expanduser().resolve()
    if path is not None and not path.exists():
        raise ConfigError(f"{path}: no such configuration file")
    path = path or home / "agenthost.toml"
    if not path.exists():
        return Config(home=home)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_config(home, raw, source=str(path))


def parse_config(home: Path, raw: Mapping[str, Any], *, source: str = "config") -> Config:
    _reject_unknown(raw, _TOP_KEYS, source, "")
    providers: dict[str, dict[str, str | list[str]]] = {}
    for name, table in (raw.get("providers") or {}).items():
        if name not in _PROVIDER_KEYS:
            raise ConfigError(f"{source}: unknown provider [providers.{name}]")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [providers.{name}] must be a table")
        _reject_unknown(table, _PROVIDER_KEYS[name], source, f"providers.{name}.")
        providers[name] = {
            k: _provider_value(v, source, f"providers.{name}.{k}") for k, v in table.items()
        }
    daemon = raw.get("daemon") or {}
    _reject_unknown(daemon, _DAEMON_KEYS, source, "daemon.")
    listen = daemon.get("listen") or []
    if isinstance(listen, str):
        listen = [listen]
    allow_remote = bool(daemon.get("allow_remote", False))
    for endpoint in listen:
        check_listen(str(endpoint), allow_remote, source=f"{source}: daemon.listen")
    return Config(
        home=home,
        providers=providers,
        listen=tuple(str(x) for x in listen),
        allow_remote=allow_remote,
        idle_actor_seconds=float(daemon.get("idle_actor_seconds", 30.0)),
        fork_sync_budget_s=float(daemon.get("fork_sync_budget_ms", 2000)) / 1000.0,
        actor_threads=_positive_int(daemon, "actor_threads", 32, source),
        store_connections=_positive_int(daemon, "store_connections", 16, source),
        max_runtimes_per_provider=_positive_int(daemon, "max_runtimes_per_provider", 64, source),
    )


def _positive_int(table: Mapping[str, Any], key: str, default: int, source: str) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ConfigError(
            f"{source}: [daemon] {key} must be an integer from 1 to 100000, got {value!r}"
        )
    return value


def check_listen(endpoint: str, allow_remote: bool, *, source: str = "--listen") -> None:
    """TCP listens on loopback only unless explicitly allowed (`--allow-remote` or
    `daemon.allow_remote = true`)."""
    if not endpoint.startswith("tcp://"):
        return
    host = urlparse(endpoint).hostname or ""
    if host == "localhost" or allow_remote:
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ConfigError(f"{source} {endpoint}: not a loopback address (allow it with --allow-remote)")


def _provider_value(value: Any, source: str, key: str) -> str | list[str]:
    """A string, number or boolean becomes a string; `command` may also be an argv list."""
    if key.endswith(".command") and isinstance(value, list):
        if not value or not all(isinstance(part, str) for part in value):
            raise ConfigError(f"{source}: {key} must be a string or a non-empty list of strings")
        return list(value)
    if isinstance(value, (Mapping, list)):
        raise ConfigError(f"{source}: {key} must be a string")
    return str(value)


def _reject_unknown(
    table: Mapping[str, Any], known: frozenset[str], source: str, prefix: str
) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}'")
