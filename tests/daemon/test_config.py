"""`agenthost.toml` parsing (agenthost/config.py): unknown keys are named errors, provider values
keep the types the drivers read (an argv list for `command`), and an explicit `--config` path
must exist. One daemon run proves a list `command` reaches the worker intact."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agenthost.config import ConfigError, load_config, parse_config
from tests.support.daemon import DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(60)


def test_unknown_keys_are_errors_that_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'providers\.codex\.cli_path'"):
        parse_config(tmp_path, {"providers": {"codex": {"cli_path": "/x"}}})
    with pytest.raises(ConfigError, match=r"unknown key 'daemon\.port'"):
        parse_config(tmp_path, {"daemon": {"port": 1}})
    with pytest.raises(ConfigError, match=r"unknown provider \[providers\.gpt\]"):
        parse_config(tmp_path, {"providers": {"gpt": {}}})


def test_command_may_be_an_argv_list_and_other_values_are_strings(tmp_path: Path) -> None:
    cfg = parse_config(
        tmp_path,
        {
            "providers": {
                "codex": {"command": ["/opt/codex", "--flag"], "model": "m"},
                "tutti-agent": {"command": "tutti-agent --x"},
                "claude-code": {"api_key": "sk-test", "model": 4},
            }
        },
    )
    assert cfg.providers["codex"] == {"command": ["/opt/codex", "--flag"], "model": "m"}
    assert cfg.providers["tutti-agent"] == {"command": "tutti-agent --x"}
    assert cfg.providers["claude-code"] == {"api_key": "sk-test", "model": "4"}


@pytest.mark.parametrize(
    "table",
    [
        {"command": []},
        {"command": ["ok", 3]},
        {"model": ["a", "b"]},
        {"model": {"name": "m"}},
    ],
)
def test_values_of_the_wrong_shape_are_errors(tmp_path: Path, table: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"providers\.codex\.(command|model) must be"):
        parse_config(tmp_path, {"providers": {"codex": table}})


def test_an_explicit_config_path_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path, missing)
    # Without --config, the home's agenthost.toml is optional.
    assert load_config(tmp_path).providers == {}


def test_a_list_command_runs_the_provider(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    script = Path(sys.executable).parent / "tutti-agent"
    (home / "agenthost.toml").write_text(
        f'[providers.tutti-agent]\ncommand = ["{sys.executable}", "{script}"]\n'
    )
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turn = run_turn(c, sid, "hello")
    finally:
        d.stop()
    assert turn["outcome"] == "completed"
    assert turn["messages"][-1]["text"] == "echo: hello"


def test_model_keys_are_validated(tmp_path: Path) -> None:
    """Issue 17: the model keys of each provider, checked at start-up with the key named."""
    cfg = parse_config(
        tmp_path,
        {
            "providers": {
                "tutti-agent": {"wire_api": "chat", "api_key_env": "MY_KEY", "instructions": "x"},
                "codex": {"use_user_login": True},
                "claude-code": {"api_key_env": "ANTHROPIC_API_KEY", "use_user_login": False},
            }
        },
    )
    assert cfg.providers["tutti-agent"]["wire_api"] == "chat"
    with pytest.raises(ConfigError, match="wire_api must be one of responses, chat"):
        parse_config(tmp_path, {"providers": {"tutti-agent": {"wire_api": "soap"}}})
    with pytest.raises(ConfigError, match="api_key_env must name an environment variable"):
        parse_config(tmp_path, {"providers": {"codex": {"api_key_env": "sk-abc def"}}})
    with pytest.raises(ConfigError, match="use_user_login must be true or false"):
        parse_config(tmp_path, {"providers": {"codex": {"use_user_login": "maybe"}}})
    with pytest.raises(ConfigError, match="unknown key 'providers.tutti-agent.use_user_login'"):
        parse_config(tmp_path, {"providers": {"tutti-agent": {"use_user_login": True}}})


def test_a_key_in_a_readable_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agenthost.toml"
    path.write_text('[providers.codex]\napi_key = "sk-secret-value"\n')
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert "must be 0600" in str(err.value) and "sk-secret-value" not in str(err.value)
    os.chmod(path, 0o600)
    assert load_config(tmp_path).providers["codex"]["api_key"] == "sk-secret-value"
