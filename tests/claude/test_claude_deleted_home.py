"""A deleted Claude Session's runtime folder stays gone: the CLI the worker started ahead for
the Session's next Turn (`drivers.claude.warm`) is ended before the Session's `session.stop` is
answered, so it cannot make the folder again after the delete removed it. It was ended after
the answer: a CLI still starting then wrote `claude-config/sessions/` into a folder the delete
had removed (the contention soak's `deleted_home_gone`, 40 s after the delete)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from model_fakes.messages import MessagesServer
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, wait_for
from tests.support.homes import processes_naming
from tests.support.invariants import assert_invariants

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]


def _held_cli(tmp_path: Path) -> Path:
    """A `cli_path` that runs the SDK's bundled CLI, every start after the first (the Turn's
    own CLI) waiting while `<tmp_path>/hold` exists and making `<tmp_path>/met` first."""
    real = Path(str(__import__("claude_agent_sdk").__file__)).parent / "_bundled" / "claude"
    count, hold, met = tmp_path / "count", tmp_path / "hold", tmp_path / "met"
    front = tmp_path / "held-claude"
    front.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version|-v) exec \'{real}\' "$@";; esac\n'
        f"n=$(cat '{count}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{count}'\n"
        f"if [ $n -ge 2 ]; then touch '{met}'; "
        f"while [ -e '{hold}' ]; do sleep 0.05; done; fi\n"
        f"exec '{real}' \"$@\"\n"
    )
    front.chmod(0o755)
    return front


@pytest.fixture
def held_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with MessagesServer() as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
            f'cli_path = "{_held_cli(tmp_path)}"\n'
        )
        (tmp_path / "hold").touch()
        (tmp_path / "cwd").mkdir()
        d = DaemonProcess(home).start()
        try:
            yield d
        finally:
            (tmp_path / "hold").unlink(missing_ok=True)
            d.stop()


def test_a_cli_started_ahead_cannot_make_a_deleted_sessions_folder_again(
    held_daemon: DaemonProcess, tmp_path: Path
) -> None:
    d = held_daemon
    c = d.client(timeout=60)
    sid = create_session(c, provider="claude-code", cwd=str(tmp_path / "cwd"))["agentSessionId"]
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    # The CLI of the Session's next Turn is starting (held before it runs the real one).
    wait_for(lambda: (tmp_path / "met").exists(), 30)
    folder = d.home / "runtimes" / WS / sid
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    wait_for(lambda: not folder.exists(), 30)
    (tmp_path / "hold").unlink()  # a CLI still held starts the real one now
    wait_for(lambda: not processes_naming(f"{sid}/claude-config"), 30)
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))
    d.stop()
    assert_invariants(d.home)
