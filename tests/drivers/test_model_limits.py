"""Each provider's model limits reach it through its own settings: Codex's model-provider keys in
its config.toml, the Claude CLI's environment, tutti-agent's flags; the daemon refuses a limit
out of range in words."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from agenthost.config import ConfigError, load_config
from domain.model_limits import ModelLimits
from drivers.claude.env import ClaudeDriverConfig, session_env
from drivers.codex.config import ApprovalPolicy, SandboxMode, render_config_toml
from drivers.tutti_agent import TuttiAgentProvider

TABLE = {
    "model_base_url": "http://127.0.0.1:9/v1",
    "model_first_byte_seconds": 7.5,
    "model_stream_idle_seconds": 45.0,
    "model_retries": 2,
}


def test_codex_config_toml_carries_the_stream_idle_limit_and_the_retries() -> None:
    text = render_config_toml(
        model="m",
        model_base_url="http://127.0.0.1:9/v1",
        approval_policy=ApprovalPolicy.NEVER,
        sandbox_mode=SandboxMode.READ_ONLY,
        limits=ModelLimits.from_mapping(TABLE),
    )
    provider = tomllib.loads(text)["model_providers"]["agenthost"]
    assert provider["stream_idle_timeout_ms"] == 45_000
    assert provider["request_max_retries"] == 2 and provider["stream_max_retries"] == 2


def test_the_claude_cli_gets_its_own_timeout_and_retry_variables(tmp_path: Path) -> None:
    env = session_env(
        ClaudeDriverConfig.from_mapping(TABLE), tmp_path / "config", tmp_path / "home", {}
    )
    assert env["API_TIMEOUT_MS"] == "7500"
    assert env["CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS"] == "7500"
    assert env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "45000"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "2"


def test_tutti_agent_gets_the_limits_as_flags() -> None:
    argv = TuttiAgentProvider(TABLE).command()
    pairs = dict(zip(argv, argv[1:], strict=False))
    assert pairs["--first-byte-seconds"] == "7.5"
    assert pairs["--stream-idle-seconds"] == "45"
    assert pairs["--retries"] == "2"


def test_the_defaults_are_well_under_a_minute_for_the_first_byte() -> None:
    limits = ModelLimits.from_mapping({})
    assert limits.first_byte_s < 60 < limits.stream_idle_s and limits.retries == 0


def test_a_limit_out_of_range_is_refused_in_words(tmp_path: Path) -> None:
    (tmp_path / "agenthost.toml").write_text("[providers.codex]\nmodel_first_byte_seconds = 0\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, None)
    assert "[providers.codex] model_first_byte_seconds must be a number from 0.1 to 3600" in str(
        err.value
    )
