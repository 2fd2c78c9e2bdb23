"""Shared helpers of the Codex tests (a uniquely named module: conftest names collide): where
the pinned Codex binary is, a recording `emit`, sessions with N turns, fork requests, and the
relay's call log."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from domain.worker_messages import ForkRequest
from drivers.app_server.driver import AppServerDriver
from drivers.codex.command import default_command, native_binary
from model_fakes.responses import ResponsesServer
from tests.support.events import EventLog, completed  # noqa: F401 - re-exported

RELAY = str(Path(__file__).with_name("codex_relay.py"))

MakeDriver = Callable[..., AppServerDriver]
"""The `make_driver` fixture's type (here, not in conftest.py: `from conftest import` finds
another directory's conftest when several test directories are collected together)."""


def write_config(home: Path, server: ResponsesServer, more: str = "") -> None:
    """`home/agenthost.toml` running Codex (the pinned binary) against `server`, then `more`
    (further tables)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "agenthost.toml").write_text(
        "[providers.codex]\n"
        f'command = "{codex_bin()}"\n'
        'model = "mock-model"\n'
        f'model_base_url = "{server.base_url}"\n' + more
    )


def codex_bin() -> str:
    """The pinned Codex: `AGENTHOST_CODEX_BIN` (the npm shim the Makefile passes; its native
    binary is preferred, it starts faster), else the install under build/. Missing → FAIL."""
    shim = os.environ.get("AGENTHOST_CODEX_BIN")
    if shim:
        native = native_binary(Path(shim).parent.parent)
        path = str(native) if native is not None else shim
    else:
        path = default_command()[0]
    if not Path(path).exists():
        pytest.fail(f"Codex 0.171.0 is not installed ({path}); `make test` installs it")
    return path


def relayed(mode: str, log_path: Path) -> list[str]:
    return [sys.executable, RELAY, mode, str(log_path), "--", codex_bin()]


def calls(log_path: Path, method: str | None = None) -> list[dict[str, Any]]:
    """The client requests the relay saw, in order (optionally only one method)."""
    if not log_path.exists():
        return []
    out = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    return [c for c in out if method is None or c["method"] == method]


def codex_pids(home: Path) -> list[int]:
    """Live processes whose `CODEX_HOME` is `home` (app-servers serving that Session)."""
    wanted = f"CODEX_HOME={home}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ:
            pids.append(int(entry.name))
    return pids


@dataclass
class CodexSession:
    name: str
    home: Path
    thread_id: str
    version: str
    turns: list[str]
    context: dict[str, Any] = field(default_factory=dict)


def home_of(root: Path, name: str) -> Path:
    return root / "runtimes" / name / "codex-home"


def start(
    driver: AppServerDriver,
    root: Path,
    name: str,
    *,
    thread_id: str | None = None,
    context: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "agentSessionId": name,
        "home": str(home_of(root, name)),
        "cwd": str(root),
        "settings": settings or {},
        "model": None,
    }
    if thread_id:
        params["providerSessionId"] = thread_id
    if context is not None:
        params["runtimeContext"] = context
    return driver.start_session(params)


def run_turns(
    driver: AppServerDriver, log: EventLog, name: str, texts: tuple[str, ...]
) -> list[str]:
    provider_turns = []
    for i, text in enumerate(texts, 1):
        turn_id = f"{name}-T{len(log.events)}-{i}"
        result = driver.start_turn({"agentSessionId": name, "turnId": turn_id, "text": text}, log)
        done = log.wait_for(completed(turn_id), timeout=60)
        assert done["outcome"] == "completed", done
        provider_turns.append(result["providerTurnId"])
    return provider_turns


def open_session(
    driver: AppServerDriver,
    log: EventLog,
    root: Path,
    name: str = "src",
    texts: tuple[str, ...] = ("one", "two", "three"),
) -> CodexSession:
    started = start(driver, root, name)
    turns = run_turns(driver, log, name, texts)
    context = started["runtimeContext"]
    return CodexSession(
        name,
        home_of(root, name),
        started["providerSessionId"],
        context["driverVersion"],
        turns,
        dict(context),
    )


def fork_request(
    source: CodexSession, prefix: list[str], target_home: Path, *, version: str | None = None
) -> ForkRequest:
    return ForkRequest.from_wire(
        {
            "source": {
                "agentSessionId": source.name,
                "providerSessionId": source.thread_id,
                "home": str(source.home),
                "cwd": str(source.home.parent),
            },
            "target": {"agentSessionId": "child", "home": str(target_home)},
            "providerTurnIds": prefix,
            "title": "src (2)",
            "driverKind": "codex",
            "driverVersion": version or source.version,
        }
    )


def user_inputs(body: dict[str, Any], sent: set[str]) -> list[str]:
    """The user texts of one model request that the test itself sent (Codex adds its own
    environment/skills context messages; those are left out)."""
    from model_fakes.responses import model_input_texts

    return [text for role, text in model_input_texts(body) if role == "user" and text in sent]


def conversation(body: dict[str, Any], sent: set[str]) -> list[tuple[str, str]]:
    """The user/assistant exchange of one model request, limited to the test's own texts and
    the model's echoes of them."""
    from model_fakes.responses import model_input_texts

    echoes = {f"echo: {t}" for t in sent}
    return [
        (role, text)
        for role, text in model_input_texts(body)
        if (role == "user" and text in sent) or (role == "assistant" and text in echoes)
    ]
