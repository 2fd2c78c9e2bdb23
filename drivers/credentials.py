"""How a provider reaches its model: which credential it uses, where the user's own
login lives, and how a model failure is named.

The key itself is never stored by agenthost: a provider is told the *name* of the environment
variable holding it (`api_key_env`, default `OPENAI_API_KEY` for a non-loopback OpenAI endpoint,
`ANTHROPIC_API_KEY` for Claude) and reads it from the daemon's environment, which its worker and
provider processes inherit. A key written in `agenthost.toml` (`api_key`) reaches the provider
process through one private variable, `AGENTHOST_MODEL_API_KEY`, never through argv or a file.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from domain.model_limits import MODEL_TIMEOUT
from domain.redaction import redact_url, redact_userinfo

OPENAI_VAR = "OPENAI_API_KEY"
ANTHROPIC_VAR = "ANTHROPIC_API_KEY"
FILE_KEY_VAR = "AGENTHOST_MODEL_API_KEY"
"""Carries an in-file `api_key` into the provider process's environment (and nowhere else)."""

MODEL_UNREACHABLE = "model_unreachable"
MODEL_AUTH_FAILED = "model_auth_failed"
MODEL_REASONS = (MODEL_UNREACHABLE, MODEL_AUTH_FAILED, MODEL_TIMEOUT)


def truthy(value: Any) -> bool:
    """Config values arrive as strings (`"True"`, `"true"`) or booleans."""
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class CredentialPlan:
    """Where a provider's key comes from: `env` (the variable `variable`), `file` (the config
    file's `api_key`, passed as `FILE_KEY_VAR`), `login` (the user's own login files), `none`."""

    source: str
    variable: str | None = None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        if self.source == "file":
            return True
        if self.variable is None:
            return False
        return bool((os.environ if environ is None else environ).get(self.variable))

    def describe(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """For `host.status`: the source and the variable's *name*, never its value."""
        return {
            "source": self.source,
            "variable": self.variable if self.source == "env" else None,
            "set": self.is_set(environ) if self.source in ("env", "file") else None,
        }


def credential_plan(provider: str, config: Mapping[str, Any]) -> CredentialPlan:
    if truthy(config.get("use_user_login", False)):
        return CredentialPlan("login")
    if config.get("api_key"):
        return CredentialPlan("file", FILE_KEY_VAR)
    var = config.get("api_key_env")
    if var:
        return CredentialPlan("env", str(var))
    if provider == "claude-code":
        return CredentialPlan("env", ANTHROPIC_VAR)
    base = config.get("model_base_url")
    if base and not is_loopback_url(str(base)):
        return CredentialPlan("env", OPENAI_VAR)
    return CredentialPlan("none")


def file_key_env(config: Mapping[str, Any]) -> dict[str, str]:
    """The provider-process env entry carrying an in-file `api_key` (empty otherwise)."""
    key = config.get("api_key")
    return {FILE_KEY_VAR: str(key)} if key else {}


# --------------------------------------------------------------------------- user logins


def user_codex_auth(environ: Mapping[str, str] | None = None) -> Path:
    """The user's Codex login: `$CODEX_HOME/auth.json`, else `~/.codex/auth.json`, from the
    daemon's own environment (a test points HOME at a fake home)."""
    env = os.environ if environ is None else environ
    if env.get("CODEX_HOME"):
        return Path(env["CODEX_HOME"]) / "auth.json"
    return Path(env.get("HOME") or str(Path.home())) / ".codex" / "auth.json"


def user_claude_credentials(environ: Mapping[str, str] | None = None) -> Path:
    """The user's Claude login: `$CLAUDE_CONFIG_DIR/.credentials.json`, else
    `~/.claude/.credentials.json`."""
    env = os.environ if environ is None else environ
    if env.get("CLAUDE_CONFIG_DIR"):
        return Path(env["CLAUDE_CONFIG_DIR"]) / ".credentials.json"
    return Path(env.get("HOME") or str(Path.home())) / ".claude" / ".credentials.json"


def copy_login(source: Path, target: Path, *, provider: str) -> None:
    """Copy the user's login file into a session home (0600) at runtime preparation: the
    provider reads it there, the store never sees it, and the user's file is never written."""
    from drivers.errors import DriverError

    if not source.is_file():
        raise DriverError(
            f"{MODEL_AUTH_FAILED}: {provider} use_user_login is set but {source} does not "
            "exist (log in with the provider's own CLI first)",
            reason=MODEL_AUTH_FAILED,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out, source.open("rb") as src:
        shutil.copyfileobj(src, out)
    os.replace(tmp, target)


# --------------------------------------------------------------------------- failures

_AUTH = re.compile(
    r"\b(401|403)\b|unauthori[sz]ed|forbidden|invalid[ _-]?api[ _-]?key|authentication|"
    r"not logged in|please run /login|invalid x-api-key|missing bearer|incorrect api key|"
    r"missing environment variable",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(
    r"connection refused|error sending request|unable to connect|connectionrefused|"
    r"failed to connect|could not resolve|name or service not known|dns error|"
    r"network is unreachable|no route to host|connect(ion)? timed out|econnrefused|"
    r"api_connection|connection error|enotfound",
    re.IGNORECASE,
)
_PREFIXED = re.compile(r"^(model_unreachable|model_auth_failed|model_timeout): ")


def classify_model_failure(text: str) -> str | None:
    """`model_auth_failed` / `model_unreachable` for a provider's own failure text, else None."""
    match = _PREFIXED.match(text)
    if match:
        return match.group(1)
    if _AUTH.search(text):
        return MODEL_AUTH_FAILED
    if _UNREACHABLE.search(text):
        return MODEL_UNREACHABLE
    return None


def credential_note(provider: str, plan: CredentialPlan | None) -> str:
    """Where the provider's key came from, in the words tutti-agent uses: `credential from
    $ANTHROPIC_API_KEY, which is NOT set`; the variable's name, never its value."""
    if plan is None:
        return "credential unknown"
    if plan.source == "login":
        return f"credential from the user's own {provider} login (use_user_login)"
    if plan.source == "file":
        return "credential from api_key in agenthost.toml"
    if plan.source == "env" and plan.variable:
        state = "set" if plan.is_set() else "NOT set"
        return f"credential from ${plan.variable}, which is {state}"
    return (
        f"no credential configured: set api_key_env (or use_user_login) in "
        f"[providers.{provider}] of agenthost.toml"
    )


_STATUS = re.compile(r"\b(401|403)\b")
_MISSING_VAR = re.compile(r"missing environment variable", re.IGNORECASE)


def model_failure_text(
    provider: str, endpoint: str | None, text: str, plan: CredentialPlan | None = None
) -> str:
    """A turn error in tutti-agent's sentence shape: the reason, the provider, the endpoint,
    what happened (with the credential's source for a refused one), then the provider's own
    words. Other failures are returned unchanged."""
    text = redact_userinfo(text)  # a provider's own words may quote the URL whole
    reason = classify_model_failure(text)
    if reason is None or _PREFIXED.match(text):
        return text
    where = redact_url(endpoint) or "(the provider's default endpoint)"
    if reason == MODEL_AUTH_FAILED:
        status = _STATUS.search(text)
        if status:
            what = f"answered HTTP {status.group(1)}"
        elif _MISSING_VAR.search(text):
            what = "was not called: the provider has no key to send"
        else:
            what = "refused the key"
        return (
            f"{reason}: {provider} model endpoint {where} {what} "
            f"({credential_note(provider, plan)}): {text}"
        )
    return f"{reason}: {provider} model endpoint {where} is unreachable: {text}"
