"""`agenthost providers install codex|claude-code`: the pinned provider programs, installed with
their own package managers, and the record under the home that tells the daemon where they are.

Codex goes into `<home>/providers/codex` (`npm install --prefix`), and the daemon runs its native
binary from there when `[providers.codex] command` is not set; the Claude Agent SDK is a Python
package the worker imports, so it goes into the environment of the interpreter running agenthost
(`python -m pip install`). `<home>/providers/installed.json` records what was installed, with
which command line, and where.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.providers import CLAUDE_CODE, CODEX

# The drivers' modules (`drivers.claude.env`, `drivers.codex.command`) are imported where they
# are used: importing either loads its whole driver package (the app-server and SDK clients,
# asyncio), which the daemon never runs in its own process and would pay for at every start.

INSTALLABLE = (CODEX, CLAUDE_CODE)
PROVIDERS_DIR = "providers"
RECORD_NAME = "installed.json"
CODEX_VERSION = "0.171.0"
"""The Codex every test runs (PROVIDERS.md); the Makefile pins the same one."""
CODEX_PACKAGE = f"@openai/codex@{CODEX_VERSION}"
GUIDE = "docs/user-guide.md, 'Install Codex and Claude Code'"

Runner = Callable[[list[str]], int]
"""Runs one command line with the terminal's stdout/stderr; returns its exit status."""


class InstallError(Exception):
    """The install could not be done (a missing tool, a failed command); the words say why."""


def install_command(provider: str) -> str:
    """What a person types to install `provider` (named by `agenthost status` and the error)."""
    return f"agenthost providers install {provider}"


def record_path(home: Path) -> Path:
    return home / PROVIDERS_DIR / RECORD_NAME


def codex_prefix(home: Path) -> Path:
    return home / PROVIDERS_DIR / CODEX


@dataclass(frozen=True, slots=True)
class InstallPlan:
    """One install: the command line that does it and where the result lands."""

    provider: str
    argv: list[str]
    target: Path | None
    """The npm prefix (Codex); None for pip, which installs into `python`'s environment."""
    python: str | None = None


def plan(provider: str, home: Path, python: str | None = None) -> InstallPlan:
    """The command line that installs the pinned `provider` for the daemon of `home`."""
    if provider == CODEX:
        prefix = codex_prefix(home)
        argv = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix)]
        return InstallPlan(CODEX, [*argv, CODEX_PACKAGE], prefix)
    if provider == CLAUDE_CODE:
        from drivers.claude.env import PINNED_SDK_VERSION

        python = python or sys.executable
        package = f"claude-agent-sdk=={PINNED_SDK_VERSION}"
        argv = [python, "-m", "pip", "install", "--disable-pip-version-check", package]
        return InstallPlan(CLAUDE_CODE, argv, None, python)
    raise InstallError(
        f"cannot install {provider!r}: agenthost installs {' and '.join(INSTALLABLE)} "
        "(tutti-agent is part of agenthost)"
    )


def _run(argv: list[str]) -> int:
    return subprocess.run(argv, check=False).returncode


def install(plan_: InstallPlan, home: Path, run: Runner = _run) -> dict[str, Any]:
    """Runs the plan and records the result; returns the record's entry for the provider."""
    tool = plan_.argv[0]
    if shutil.which(tool) is None and not os.path.isfile(tool):
        raise InstallError(
            f"{tool} is not on PATH: install Node.js (with npm) first, or run the same "
            f"command yourself: {' '.join(plan_.argv)}"
        )
    if plan_.target is not None:
        plan_.target.mkdir(parents=True, exist_ok=True)
    status = run(plan_.argv)
    if status != 0:
        raise InstallError(f"`{' '.join(plan_.argv)}` failed with exit status {status}")
    entry: dict[str, Any] = {
        "argv": plan_.argv,
        "installedAtUnixMs": int(time.time() * 1000),
    }
    if plan_.provider == CODEX:
        assert plan_.target is not None
        command = find_codex(plan_.target)
        if command is None:
            raise InstallError(
                f"npm finished but no codex program is under {plan_.target / 'node_modules'}"
            )
        entry.update(version=CODEX_VERSION, prefix=str(plan_.target), command=str(command))
    else:
        from drivers.claude.env import PINNED_SDK_VERSION

        entry.update(version=PINNED_SDK_VERSION, python=plan_.python)
        location = _sdk_location(plan_.python or sys.executable)
        if location is not None:
            entry["location"] = location
    records = recorded(home)
    records[plan_.provider] = entry
    path = record_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records, indent=2) + "\n")
    os.replace(tmp, path)
    return entry


def find_codex(prefix: Path) -> Path | None:
    """The program an npm install under `prefix` gives: its native binary, else the npm shim."""
    from drivers.codex.command import native_binary

    node_modules = prefix / "node_modules"
    native = native_binary(node_modules)
    if native is not None:
        return native
    shim = node_modules / ".bin" / "codex"
    return shim if shim.exists() else None


def _sdk_location(python: str) -> str | None:
    """Where `python` now imports the SDK from (the package directory), if it can."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("claude_agent_sdk")
        return str(Path(spec.origin).parent) if spec is not None and spec.origin else None
    probe = "import claude_agent_sdk, os; print(os.path.dirname(claude_agent_sdk.__file__))"
    out = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or None


def recorded(home: Path) -> dict[str, dict[str, Any]]:
    """The record of `home` (empty when nothing was installed or it cannot be read)."""
    try:
        data = json.loads(record_path(home).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): dict(v) for k, v in data.items() if isinstance(v, Mapping)}


def with_installed(
    home: Path, providers: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The provider tables with the home's installs filled in: Codex's recorded program is its
    `command` unless one is configured (a configured command always wins)."""
    out = {name: dict(table) for name, table in providers.items()}
    codex = recorded(home).get(CODEX)
    command = codex.get("command") if codex else None
    if command and Path(str(command)).exists() and not out.get(CODEX, {}).get("command"):
        out.setdefault(CODEX, {})["command"] = str(command)
    return out
