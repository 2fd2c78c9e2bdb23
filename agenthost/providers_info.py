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
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from domain.errors import Conflict
from domain.redaction import redact_userinfo
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
_probes: dict[tuple[str, str], tuple[threading.Event, float]] = {}
"""Version probes started (set once the version is in `_versions`), with when: one per
program."""


def installed_version(provider: str, path: str) -> str | None:
    """The provider's version (cached per program path); None when it cannot be told. It may
    run `path --version` (up to 10 s): `version_within` is the bounded form."""
    key = (provider, path)
    with _versions_lock:
        if key in _versions:
            return _versions[key]
    version = _probe_version(provider, path)
    with _versions_lock:
        _versions[key] = version
    return version


def version_within(provider: str, path: str, wait: float) -> tuple[str | None, bool]:
    """`(version, known)`: the version if it is told within `wait` seconds of its probe's
    start, else `(None, False)`. The probe runs once per program, on a thread of its own, and
    is never waited on past that (a stalled `--version` holds its own thread, not the
    caller's; once late, every caller is answered at once)."""
    key = (provider, path)
    now = time.monotonic()
    with _versions_lock:
        if key in _versions:
            return _versions[key], True
        probe = _probes.get(key)
        start = probe is None
        if probe is None:
            probe = _probes[key] = (threading.Event(), now)
    done, started = probe
    if start:
        threading.Thread(
            target=_probe_into, args=(key, done), name="agenthost-version", daemon=True
        ).start()
    if not done.wait(max(0.0, started + wait - now)):
        return None, False
    with _versions_lock:
        return _versions.get(key), True


def _probe_into(key: tuple[str, str], done: threading.Event) -> None:
    version = _probe_version(*key)
    with _versions_lock:
        _versions[key] = version
    done.set()


def _probe_version(provider: str, path: str) -> str | None:
    try:
        if provider == "tutti-agent":
            from tutti_agent import __version__

            return __version__
        if provider == "claude-code":
            # Imported here: importlib.metadata (and the email parser it loads) is a part of
            # every start's time to ready that only a claude-code version probe uses.
            import importlib.metadata

            try:
                return importlib.metadata.version("claude-agent-sdk")
            except importlib.metadata.PackageNotFoundError:
                return None
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        words = out.stdout.strip().split()
        return words[-1] if words else None
    except (OSError, subprocess.SubprocessError):
        return None


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


def describe_all(
    providers: Sequence[tuple[str, Mapping[str, Any]]], version_wait: float
) -> list[dict[str, Any]]:
    """`describe` of each provider, their version probes started together first (so their
    waits overlap: `version_wait` bounds them all, not each)."""
    for provider, config in providers:
        path, _ = program(provider, config)
        if path is not None:
            version_within(provider, path, 0.0)
    return [describe(p, c, version_wait=version_wait) for p, c in providers]


def describe(
    provider: str, config: Mapping[str, Any], version_wait: float | None = None
) -> dict[str, Any]:
    """The provider's entry; with `version_wait`, its version waited for that long at most
    (`version_within`): `versionPending` says it was not told in time (null for now)."""
    path, wanted = program(provider, config)
    endpoint = config.get("model_base_url")
    version, known = None, True
    if path is not None:
        if version_wait is None:
            version = installed_version(provider, path)
        else:
            version, known = version_within(provider, path, version_wait)
    entry: dict[str, Any] = {
        "provider": provider,
        "installed": path is not None,
        "program": path or wanted,
        "version": version,
        "versionPending": not known,
        "endpoint": redact_userinfo(str(endpoint)) if endpoint else None,
        "model": str(config["model"]) if config.get("model") else None,
        "credential": credential_plan(provider, config).describe(),
        # How to install it, when it is not (a command line for a person).
        "install": None if path is not None else install_hint(provider),
    }
    if provider == "tutti-agent":
        entry["wireApi"] = str(config.get("wire_api") or "responses") if endpoint else "builtin"
    return entry
