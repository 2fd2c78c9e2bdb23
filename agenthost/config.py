"""Daemon configuration: `AGENTHOST_HOME` and the optional `agenthost.toml` (PROTOCOL.md
"Configuration"), typed and validated against one declarative schema.

Every key of every table has exactly one `Key` in `SCHEMA`: its table, name, type (with its
range), default and one line of documentation. `parse_config` checks the whole file against
it; any mistake is a `ConfigError` naming the file, table, key, what was expected and what was
given, e.g. `agenthost.toml: [daemon] allow_remote must be a boolean (true/false), got the
string "false"` (the CLI exits 2 with it; never a traceback).

To add a key: append one `Key(...)` to `SCHEMA` (a new `[table]` is simply a new table name),
document it in docs/user-guide.md "Configuration keys" (a test checks every key is there),
and read it with `config.get("table", "key")`: validated, or the default when absent.
Provider tables (`[providers.<name>]`) are handed to that provider's worker as given (`str`
values, `command` may be an argv list) in `config.providers`.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from domain.home_layout import default_home as default_home  # the home's place: shared
from domain.providers import PROVIDERS

WIRE_APIS = ("responses", "chat")
_ENV_NAME = "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
_MODEL_DOC = {
    "tutti-agent": 'model name sent to `model_base_url` (default "mock-model")',
    "codex": "model name written into each config.toml",
    "claude-code": "model name passed to the CLI",
}
_URL_DOC = {
    "tutti-agent": "the model API (Responses or Chat Completions); absent = the built-in model",
    "codex": "the model API Codex talks to",
    "claude-code": "`ANTHROPIC_BASE_URL`",
}

# Linux `sun_path` is 108 bytes with its terminating NUL: an ipc endpoint's path must fit.
IPC_PATH_MAX = 107


class ConfigError(ValueError):
    """The configuration is unreadable, names a key we do not know, or has a wrong value."""


# -- value types ---------------------------------------------------------------------------


def describe(value: Any) -> str:
    """What the user wrote, in TOML's words: `the string "false"`, `the integer -5`."""
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, list):
        return f"the array {json.dumps(value, default=str)[:80]}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return f"the date/time {value.isoformat()}"
    return f"a {type(value).__name__}"


class ValueType:
    """A key's type and range: `check` returns the value to use or raises `ValueError` whose
    text is what was expected (the caller adds the file, table, key and what was given)."""

    def expected(self) -> str:
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Bool(ValueType):
    def expected(self) -> str:
        return "a boolean (true/false)"

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(self.expected())
        return value


@dataclass(frozen=True)
class Int(ValueType):
    """An integer in [min, max] (TOML integer; `true` and `2.0` are not integers)."""

    min: int
    max: int
    unit: str = ""

    def expected(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"an integer from {self.min} to {self.max}{unit}"

    def check(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(self.expected())
        if not self.min <= value <= self.max:
            raise ValueError(self.expected())
        return int(value)


@dataclass(frozen=True)
class Number(ValueType):
    """An integer or a float in [min, max]; returned as a float."""

    min: float
    max: float
    unit: str = ""

    def expected(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"a number from {self.min:g} to {self.max:g}{unit}"

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(self.expected())
        if not math.isfinite(value) or not self.min <= value <= self.max:
            raise ValueError(self.expected())
        return float(value)


@dataclass(frozen=True)
class Str(ValueType):
    """A non-empty string (at most `max_len` characters), optionally one of `choices`."""

    choices: tuple[str, ...] = ()
    max_len: int = 4096
    pattern: str = ""
    """A regular expression the whole string must match (described by `what`)."""
    what: str = ""

    def expected(self) -> str:
        if self.choices:
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        if self.what:
            return self.what
        return "a non-empty string"

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not value or len(value) > self.max_len:
            raise ValueError(self.expected())
        if self.choices and value not in self.choices:
            raise ValueError(self.expected())
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise ValueError(self.expected())
        return value


@dataclass(frozen=True)
class Url(ValueType):
    """An absolute http(s) URL."""

    def expected(self) -> str:
        return 'an http(s) URL such as "http://127.0.0.1:8080/v1"'

    def check(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(self.expected())
        try:
            parsed = urlparse(value)
            parsed.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ValueError(self.expected()) from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(self.expected())
        return value


@dataclass(frozen=True)
class Command(ValueType):
    """A command line: a string (split like a shell would) or a non-empty argv array."""

    def expected(self) -> str:
        return "a command: a non-empty string or a non-empty array of strings"

    def check(self, value: Any) -> str | list[str]:
        if isinstance(value, str) and value.strip():
            return value
        if (
            isinstance(value, list)
            and value
            and all(isinstance(part, str) and part for part in value)
        ):
            return list(value)
        raise ValueError(self.expected())


@dataclass(frozen=True)
class Endpoints(ValueType):
    """ZeroMQ endpoints: one string or an array of them, each `tcp://…` or `ipc://…`."""

    def expected(self) -> str:
        return 'an endpoint or an array of endpoints ("tcp://HOST:PORT" or "ipc://PATH")'

    def check(self, value: Any) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(
            isinstance(x, str) and x.startswith(("tcp://", "ipc://")) and len(x) > 6 for x in items
        ):
            raise ValueError(self.expected())
        return tuple(items)


# -- the schema ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    table: str
    """`daemon`, `providers.codex`, …: the TOML table the key lives in."""
    name: str
    type: ValueType
    default: Any
    """Used when the key is absent (`None`: absent means "not configured")."""
    doc: str
    secret: bool = False
    """Never echo the value in an error (a key pasted into the wrong place stays unprinted)."""


SCHEMA: tuple[Key, ...] = (
    # [daemon]
    Key("daemon", "listen", Endpoints(), (), "extra API endpoints, beside the home's ipc socket"),
    Key(
        "daemon",
        "events_listen",
        Endpoints(),
        (),
        "extra events (PUB) endpoints; like `listen`, a `tcp://` one is CURVE-only",
    ),
    Key(
        "daemon",
        "events_exact_listen",
        Endpoints(),
        (),
        "extra endpoints of the events socket whose topic is `workspaceId` + NUL (CURVE on tcp)",
    ),
    Key("daemon", "allow_remote", Bool(), False, "allow a non-loopback `tcp://` listen address"),
    Key(
        "daemon",
        "idle_actor_seconds",
        Number(0.1, 86400.0, "seconds"),
        30.0,
        "a Session's actor stops after this long idle",
    ),
    Key(
        "daemon",
        "fork_sync_budget_ms",
        Int(0, 600_000, "ms"),
        2000,
        "`fork.create` answers 202 `accepted` after this long",
    ),
    # Reliability limits (docs/reliability.md): how long a write waits for SQLite's lock, how
    # long a Turn's durable writes are retried before it settles `failed`, how long a Turn may
    # stay silent before its runtime is stopped, and the fork budgets.
    Key(
        "daemon",
        "store_busy_timeout_ms",
        Int(1, 3_600_000, "ms"),
        10_000,
        "a write waits this long for SQLite's lock, then answers 503 `store_busy`",
    ),
    Key(
        "daemon",
        "store_retry_limit_seconds",
        Number(0.01, 86_400.0, "seconds"),
        120.0,
        "a Turn's durable writes are retried this long before it settles `failed`",
    ),
    Key(
        "daemon",
        "turn_inactivity_seconds",
        Number(0.1, 604_800.0, "seconds"),
        1800.0,
        "a Turn silent this long has its runtime stopped and settles `failed`",
    ),
    Key(
        "daemon",
        "turn_interrupt_seconds",
        Number(0.1, 3600.0, "seconds"),
        10.0,
        "an interrupt the provider does not acknowledge in this long stops the runtime",
    ),
    Key(
        "daemon",
        "fork_provider_call_seconds",
        Number(0.1, 86_400.0, "seconds"),
        60.0,
        "the worker's limit for the provider's fork call (the host waits longer)",
    ),
    # Resource bounds (issue 15 #5, #7; issue 14 §6), independent of the number of Sessions.
    Key(
        "daemon",
        "actor_threads",
        Int(1, 100_000),
        32,
        "threads shared by every Session actor",
    ),
    Key(
        "daemon",
        "store_connections",
        Int(1, 100_000),
        16,
        "SQLite connections the daemon opens at most",
    ),
    Key(
        "daemon",
        "max_runtimes_per_provider",
        Int(1, 100_000),
        64,
        "live provider runtimes per provider; turns beyond it queue, idle ones stop LRU first",
    ),
    Key(
        "daemon",
        "max_runtime_starts_per_provider",
        Int(1, 100_000),
        4,
        "provider runtimes being started at once per provider; further cold turns queue",
    ),
    # Providers. Model credentials and wire keys (issue 17): `api_key_env` names the variable
    # holding the key (read by the provider at turn time, never stored); `api_key` is the less
    # safe in-file key (the file must then be 0600).
    *(
        key
        for provider in PROVIDERS
        for key in (
            (
                Key(f"providers.{provider}", "cli_path", Str(), None, "default: the SDK's CLI")
                if provider == "claude-code"
                else Key(
                    f"providers.{provider}",
                    "command",
                    Command(),
                    None,
                    "default: the installed script"
                    if provider == "tutti-agent"
                    else "default: the pinned install, then PATH",
                )
            ),
            Key(f"providers.{provider}", "model", Str(), None, _MODEL_DOC[provider]),
            Key(f"providers.{provider}", "model_base_url", Url(), None, _URL_DOC[provider]),
            Key(
                f"providers.{provider}",
                "api_key_env",
                Str(pattern=r"[A-Za-z_][A-Za-z0-9_]*", what=_ENV_NAME),
                None,
                "the environment variable holding the model API key (read at turn time)",
                secret=True,
            ),
            Key(
                f"providers.{provider}",
                "api_key",
                Str(),
                None,
                "the model API key itself (the file must be 0600; prefer `api_key_env`)",
                secret=True,
            ),
        )
    ),
    Key(
        "providers.tutti-agent",
        "wire_api",
        Str(choices=WIRE_APIS),
        None,
        'the model API\'s wire format (default "responses")',
    ),
    Key("providers.tutti-agent", "instructions", Str(), None, "system instructions for the model"),
    Key(
        "providers.codex",
        "use_user_login",
        Bool(),
        False,
        "use the user's own Codex login instead of a key",
    ),
    Key(
        "providers.claude-code",
        "use_user_login",
        Bool(),
        False,
        "use the user's own Claude login instead of a key",
    ),
)


def schema_tables() -> dict[str, dict[str, Key]]:
    tables: dict[str, dict[str, Key]] = {}
    for key in SCHEMA:
        tables.setdefault(key.table, {})[key.name] = key
    return tables


def _defaults() -> dict[str, dict[str, Any]]:
    return {
        table: {name: key.default for name, key in keys.items()}
        for table, keys in schema_tables().items()
        if not table.startswith("providers.")
    }


# -- the parsed configuration --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    home: Path
    providers: Mapping[str, Mapping[str, str | list[str]]] = field(default_factory=dict)
    """Per provider, the keys given: strings, except `command`, which may be an argv list."""
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=_defaults)
    """Every non-provider table of `SCHEMA`, validated, defaults filled in."""

    def get(self, table: str, key: str) -> Any:
        """A validated value (or its default); an undeclared key is a programming error."""
        values = self.tables.get(table)
        if values is not None and key in values:
            return values[key]
        declared = schema_tables().get(table, {}).get(key)
        if declared is None:
            raise KeyError(f"[{table}] {key} is not declared in agenthost.config.SCHEMA")
        return declared.default

    @property
    def listen(self) -> tuple[str, ...]:
        return tuple(self.get("daemon", "listen"))

    @property
    def events_listen(self) -> tuple[str, ...]:
        """Extra events (PUB) endpoints; like `listen`, a tcp one is CURVE-only."""
        return tuple(self.get("daemon", "events_listen"))

    @property
    def events_exact_listen(self) -> tuple[str, ...]:
        """Extra endpoints of the terminated-topic events socket (issue 15 #9)."""
        return tuple(self.get("daemon", "events_exact_listen"))

    @property
    def allow_remote(self) -> bool:
        return bool(self.get("daemon", "allow_remote"))

    @property
    def idle_actor_seconds(self) -> float:
        return float(self.get("daemon", "idle_actor_seconds"))

    @property
    def fork_sync_budget_s(self) -> float:
        return int(self.get("daemon", "fork_sync_budget_ms")) / 1000.0

    @property
    def store_busy_timeout_ms(self) -> int:
        return int(self.get("daemon", "store_busy_timeout_ms"))

    @property
    def store_retry_limit_s(self) -> float:
        return float(self.get("daemon", "store_retry_limit_seconds"))

    @property
    def turn_inactivity_s(self) -> float:
        return float(self.get("daemon", "turn_inactivity_seconds"))

    @property
    def turn_interrupt_s(self) -> float:
        return float(self.get("daemon", "turn_interrupt_seconds"))

    @property
    def fork_provider_call_s(self) -> float:
        return float(self.get("daemon", "fork_provider_call_seconds"))

    @property
    def actor_threads(self) -> int:
        return int(self.get("daemon", "actor_threads"))

    @property
    def store_connections(self) -> int:
        return int(self.get("daemon", "store_connections"))

    @property
    def max_runtimes_per_provider(self) -> int:
        return int(self.get("daemon", "max_runtimes_per_provider"))

    @property
    def max_runtime_starts_per_provider(self) -> int:
        return int(self.get("daemon", "max_runtime_starts_per_provider"))

    @property
    def store_path(self) -> Path:
        return self.home / "store.sqlite3"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def runtimes_dir(self) -> Path:
        return self.home / "runtimes"


def _absolute(path: Path) -> Path:
    # Not resolve(): a home that is a symlink must stay visible as one (it is refused).
    return Path(os.path.abspath(path.expanduser()))


def load_config(home: Path | None = None, path: Path | None = None) -> Config:
    """`path` (`--config`) must exist; without it, `<home>/agenthost.toml` is optional."""
    home = _absolute(home or default_home())
    if path is not None and not path.exists():
        raise ConfigError(f"{path}: no such configuration file")
    path = path or home / "agenthost.toml"
    if not path.exists():
        return Config(home=home)
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
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
    tables = schema_tables()
    known_top = sorted({t.split(".")[0] for t in tables})
    values: dict[str, dict[str, Any]] = _defaults()
    providers: dict[str, dict[str, str | list[str]]] = {}
    for top, content in raw.items():
        if top not in known_top:
            raise ConfigError(
                f"{source}: unknown table or key {json.dumps(top)} (known: {', '.join(known_top)})"
            )
        if not isinstance(content, Mapping):
            raise ConfigError(f"{source}: [{top}] must be a table, got {describe(content)}")
        if top == "providers":
            for name, table in content.items():
                if f"providers.{name}" not in tables:
                    raise ConfigError(
                        f"{source}: unknown provider [providers.{name}] "
                        f"(known: {', '.join(PROVIDERS)})"
                    )
                if not isinstance(table, Mapping):
                    raise ConfigError(
                        f"{source}: [providers.{name}] must be a table, got {describe(table)}"
                    )
                providers[name] = _check_table(f"providers.{name}", table, tables, source)
        else:
            values[top] = {**values.get(top, {}), **_check_table(top, content, tables, source)}
    config = Config(home=home, providers=providers, tables=values)
    for endpoint in config.listen:
        check_listen(endpoint, config.allow_remote, source=f"{source}: [daemon] listen")
    for endpoint in config.events_listen:
        check_listen(endpoint, config.allow_remote, source=f"{source}: [daemon] events_listen")
    for endpoint in config.events_exact_listen:
        check_listen(
            endpoint, config.allow_remote, source=f"{source}: [daemon] events_exact_listen"
        )
    return config


def _check_table(
    table: str, content: Mapping[str, Any], tables: Mapping[str, Mapping[str, Key]], source: str
) -> dict[str, Any]:
    keys = tables[table]
    out: dict[str, Any] = {}
    for name, value in content.items():
        key = keys.get(name)
        if key is None:
            raise ConfigError(
                f"{source}: [{table}] unknown key {json.dumps(name)} "
                f"(known: {', '.join(sorted(keys))})"
            )
        try:
            out[name] = key.type.check(value)
        except ValueError as exc:
            got = describe(value)
            if key.secret and isinstance(value, str):
                got = f"a string of {len(value)} characters (not shown)"
            raise ConfigError(f"{source}: [{table}] {name} must be {exc}, got {got}") from None
    return out


def check_listen(endpoint: str, allow_remote: bool, *, source: str = "--listen") -> None:
    """TCP listens on loopback only unless explicitly allowed (`--allow-remote` or
    `daemon.allow_remote = true`); an ipc path must fit a Unix socket address."""
    if endpoint.startswith("ipc://"):
        check_ipc_length(endpoint[len("ipc://") :], f"{source} {endpoint}")
        return
    if not endpoint.startswith("tcp://"):
        raise ConfigError(f"{source} {endpoint}: not a tcp:// or ipc:// endpoint")
    try:
        host = urlparse(endpoint).hostname or ""
    except ValueError:
        raise ConfigError(f"{source} {endpoint}: not a valid tcp:// endpoint") from None
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
    for name in ("api.sock", "events.sock"):
        path = config.run_dir / name
        size = len(os.fsencode(str(path)))
        if size > IPC_PATH_MAX:
            longest = len(os.fsencode(str(config.run_dir / "events.sock")))
            raise ConfigError(
                f"AGENTHOST_HOME {config.home} is too long: its socket {path} would be "
                f"{size} bytes, over the {IPC_PATH_MAX}-byte limit of a Unix socket path; "
                f"choose a home at least {longest - IPC_PATH_MAX} bytes shorter "
                "(--home or AGENTHOST_HOME, e.g. ~/.agenthost)"
            )


def markdown_rows() -> list[str]:
    """One docs/user-guide.md table row per key (`| key | type and range | default | doc |`)."""
    rows = []
    for key in SCHEMA:
        default = "—" if key.default is None else f"`{_toml(key.default)}`"
        rows.append(f"| `{key.table}.{key.name}` | {key.type.expected()} | {default} | {key.doc} |")
    return rows


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":  # `python -m agenthost.config`: the rows for docs/user-guide.md
    print("\n".join(markdown_rows()))
