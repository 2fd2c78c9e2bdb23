"""The Claude Code driver's configuration and process environment: `[providers.claude-code]`
as the worker receives it, the pinned SDK and the versions it reports, the environment each
session's CLI runs with (quiet flags, private HOME, config dir, credential, endpoint), and the
process-wide `CLAUDE_CONFIG_DIR`/`HOME` the SDK's in-process helpers read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.claude_warm import DEFAULT_WARM_CLIS, DEFAULT_WARM_IDLE_S
from domain.model_limits import ModelLimits
from domain.redaction import redact_url
from drivers.credentials import (
    ANTHROPIC_VAR,
    FILE_KEY_VAR,
    CredentialPlan,
    copy_login,
    truthy,
    user_claude_credentials,
)
from drivers.liveness import DEFAULT_STOPPED_LIMIT_S

DRIVER_KIND = "claude-code"
PINNED_SDK_VERSION = "0.2.189"
RECEIPT_SCHEMA_VERSION = 1
PRIVATE_HOME_DIR = "home"
"""The private HOME lives inside the session's provider home, so it dies with the session."""

# Flags that keep the CLI offline apart from the model endpoint (PROVIDERS.md): without them it
# generates titles, pings /api/hello and does DNS lookups.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


def sdk_version() -> str:
    from claude_agent_sdk import __version__

    return str(__version__)


def cli_version() -> str:
    from claude_agent_sdk._cli_version import __cli_version__

    return str(__cli_version__)


@dataclass(frozen=True, slots=True)
class ClaudeDriverConfig:
    """`[providers.claude-code]` of agenthost.toml, as the worker receives it."""

    model_base_url: str | None = None
    model: str | None = None
    cli_path: str | None = None
    api_key: str | None = None
    """An in-file key (the less safe choice; the daemon requires the file to be 0600)."""
    api_key_env: str = ANTHROPIC_VAR
    """The daemon-env variable holding the key, read when a session's runtime is prepared."""
    use_user_login: bool = False
    """Use the user's own `claude` login (`~/.claude/.credentials.json`) instead of a key."""
    limits: ModelLimits = ModelLimits()
    """The model limits, given to the CLI through its own variables (`limit_env`)."""
    stopped_limit_s: float = DEFAULT_STOPPED_LIMIT_S
    """How long a turn's CLI may stay stopped before the Turn fails `provider_stopped`."""
    warm_clis: int = DEFAULT_WARM_CLIS
    """How many CLIs, at most, this worker keeps started ahead of their Session's next Turn
    (one a Session, started when its Turn ends; 0: every Turn starts its own CLI)."""
    warm_idle_s: float = DEFAULT_WARM_IDLE_S
    """How long a CLI started ahead waits for its Turn before it is ended."""

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ClaudeDriverConfig:
        def opt(key: str) -> str | None:
            value = config.get(key)
            return str(value) if value else None

        return cls(
            model_base_url=opt("model_base_url"),
            model=opt("model"),
            cli_path=opt("cli_path"),
            api_key=opt("api_key"),
            api_key_env=opt("api_key_env") or ANTHROPIC_VAR,
            use_user_login=truthy(config.get("use_user_login", False)),
            limits=ModelLimits.from_mapping(config),
            stopped_limit_s=float(config.get("stopped_limit_s") or DEFAULT_STOPPED_LIMIT_S),
            warm_clis=int(config.get("warm_clis", DEFAULT_WARM_CLIS)),
            warm_idle_s=float(config.get("warm_idle_seconds") or DEFAULT_WARM_IDLE_S),
        )

    @property
    def shown_endpoint(self) -> str | None:
        """`model_base_url` as a message may name it: its user and password never shown."""
        return redact_url(self.model_base_url)

    def credential(self) -> CredentialPlan:
        """Where this driver's key comes from (named in a refused credential's failure)."""
        if self.use_user_login:
            return CredentialPlan("login")
        if self.api_key:
            return CredentialPlan("file", FILE_KEY_VAR)
        return CredentialPlan("env", self.api_key_env)

    def api_key_value(self) -> str | None:
        """The key this daemon was given (never stored): the in-file one, else the named
        variable of the daemon's own environment."""
        return self.api_key or os.environ.get(self.api_key_env) or None


def session_env(
    config: ClaudeDriverConfig,
    config_dir: Path,
    private_home: Path,
    extra: Mapping[str, Any],
    login: Path | None = None,
) -> dict[str, str]:
    """The environment of a session's CLI: quiet flags, its own HOME and config dir, its
    credential (a copied login, else the key or a placeholder the endpoint refuses), the model
    endpoint, then the caller's extras (the session's own dirs always win). `login`: where the
    person's login is (`user_claude_credentials` of the worker's own environment, read by the
    driver before any fork pointed the process env at a Session's config dir); None: read
    now."""
    env = dict(QUIET_ENV)
    env.update({"HOME": str(private_home), "CLAUDE_CONFIG_DIR": str(config_dir)})
    if config.use_user_login:
        # The user's own login, copied into this session's config dir; an exported key
        # would take precedence over it in the CLI, so none is passed.
        copy_login(
            user_claude_credentials() if login is None else login,
            config_dir / ".credentials.json",
            provider="claude-code",
        )
        env["ANTHROPIC_API_KEY"] = ""
    else:
        key = config.api_key_value()
        # A real key passes through untouched. Without one the CLI still needs a value to
        # start: a placeholder that the endpoint refuses (→ model_auth_failed, fast).
        env["ANTHROPIC_API_KEY"] = key or "unset-no-credential"
    if config.model_base_url:
        env["ANTHROPIC_BASE_URL"] = config.model_base_url
    env.update(limit_env(config.limits))
    env.update({str(k): str(v) for k, v in extra.items()})
    # The session's own dirs always win over anything passed in.
    env.update({"HOME": str(private_home), "CLAUDE_CONFIG_DIR": str(config_dir)})
    return env


def limit_env(limits: ModelLimits) -> dict[str, str]:
    """The CLI's own settings for `limits`: the wait for response headers (the API client's
    timeout and the stream's first-byte watchdog, which the CLI raises to at least 10 s), the
    longest pause mid-stream, and its retries of a failed request."""
    first_byte_ms = str(int(limits.first_byte_s * 1000))
    return {
        "API_TIMEOUT_MS": first_byte_ms,
        "CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS": first_byte_ms,
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(int(limits.stream_idle_s * 1000)),
        "CLAUDE_CODE_MAX_RETRIES": str(limits.retries),
    }


@contextlib.contextmanager
def claude_config_env(config_dir: str, home: str) -> Iterator[None]:
    """Sets `CLAUDE_CONFIG_DIR` and `HOME` in `os.environ` for the block (the SDK's in-process
    session helpers read them there), then restores them. Not locked: callers serialise."""
    saved = {k: os.environ.get(k) for k in ("CLAUDE_CONFIG_DIR", "HOME")}
    os.environ["CLAUDE_CONFIG_DIR"] = config_dir
    os.environ["HOME"] = home
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
