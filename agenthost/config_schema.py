"""The configuration schema and the parsed configuration: every key of every table as one `Key`
in `SCHEMA` (table, name, type and range, default, one line of documentation), the defaults
it gives, the docs/user-guide.md rows generated from it, and `Config`, the validated values
with their typed accessors. To add a key: append one `Key(...)` to `SCHEMA`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agenthost.config_values import (
    Bool,
    Command,
    Endpoints,
    Int,
    Key,
    Number,
    Str,
    Strings,
    Url,
)
from domain.claude_warm import DEFAULT_WARM_CLIS, DEFAULT_WARM_IDLE_S
from domain.model_limits import (
    DEFAULT_FIRST_BYTE_S,
    DEFAULT_RETRIES,
    DEFAULT_STREAM_IDLE_S,
    FIRST_BYTE_KEY,
    RETRIES_KEY,
    STREAM_IDLE_KEY,
)
from domain.providers import CODEX, PROVIDERS, TUTTI_AGENT
from workspace.shadow import DEFAULT_EXCLUDES, DEFAULT_SIZE_LIMIT

WIRE_APIS = ("responses", "chat")
READABILITY_PROOFS = ("in_worker", "app_server")
"""The app-server driver's `readability_proof` values (drivers/app_server/fork.py), its default
first."""
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
        "provider_stopped_seconds",
        Number(0.1, 86_400.0, "seconds"),
        30.0,
        "a Turn whose provider process stays stopped (SIGSTOP), or whose Codex app-server "
        "answers nothing, this long settles `failed`",
    ),
    Key(
        "daemon",
        "provider_write_seconds",
        Number(0.1, 86_400.0, "seconds"),
        None,
        "a write to an app-server (Codex, tutti-agent) that takes no byte this long kills it; "
        "default: twice `provider_stopped_seconds`",
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
    # Resource bounds, independent of the number of Sessions.
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
        # 2 at least: the store's one writer connection and a reader (a write reads too).
        Int(2, 100_000),
        16,
        "SQLite connections the daemon opens at most (its writer and readers)",
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
    Key(
        "daemon",
        "workers_ahead",
        Bool(),
        True,
        "start the configured, installed providers' workers once the daemon is ready",
    ),
    # Workspace checkpoints (docs/design/workspace.md): the files of each Turn's `cwd`.
    Key(
        "workspace",
        "checkpoints",
        Bool(),
        True,
        "checkpoint each Turn's working directory at its start and end",
    ),
    Key(
        "workspace",
        "excludes",
        Strings(),
        DEFAULT_EXCLUDES,
        "gitignore patterns a checkpoint never captures (replaces the default list)",
    ),
    Key(
        "workspace",
        "max_file_bytes",
        Int(1, 1 << 40, "bytes"),
        DEFAULT_SIZE_LIMIT,
        "files larger than this are left out of a checkpoint and listed (`tooLarge`)",
    ),
    Key(
        "workspace",
        "timeout_s",
        Number(0.1, 3600.0, "seconds"),
        5.0,
        "a checkpoint taking longer is recorded `unavailable: timed_out` (the Turn goes on)",
    ),
    Key(
        "workspace",
        "long_timeout_s",
        Number(0.1, 3600.0, "seconds"),
        120.0,
        "a git writing a whole tree or store (`gc`, a restore's or fork tree's checkout) taking "
        "longer is killed and the call fails",
    ),
    Key(
        "workspace",
        "gc_interval_s",
        Number(0.1, 604_800.0, "seconds"),
        3600.0,
        "how often deleted Sessions' checkpoints are dropped and unreferenced objects collected",
    ),
    Key(
        "workspace",
        "tree_retry_s",
        Number(0.1, 86_400.0, "seconds"),
        30.0,
        "a deleted fork child's tree git could not remove is tried again after this long, "
        "then at doubling waits up to 10 minutes (or this long, when longer)",
    ),
    Key(
        "workspace",
        "max_store_bytes",
        Int(0, 1 << 50, "bytes"),
        0,
        "over this size the gc sweep drops the oldest Turns' checkpoints (0: no cap)",
    ),
    Key(
        "workspace",
        "worktrees_dir",
        Str(),
        None,
        "where `worktree` forks' trees go (default: `<repository>.agenthost/` beside it)",
    ),
    # Providers. Model credentials and wire keys: `api_key_env` names the variable
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
                # A name, not a secret: shown in errors and `status` like any other value.
                "the environment variable holding the model API key (read at turn time)",
            ),
            Key(
                f"providers.{provider}",
                FIRST_BYTE_KEY,
                Number(0.1, 3600.0, "seconds"),
                DEFAULT_FIRST_BYTE_S,
                "a model request that gets no answer in this long fails the Turn `model_timeout`",
            ),
            Key(
                f"providers.{provider}",
                STREAM_IDLE_KEY,
                Number(0.1, 86_400.0, "seconds"),
                DEFAULT_STREAM_IDLE_S,
                "a model reply that pauses this long mid-stream fails the Turn `model_timeout`",
            ),
            Key(
                f"providers.{provider}",
                RETRIES_KEY,
                Int(0, 10),
                DEFAULT_RETRIES,
                "retries the provider makes itself of a failed or silent model request",
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
    *(
        Key(
            f"providers.{provider}",
            "readability_proof",
            Str(choices=READABILITY_PROOFS),
            READABILITY_PROOFS[0],
            "how a fork's bound child is proven readable from its own home before the fork is "
            '`accepted`: "in_worker" (the provider\'s history reader in the worker; a fresh '
            'app-server where it cannot judge) or "app_server" (always a fresh app-server)',
        )
        for provider in (TUTTI_AGENT, CODEX)
    ),
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
    Key(
        "providers.claude-code",
        "warm_clis",
        Int(0, 64),
        DEFAULT_WARM_CLIS,
        "CLIs kept started ahead of their Session's next Turn (0: each Turn starts its own)",
    ),
    Key(
        "providers.claude-code",
        "warm_idle_seconds",
        Number(1.0, 86_400.0, "seconds"),
        DEFAULT_WARM_IDLE_S,
        "how long a CLI started ahead waits for its Session's next Turn before it ends",
    ),
)


def schema_tables() -> dict[str, dict[str, Key]]:
    tables: dict[str, dict[str, Key]] = {}
    for key in SCHEMA:
        tables.setdefault(key.table, {})[key.name] = key
    return tables


def defaults() -> dict[str, dict[str, Any]]:
    """Every non-provider table's keys at their defaults."""
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
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=defaults)
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
        """Extra endpoints of the terminated-topic events socket."""
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
    def provider_stopped_s(self) -> float:
        return float(self.get("daemon", "provider_stopped_seconds"))

    @property
    def provider_write_s(self) -> float:
        """Twice `provider_stopped_seconds` unless given: a busy server's liveness check (the
        stopped limit after its first unanswered request) then names a wedged one first."""
        value = self.get("daemon", "provider_write_seconds")
        return 2 * self.provider_stopped_s if value is None else float(value)

    @property
    def turn_interrupt_s(self) -> float:
        return float(self.get("daemon", "turn_interrupt_seconds"))

    @property
    def fork_provider_call_s(self) -> float:
        return float(self.get("daemon", "fork_provider_call_seconds"))

    @property
    def worktrees_dir(self) -> str | None:
        value = self.get("workspace", "worktrees_dir")
        return None if value is None else str(value)

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
    def workers_ahead(self) -> bool:
        return bool(self.get("daemon", "workers_ahead"))

    @property
    def checkpoints(self) -> bool:
        return bool(self.get("workspace", "checkpoints"))

    @property
    def checkpoint_excludes(self) -> tuple[str, ...]:
        return tuple(self.get("workspace", "excludes"))

    @property
    def checkpoint_max_file_bytes(self) -> int:
        return int(self.get("workspace", "max_file_bytes"))

    @property
    def checkpoint_timeout_s(self) -> float:
        return float(self.get("workspace", "timeout_s"))

    @property
    def checkpoint_long_timeout_s(self) -> float:
        return float(self.get("workspace", "long_timeout_s"))

    @property
    def checkpoint_gc_interval_s(self) -> float:
        return float(self.get("workspace", "gc_interval_s"))

    @property
    def tree_retry_s(self) -> float:
        return float(self.get("workspace", "tree_retry_s"))

    @property
    def checkpoint_max_store_bytes(self) -> int:
        return int(self.get("workspace", "max_store_bytes"))

    @property
    def checkpoints_dir(self) -> Path:
        return self.home / "checkpoints"

    @property
    def store_path(self) -> Path:
        return self.home / "store.sqlite3"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def runtimes_dir(self) -> Path:
        return self.home / "runtimes"


# -- docs/user-guide.md


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
