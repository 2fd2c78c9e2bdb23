"""Codex through npm's `node` launcher (`node_modules/.bin/codex`, what a configured command
runs with `resolve_native_binary = false`): the launcher spawns the native `codex` as its child,
which inherits the app-server's pipes and gets no parent-death signal. Killed alone, as a crash
would, the launcher leaves its native child running and answering. Nothing of an app-server may
outlive it: an `unknown` fork's child written after the answer (and perhaps after an abandon
found none) would be no one's, and a Session's next app-server would run beside it on the same
home. Real Codex 0.171 through its real launcher; only the model is faked."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest
from codex_helpers import EventLog, MakeDriver, fork_request, home_of, open_session, run_turns

from domain.enums import DeliveryDisposition
from domain.worker_messages import ForkResult
from drivers.app_server.driver import AppServerDriver
from tests.support.daemon import wait_for
from tests.support.homes import child_rollouts

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]


def _launcher() -> str:
    shim = os.environ.get("AGENTHOST_CODEX_BIN") or str(
        Path(__file__).resolve().parents[2] / "build/providers/codex/node_modules/.bin/codex"
    )
    if not Path(shim).exists():
        pytest.fail(f"Codex's npm launcher is not installed ({shim}); `make test` installs it")
    return shim


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _launched(driver: AppServerDriver, name: str) -> tuple[psutil.Process, psutil.Process]:
    """The Session's launcher (`node`) and the native `codex` it runs."""
    session = driver._sessions.get(name)
    assert session is not None and session.runtime is not None
    launcher = psutil.Process(session.runtime.proc.pid)
    (native,) = launcher.children(recursive=True)
    assert "node" in launcher.name() and native.name() == "codex", (launcher, native)
    return launcher, native


def test_a_fork_unknown_after_its_launcher_died_leaves_no_native_child_to_fork_later(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """`thread/fork` sent, the native `codex` not answering (stopped), then the launcher killed
    alone: the fork ends `unknown` at its limit and its app-server is ended — the native child
    too. Before, only the launcher's (gone) tree was killed: the native child lived on and,
    once let run, wrote the fork's child rollout after the `unknown`."""
    driver = make_driver(command=[_launcher()], resolve_native_binary=False, fork_timeout_s=2.0)
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    first = driver.fork(fork_request(src, src.turns[:1], home_of(tmp_path, "first")))
    assert first.disposition is DeliveryDisposition.ACCEPTED, first.error
    children = child_rollouts(src.home)
    launcher, native = _launched(driver, "src")
    native.suspend()
    try:
        results: list[ForkResult] = []
        forking = threading.Thread(
            target=lambda: results.append(
                driver.fork(fork_request(src, src.turns, home_of(tmp_path, "second")))
            )
        )
        forking.start()
        runtime = driver._sessions["src"].runtime
        assert runtime is not None
        wait_for(lambda: any(m == "thread/fork" for m, _ in runtime.proc._pending.values()))
        launcher.kill()  # the launcher alone, as a crash would
        forking.join(30)
        (result,) = results
        assert result.disposition is DeliveryDisposition.UNKNOWN, result
        wait_for(lambda: _gone(native))  # SIGKILLed: gone once its exit is done
    finally:
        if not _gone(native):
            native.resume()
            time.sleep(1.0)  # let it write what it would: the assertion below sees it
            native.kill()
    assert child_rollouts(src.home) == children  # no child written after the `unknown`


def test_a_sessions_next_app_server_never_runs_beside_its_dead_launchers_native_child(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """The launcher killed alone between Turns: the next Turn starts a new app-server, and the
    old native child is ended first, never left serving the same home beside it."""
    driver = make_driver(command=[_launcher()], resolve_native_binary=False)
    open_session(driver, log, tmp_path, texts=("one",))
    launcher, native = _launched(driver, "src")
    launcher.kill()
    wait_for(lambda: _gone(launcher))
    run_turns(driver, log, "src", ("two",))
    new_launcher, _ = _launched(driver, "src")
    assert new_launcher.pid != launcher.pid
    wait_for(lambda: _gone(native))
