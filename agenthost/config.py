"""Daemon configuration: `AGENTHOST_HOME` and the optional `agenthost.toml` (PROTOCOL.md
"Configuration"). Every key is optional; an unknown key is an error at start-up, named.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

PROVIDERS = ("tutti-agent", "codex", "claude-code")
# Model credentials and wire keys (issue 17): `api_key_env` names the variable holding the key
# (read by the provider at turn time, never stored); `api_key` is the less safe in-file key.
_MODEL_KEYS = frozenset({"model", "model_base_url", "api_key_env", "api_key"})
_PROVIDER_KEYS: dict[str, frozenset[str]] = {
    "tutti-agent": frozenset({"command", "wire_api", "instructions"}) | _MODEL_KEYS,
    "codex": frozenset({"command", "use_user_login"}) | _MODEL_KEYS,
    "claude-code": frozenset({"cli_path", "use_user_login"}) | _MODEL_KEYS,
}
WIRE_APIS = ("responses", "chat")
_TOP_KEYS = frozenset({"providers", "daemon"})
_DAEMON_KEYS = frozenset(
    {
        "listen",
        "events_listen",
        "allow_remote",
        "idle_actor_seconds",
        "fork_sync_budget_ms",
        # Reliability limits (docs/reliability.md): how long a write waits for SQLite's lock,
        # how long a Turn's durable writes are retried before it settles `failed`, how long a
        # Turn may stay silent before its runtime is stopped, and the fork budgets.
        "store_busy_timeout_ms",
        "store_retry_limit_seconds",
        "turn_inactivity_seconds",
        "turn_interrupt_seconds",
        "fork_provider_call_seconds",
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
    events_listen: tuple[str, ...] = ()
    """Extra events (PUB) endpoints; like `listen`, a tcp one is CURVE-only."""
    allow_remote: bool = False
    idle_actor_seconds: float = 30.0
    fork_sync_budget_s: float = 2.0
    actor_threads: int = 32
    store_connections: int = 16
    max_runtimes_per_provider: int = 64
    store_busy_timeout_ms: int = 10_000
    store_retry_limit_s: float = 120.0
    turn_inactivity_s: float = 1800.0
    turn_interrupt_s: float = 10.0
    fork_provider_call_s: float = 60.0

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
    config = parse_config(home, raw, source=str(path))
    check_secret_file(path, config)
    return config


def check_secret_file(path: Path, config: Config) -> None:
    """A key written in the file (`api_key`) is only accepted from a file nobody else can read
    (mode 0600 or stricter): the daemon refuses to start otherwise, naming the reason."""
    holders = [name for name, table in config.providers.items() if "api_key" in table]
    if not holders:
        return
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(
            f"{path}: [providers.{holders[0]}] api_key is set but the file is mode "
            f"{mode:04o}; a file holding a key must be 0600 (chmod 600 {path}), or use "
            "api_key_env to name an environment variable instead"
        )


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
        _check_model_keys(providers[name], source, f"providers.{name}.")
    daemon = raw.get("daemon") or {}
    _reject_unknown(daemon, _DAEMON_KEYS, source, "daemon.")
    listen = daemon.get("listen") or []
    if isinstance(listen, str):
        listen = [listen]
    events_listen = daemon.get("events_listen") or []
    if isinstance(events_listen, str):
        events_listen = [events_listen]
    allow_remote = bool(daemon.get("allow_remote", False))
    for endpoint in listen:
        check_listen(str(endpoint), allow_remote, source=f"{source}: daemon.listen")
    for endpoint in events_listen:
        check_listen(str(endpoint), allow_remote, source=f"{source}: daemon.events_listen")
    return Config(
        home=home,
        providers=providers,
        listen=tuple(str(x) for x in listen),
        events_listen=tuple(str(x) for x in events_listen),
        allow_remote=allow_remote,
        idle_actor_seconds=float(daemon.get("idle_actor_seconds", 30.0)),
        fork_sync_budget_s=float(daemon.get("fork_sync_budget_ms", 2000)) / 1000.0,
        actor_threads=_positive_int(daemon, "actor_threads", 32, source),
        store_connections=_positive_int(daemon, "store_connections", 16, source),
        max_runtimes_per_provider=_positive_int(daemon, "max_runtimes_per_provider", 64, source),
        store_busy_timeout_ms=_positive(daemon, "store_busy_timeout_ms", 10_000, source, int),
        store_retry_limit_s=_positive(daemon, "store_retry_limit_seconds", 120.0, source, float),
        turn_inactivity_s=_positive(daemon, "turn_inactivity_seconds", 1800.0, source, float),
        turn_interrupt_s=_positive(daemon, "turn_interrupt_seconds", 10.0, source, float),
        fork_provider_call_s=_positive(daemon, "fork_provider_call_seconds", 60.0, source, float),
    )


def _positive_int(table: Mapping[str, Any], key: str, default: int, source: str) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ConfigError(
            f"{source}: [daemon] {key} must be an integer from 1 to 100000, got {value!r}"
        )
    return value


def _positive(table: Mapping[str, Any], key: str, default: Any, source: str, kind: type) -> Any:
    """A positive number of the key's kind, or a named ConfigError (never a traceback)."""
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{source}: [daemon] {key} must be a positive number, got {value!r}")
    return kind(value)


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


def _check_model_keys(table: Mapping[str, Any], source: str, prefix: str) -> None:
    wire = table.get("wire_api")
    if wire is not None and wire not in WIRE_APIS:
        raise ConfigError(f"{source}: {prefix}wire_api must be one of {', '.join(WIRE_APIS)}")
    var = table.get("api_key_env")
    if var is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(var)):
        raise ConfigError(f"{source}: {prefix}api_key_env must name an environment variable")
    login = table.get("use_user_login")
    if login is not None and login not in ("True", "False", "true", "false"):
        raise ConfigError(f"{source}: {prefix}use_user_login must be true or false")


def _reject_unknown(
    table: Mapping[str, Any], known: frozenset[str], source: str, prefix: str
) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}'")
