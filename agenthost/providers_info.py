"""What the daemon can say about each configured provider without starting a Session:
whether its program is installed (else `session.create` fails `provider_not_installed`), its
version, endpoint, model, wire API, and which credential it will use — the variable's *name*
and whether it is set, never its value — for `host.status` and `agenthost status`.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from domain.errors import Conflict
from drivers.credentials import credential_plan


class ProviderNotInstalled(Conflict):
    default_reason = "provider_not_installed"


def _argv0(configured: Any) -> str | None:
    if isinstance(configured, str) and configured.strip():
        return shlex.split(configured)[0]
    if isinstance(configured, Sequence) and not isinstance(configured, str) and configured:
        return str(configured[0])
    return None


def _which(program: str) -> str | None:
    if os.sep in program:
        return program if os.path.isfile(program) and os.access(program, os.X_OK) else None
    return shutil.which(program)


def program(provider: str, config: Mapping[str, Any]) -> tuple[str | None, str]:
    """`(resolved path or None, what was looked for)` of the provider's program."""
    if provider == "tutti-agent":
        wanted = _argv0(config.get("command")) or str(Path(sys.executable).parent / "tutti-agent")
        return _which(wanted), wanted
    if provider == "codex":
        from drivers.codex.command import resolve_command

        wanted = resolve_command(config.get("command"))[0]
        return _which(wanted), wanted
    if provider == "claude-code":
        cli = config.get("cli_path")
        if cli:
            return _which(str(cli)), str(cli)
        spec = importlib.util.find_spec("claude_agent_sdk")
        if spec is None or not spec.origin:
            return None, "the claude-agent-sdk Python package"
        bundled = Path(spec.origin).parent / "_bundled" / "claude"
        return (str(bundled) if bundled.is_file() else None), str(bundled)
    return None, provider


_versions: dict[tuple[str, str], str | None] = {}
_versions_lock = threading.Lock()


def installed_version(provider: str, path: str) -> str | None:
    """The provider's version (cached per program path); None when it cannot be told."""
    key = (provider, path)
    with _versions_lock:
        if key in _versions:
            return _versions[key]
    version: str | None = None
    try:
        if provider == "tutti-agent":
            from tutti_agent import __version__

            version = __version__
        elif provider == "claude-code":
            # Imported here: importlib.metadata (and the email parser it loads) is a part of
            # every start's time to ready that only a claude-code version probe uses.
            import importlib.metadata

            try:
                version = importlib.metadata.version("claude-agent-sdk")
            except importlib.metadata.PackageNotFoundError:
                version = None
        else:
            out = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            words = out.stdout.strip().split()
            version = words[-1] if words else None
    except (OSError, subprocess.SubprocessError):
        version = None
    with _versions_lock:
        _versions[key] = version
    return version


def install_hint(provider: str) -> str | None:
    """The command that installs `provider` (None for tutti-agent, which ships with agenthost)."""
    from agenthost.provider_install import INSTALLABLE, install_command

    return install_command(provider) if provider in INSTALLABLE else None


def check_installed(provider: str, config: Mapping[str, Any]) -> None:
    path, wanted = program(provider, config)
    if path is None:
        from agenthost.provider_install import GUIDE

        hint = install_hint(provider)
        how = f"; install it with `{hint}`, then restart the daemon" if hint else ""
        guide = GUIDE if hint else "docs/user-guide.md, 'Use a real model'"
        raise ProviderNotInstalled(
            f"provider {provider} is not installed: {wanted} not found{how} (see {guide})"
        )


def describe(provider: str, config: Mapping[str, Any]) -> dict[str, Any]:
    path, wanted = program(provider, config)
    endpoint = config.get("model_base_url")
    entry: dict[str, Any] = {
        "provider": provider,
        "installed": path is not None,
        "program": path or wanted,
        "version": installed_version(provider, path) if path else None,
        "endpoint": str(endpoint) if endpoint else None,
        "model": str(config["model"]) if config.get("model") else None,
        "credential": credential_plan(provider, config).describe(),
        # How to install it, when it is not (a command line for a person).
        "install": None if path is not None else install_hint(provider),
    }
    if provider == "tutti-agent":
        entry["wireApi"] = str(config.get("wire_api") or "responses") if endpoint else "builtin"
    return entry
