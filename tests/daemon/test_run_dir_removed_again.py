"""`run/` removed again while the daemon is making it again (a cleaner's `rm -r` still at work):
an expected race, not a failure. The keeper says so in one warning line, without a traceback, and
makes the directory again from the start on its next check."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agenthost.daemon import Daemon
from tests.support.daemon import wait_for
from tests.support.in_process import in_process_daemon

pytestmark = pytest.mark.timeout(120)


def _rebind(daemon: Daemon) -> tuple[Any, str]:
    return daemon.server, "rebind_missing_ipc"  # the sockets bound in a directory now gone


def _connection_file(daemon: Daemon) -> tuple[Any, str]:
    return daemon.keys, "write_connection_file"  # its temporary file made in a directory gone


@pytest.mark.parametrize("step", [_rebind, _connection_file], ids=["rebind", "connection-file"])
def test_run_removed_again_mid_restore_is_made_again_with_a_warning_not_a_traceback(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    step: Callable[[Daemon], tuple[Any, str]],
) -> None:
    caplog.set_level(logging.WARNING, logger="agenthost.daemon")
    with in_process_daemon(tmp_path / "home") as (daemon, client):
        run = daemon.config.run_dir
        owner, name = step(daemon)
        real = getattr(owner, name)
        raced: list[int] = []

        def removed_first(*args: Any, **kwargs: Any) -> Any:
            if not raced:  # the first restore only: the cleaner removes what it just made
                raced.append(1)
                shutil.rmtree(run)
            return real(*args, **kwargs)

        setattr(owner, name, removed_first)
        before = daemon.run_dir_restored
        shutil.rmtree(run)
        wait_for(
            lambda: (
                daemon.run_dir_restored > before
                and (run / "api.sock").exists()
                and (run / "connection.json").exists()
                and (run / "daemon.lock").exists()
            ),
            timeout=60,
        )
        assert raced
        assert run.stat().st_mode & 0o777 == 0o700
        assert client.call("host.status", {})["workers"] is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any("was removed again while being made again" in m for m in messages), messages
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], messages
