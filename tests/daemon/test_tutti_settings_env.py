"""The Tutti Agent's model settings come from `agenthost.toml` alone: the `TUTTI_AGENT_*`
variables `tutti-agent app-server` reads as its options' defaults (the model's URL, its name, its
wire format, its key's variable, ...) are not passed on from the daemon's own environment, where
a user may have set one for another use; the runtime's environment holds the URL only when the
configuration gives one. Through a real daemon, its worker and its app-server."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest

from drivers.worker_spawn import TUTTI_AGENT_SETTINGS
from model_fakes.responses import ResponsesServer
from tests.support.daemon import DaemonProcess, create_session, run_turn, timeline

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def app_server_environs(home: Path) -> list[dict[str, str]]:
    """The environment of every process whose `TUTTI_AGENT_HOME` lies under `home`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry.name}/environ", "rb") as fh:
            pairs = [raw.decode(errors="replace").partition("=") for raw in fh.read().split(b"\0")]
            environ = {name: value for name, _, value in pairs if name}
            if environ.get("TUTTI_AGENT_HOME", "").startswith(f"{home}/"):
                found.append(environ)
    return found


def test_the_settings_not_passed_on_are_every_option_default_the_cli_reads() -> None:
    cli = (REPO / "tutti_agent" / "cli.py").read_text(encoding="utf-8")
    parser = cli.split("def build_parser", 1)[1].split("\ndef ", 1)[0]
    read = set(re.findall(r"os\.environ\.get\(\"(TUTTI_AGENT_[A-Z_]+)\"", parser))
    assert len(read) >= 8, read
    assert set(TUTTI_AGENT_SETTINGS) == read


def test_a_model_url_in_the_daemons_environment_does_not_reach_the_tutti_agent(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with ResponsesServer(reply=lambda _body: "the other server answered") as other:
        env = {
            "TUTTI_AGENT_MODEL_BASE_URL": other.base_url,
            "TUTTI_AGENT_MODEL": "someone-elses-model",
            "TUTTI_AGENT_INSTRUCTIONS": "someone else's instructions",
        }
        daemon = DaemonProcess(home, env=env).start()
        try:
            c = daemon.client(timeout=60)
            sid = create_session(c)["agentSessionId"]
            turn = run_turn(c, sid, "hello")
            assert turn["outcome"] == "completed", turn
            seen = app_server_environs(home)
            assert seen, "no Tutti Agent app-server found"
            for environ in seen:
                assert not set(env) & set(environ), sorted(set(env) & set(environ))
            texts = [str(item) for item in timeline(c, sid)]
            assert not any("the other server answered" in text for text in texts), texts
        finally:
            daemon.stop()
        assert other.requests == []
