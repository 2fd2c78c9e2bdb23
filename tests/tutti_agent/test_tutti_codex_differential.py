"""Differential conformance: the same scenario against the real Codex 0.171.0
app-server and `tutti-agent app-server`, both driven by the same fake Responses server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from model_fakes.responses import ResponsesServer
from tests.tutti_agent.appserver import REPO, TUTTI_AGENT, AppServerProcess, tutti_env
from tests.tutti_agent.scenario import HeldModel, run_scenario

CODEX = (
    REPO
    / "build/providers/codex/node_modules/@openai/codex-linux-x64/vendor"
    / "x86_64-unknown-linux-musl/bin/codex"
)


def _codex_env(tmp: Path, base_url: str) -> dict[str, str]:
    home, codex_home = tmp / "home", tmp / "codex-home"
    home.mkdir(parents=True)
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f"""model = "mock-model"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "read-only"
[model_providers.mock]
name = "Mock Responses"
base_url = "{base_url}"
wire_api = "responses"
requires_openai_auth = false
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
[features]
plugins = false
shell_snapshot = false
[analytics]
enabled = false
"""
    )
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "CODEX_HOME": str(codex_home)}


def _observe(
    argv: list[str], env: dict[str, str], model: ResponsesServer, held: HeldModel, cwd: Path
) -> dict[str, Any]:
    server = AppServerProcess(argv, env, cwd=cwd)
    try:
        server.initialize()
        return run_scenario(server, model, held, str(cwd))
    finally:
        held.release.set()
        server.close()


@pytest.mark.codex
@pytest.mark.timeout(120)
def test_tutti_agent_and_codex_agree_on_the_fork_scenario(tmp_path: Path) -> None:
    if not CODEX.exists():
        pytest.fail(f"Codex 0.171.0 is not installed at {CODEX} (make test installs it)")
    work = tmp_path / "work"
    work.mkdir()
    codex_held, tutti_held = HeldModel(), HeldModel()
    with ResponsesServer(codex_held) as codex_model, ResponsesServer(tutti_held) as tutti_model:
        codex = _observe(
            [str(CODEX), "app-server"],
            _codex_env(tmp_path / "codex", codex_model.base_url)
            if (tmp_path / "codex").mkdir() is None
            else {},
            codex_model,
            codex_held,
            work,
        )
        tutti = _observe(
            [*TUTTI_AGENT, "--model-base-url", tutti_model.base_url],
            tutti_env(tmp_path / "tutti"),
            tutti_model,
            tutti_held,
            work,
        )
    # Sanity: the scenario really exercised what it claims (on the reference).
    assert codex["fork through t2"]["turns"] == ["t1:completed", "t2:completed"]
    assert codex["fork at in-progress turn"].startswith("-32600 lastTurnId")
    assert codex["fork latest mid-turn"]["turns"][-1] == "held:interrupted"
    for key in codex:
        assert tutti.get(key) == codex[key], key
    assert tutti == codex
