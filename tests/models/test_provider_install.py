"""Installing Codex and Claude Code after `make install` / `pipx install`: a provider that is not
installed is named with the command that installs it (`agenthost status`, `session.create`'s
error), `agenthost providers install` builds the pinned npm / pip command lines, runs them (here a
fake `npm` and a fake Python stand in for the registries) and records where the program went,
and a daemon started on that home runs the recorded Codex without any `command` configured."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agenthost import provider_install as pi
from tests.support.daemon import WS, DaemonProcess
from tests.support.host_status import status_with_versions
from transport.client import ApiError

pytestmark = pytest.mark.timeout(120)


def cli(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), "--workspace", WS, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_npm(bin_dir: Path, log: Path) -> Path:
    """An `npm` that logs its argv and lays out what `npm install --prefix P @openai/codex`
    would: `P/node_modules/.bin/codex`, a program that answers `--version`."""
    return executable(
        bin_dir / "npm",
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        'prefix=""\n'
        'while [ $# -gt 0 ]; do [ "$1" = "--prefix" ] && prefix="$2"; shift; done\n'
        'mkdir -p "$prefix/node_modules/.bin"\n'
        'printf \'#!/bin/sh\\necho "codex-cli 0.171.0"\\n\' > "$prefix/node_modules/.bin/codex"\n'
        'chmod +x "$prefix/node_modules/.bin/codex"\n',
    )


def test_status_and_session_create_name_the_install_command(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    missing = tmp_path / "no-codex"
    (home / "agenthost.toml").write_text(
        f'[providers.codex]\ncommand = "{missing}"\n'
        f'[providers.claude-code]\ncli_path = "{tmp_path / "no-claude"}"\n'
    )
    d = DaemonProcess(home).start()
    try:
        status = cli(home, "status")
        assert status.returncode == 0, status.stderr
        assert (
            f"codex: NOT INSTALLED ({missing}); install it with `agenthost providers install codex`"
        ) in status.stdout, status.stdout
        assert "install it with `agenthost providers install claude-code`" in status.stdout
        with pytest.raises(ApiError) as err:
            d.client().call("session.create", {"workspaceId": WS, "provider": "codex"})
        assert err.value.reason == "provider_not_installed"
        assert "install it with `agenthost providers install codex`" in err.value.message
        assert "Install Codex and Claude Code" in err.value.message  # the guide's section
        new = cli(home, "new", "--provider", "codex")
        assert new.returncode == 1
        assert "agenthost providers install codex" in new.stderr, new.stderr
    finally:
        d.stop()


def test_the_dry_run_prints_the_pinned_command_lines(tmp_path: Path) -> None:
    home = tmp_path / "home"
    codex = cli(home, "--json", "providers", "install", "codex", "--dry-run")
    assert json.loads(codex.stdout)["argv"] == [
        "npm",
        "install",
        "--no-audit",
        "--no-fund",
        "--prefix",
        str(home / "providers" / "codex"),
        "@openai/codex@0.171.0",
    ]
    claude = cli(home, "--json", "providers", "install", "claude-code", "--dry-run")
    argv = json.loads(claude.stdout)["argv"]
    # Into the environment of the interpreter that runs agenthost (where the worker imports it).
    assert argv[0] == sys.executable
    assert argv[1:4] == ["-m", "pip", "install"] and argv[-1] == "claude-agent-sdk==0.2.189"
    assert not home.exists()  # a dry run touches nothing


def test_install_codex_records_it_and_the_daemon_runs_the_recorded_program(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    log = tmp_path / "npm.log"
    bin_dir = tmp_path / "bin"
    fake_npm(bin_dir, log)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    done = cli(home, "providers", "install", "codex", env={"PATH": path})
    assert done.returncode == 0, done.stderr
    prefix = home / "providers" / "codex"
    assert log.read_text().split() == [
        "install",
        "--no-audit",
        "--no-fund",
        "--prefix",
        str(prefix),
        "@openai/codex@0.171.0",
    ]
    record = json.loads((home / "providers" / "installed.json").read_text())
    program = str(prefix / "node_modules" / ".bin" / "codex")
    assert record["codex"]["command"] == program
    assert record["codex"]["version"] == "0.171.0"
    assert f"codex 0.171.0 installed: {program}" in done.stdout
    d = DaemonProcess(home).start()  # no [providers.codex] command: the record is used
    try:
        status = status_with_versions(d.client())
        line = next(p for p in status["providers"] if p["provider"] == "codex")
        assert line["installed"] is True and line["program"] == program, line
        assert line["version"] == "0.171.0" and line["install"] is None
    finally:
        d.stop()


def test_install_without_npm_says_what_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    done = cli(tmp_path / "home", "providers", "install", "codex", env={"PATH": str(empty)})
    assert done.returncode == 1
    assert "npm is not on PATH: install Node.js (with npm) first" in done.stderr, done.stderr
    assert "@openai/codex@0.171.0" in done.stderr


def test_install_claude_code_runs_pip_of_the_interpreter_and_records_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    log = tmp_path / "pip.log"
    site = tmp_path / "site-packages" / "claude_agent_sdk"
    python = executable(
        tmp_path / "python",
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo "{site}"; else echo "$@" >> "{log}"; fi\n',
    )
    entry = pi.install(pi.plan("claude-code", home, python=str(python)), home)
    assert log.read_text().split() == [
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "claude-agent-sdk==0.2.189",
    ]
    assert entry["location"] == str(site) and entry["python"] == str(python)
    assert pi.recorded(home)["claude-code"]["version"] == "0.2.189"
