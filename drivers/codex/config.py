"""A Codex home's generated `config.toml` (PROVIDERS.md): the approval and sandbox settings of
a Session, the local model endpoint without retries, and the network-reaching features off."""

from __future__ import annotations

import json
import os
import threading
from enum import StrEnum
from pathlib import Path

from domain.model_limits import ModelLimits


class ApprovalPolicy(StrEnum):
    """When Codex asks before acting; anything but `never` raises approval Interactions."""

    NEVER = "never"
    ON_REQUEST = "on-request"
    ON_FAILURE = "on-failure"
    # Codex 0.171 refuses to start with "untrusted" ("no longer supported").


class SandboxMode(StrEnum):
    READ_ONLY = "read-only"
    WORKSPACE_WRITE = "workspace-write"
    DANGER_FULL_ACCESS = "danger-full-access"


def _toml_string(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(value)


def render_config_toml(
    *,
    model: str | None,
    model_base_url: str | None,
    approval_policy: ApprovalPolicy,
    sandbox_mode: SandboxMode,
    env_key: str | None = None,
    requires_openai_auth: bool = False,
    limits: ModelLimits | None = None,
) -> str:
    """The offline `config.toml` of PROVIDERS.md: a local Responses endpoint with the
    provider's own stream-idle limit and retries (`limits`), and the features that would reach
    the network (plugins) or the login shell (snapshots) off."""
    limits = limits or ModelLimits()
    lines: list[str] = []
    if model:
        lines.append(f"model = {_toml_string(model)}")
    if model_base_url:
        lines.append('model_provider = "agenthost"')
    lines += [
        f"approval_policy = {_toml_string(approval_policy.value)}",
        f"sandbox_mode = {_toml_string(sandbox_mode.value)}",
    ]
    if model_base_url:
        lines += [
            "",
            "[model_providers.agenthost]",
            'name = "agenthost model endpoint"',
            f"base_url = {_toml_string(model_base_url)}",
            'wire_api = "responses"',
            # Codex's own mechanism: it reads the key from this variable of its environment
            # and sends it as a Bearer token; the key is never written here.
            *([f"env_key = {_toml_string(env_key)}"] if env_key else []),
            f"requires_openai_auth = {'true' if requires_openai_auth else 'false'}",
            "supports_websockets = false",
            # Codex's own limit on a silent stream; its time to a first byte has no setting of
            # its own, so the driver and the host enforce `model_first_byte_seconds`.
            f"stream_idle_timeout_ms = {int(limits.stream_idle_s * 1000)}",
            f"request_max_retries = {limits.retries}",
            f"stream_max_retries = {limits.retries}",
        ]
    lines += [
        "",
        "[features]",
        "plugins = false",
        "shell_snapshot = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
    ]
    return "\n".join(lines)


def write_if_changed(path: Path, text: str) -> None:
    data = text.encode()
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
