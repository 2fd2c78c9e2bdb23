"""A Claude Code CLI dies with the worker that started it, even when it reads no EOF on its
stdin: the real daemon, Claude worker, SDK and bundled CLI, the local MessagesServer as the
model. One Session's CLI is parked for its next Turn, another's is mid-Turn (its model reply
held); both are SIGSTOPped (as a wedged CLI, or one busy in a tool, reads nothing), and the
worker is SIGKILLed: the parent-death signal the CLI was started with ends both at once
(docs/design/drivers.md "No orphans"). And the script that ties a CLI to its spawner: the
program it runs keeps the script's pid, and dies when the thread that spawned it exits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from drivers.app_server.process import pdeathsig_wrapper
from drivers.claude.tied import DIR_PREFIX, TiedCli, remove_stale_dirs
from model_fakes.messages import MessagesServer, last_user_text
from tests.claude.test_claude_stopped import cli_pids
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    submit,
    timeline,
    wait_for,
)
from tests.support.homes import runtime_home

pytestmark = [pytest.mark.claude, pytest.mark.timeout(180)]

needs_setpriv = pytest.mark.skipif(
    pdeathsig_wrapper() is None, reason="no setpriv --pdeathsig: the CLI follows only stdin EOF"
)


@needs_setpriv
def test_a_killed_worker_takes_its_stopped_claude_clis_with_it(tmp_path: Path) -> None:
    gate = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        if last_user_text(body) == "held":
            gate.wait(120)
        return f"echo: {last_user_text(body)}"

    with MessagesServer(reply) as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        d = DaemonProcess(home).start()
        stopped: list[psutil.Process] = []
        try:
            c = d.client()
            parked = create_session(c, provider="claude-code", cwd=str(cwd))["agentSessionId"]
            busy = create_session(c, provider="claude-code", cwd=str(cwd))["agentSessionId"]
            assert run_turn(c, parked, "warm")["outcome"] == "completed"
            submit(c, busy, "held")
            wait_for(lambda: timeline(c, busy)[-1]["rootProviderTurnId"], 60)
            # The parked CLI is started once the Turn has settled (on the worker's loop).
            parked_pids = wait_for(
                lambda: cli_pids(runtime_home(d.home, WS, parked, "claude-config")), 30
            )
            busy_pids = wait_for(
                lambda: cli_pids(runtime_home(d.home, WS, busy, "claude-config")), 30
            )
            worker = next(
                w for w in c.call("host.status")["workers"] if w["provider"] == "claude-code"
            )
            for pid in parked_pids + busy_pids:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(pid)
                    assert worker["pid"] in [p.pid for p in proc.parents()], proc.cmdline()
                    proc.suspend()
                    stopped.append(proc)
            assert stopped
            os.kill(worker["pid"], signal.SIGKILL)
            _, alive = psutil.wait_procs(stopped, timeout=5)
            assert not alive, [(p.pid, p.cmdline()) for p in alive]
            gate.set()
            assert run_turn(c, parked, "after")["outcome"] == "completed"
        finally:
            gate.set()
            for proc in stopped:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            d.stop()


@needs_setpriv
def test_the_tied_cli_keeps_its_pid_and_dies_with_its_spawning_thread(tmp_path: Path) -> None:
    real = tmp_path / "fake-cli"
    real.write_text('#!/bin/sh\necho "$$ $*"\nexec sleep 120\n')
    real.chmod(0o755)
    tied = TiedCli(lambda: str(real), None)
    script = tied.cli_path()
    assert script is not None and tied.tied and script != str(real)
    spawned: list[subprocess.Popen[bytes]] = []
    lines: list[str] = []

    def spawn() -> None:  # the driver's loop thread, in short: it outlives the CLI's start
        child = subprocess.Popen([script, "a b", "c"], stdout=subprocess.PIPE)
        spawned.append(child)
        assert child.stdout is not None
        lines.append(child.stdout.readline().decode().strip())  # the real program runs

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()
    (child,) = spawned
    try:
        pid, _, args = lines[0].partition(" ")
        assert int(pid) == child.pid and args == "a b c"
        # The spawning thread has exited: the parent-death signal has killed the program.
        assert child.wait(timeout=5) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()
        tied.close()
    assert not os.path.exists(script)


def test_a_cli_that_cannot_run_is_given_to_the_sdk_as_configured(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-cli")
    tied = TiedCli(lambda: missing, missing)
    assert tied.cli_path() == missing and not tied.tied
    tied.close()


def test_a_dead_workers_private_directory_is_removed_and_a_live_ones_kept(
    tmp_path: Path,
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"{DIR_PREFIX}{gone.pid}-x"
    live = tmp_path / f"{DIR_PREFIX}{os.getpid()}-y"
    other = tmp_path / "unrelated"
    for directory in (dead, live, other):
        directory.mkdir()
        (directory / "claude").write_text("#!/bin/sh\n")
    remove_stale_dirs(tmp_path)
    assert not dead.exists() and live.exists() and other.exists()
