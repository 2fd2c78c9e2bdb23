"""An app-server stopped (SIGSTOP) before it answers `turn/start`, through the real daemon and a
real tutti-agent app-server behind the relay (`misbehaving_app_server`, mode `stop`: the process
the worker spawned stops itself as the request reaches it). Once its Turn has failed — the
worker's stopped check (`provider_stopped`) or the host's own limit on the Turn (the inactivity
watchdog, whose stop of the runtime finds it stopped) — the runtime is ended at once and the
worker thread waiting for the `turn/start` answer is woken with the failure: the Session's next
Turn starts on a new app-server at once, not after the request's own limit (30 s)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from domain.procfs import pid_exists
from tests.daemon.test_hung_provider import _app_servers
from tests.support.daemon import (
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.freezer import freeze, freezer_group, thaw
from transport.client import Client

pytestmark = pytest.mark.timeout(90)

RELAY = Path(__file__).with_name("misbehaving_app_server.py")
NEXT_TURN_STARTS_S = 8.0
"""The bound on the next Turn's start: far below the `turn/start` request's limit (30 s) a
held Session would wait out, far above a start on a loaded host."""


def next_turn_runs_and_the_stopped_server_is_gone(c: Client, sid: str, pid: int) -> None:
    """After the Turn the stopped server failed: the Session's next Turn is started at the
    provider (bound to its provider turn) within `NEXT_TURN_STARTS_S`, well before a held
    request's 30 s would have ended, and completes; the stopped server was ended
    (stopped_runtime_left), not left stopped."""
    nxt = submit(c, sid, "next")
    wait_for(lambda: turn_of(c, sid, nxt["turnId"])["rootProviderTurnId"], NEXT_TURN_STARTS_S)
    assert settle(c, sid, nxt["turnId"], timeout=30)["outcome"] == "completed"
    wait_for(lambda: not pid_exists(pid), 5)


def _daemon(tmp_path: Path, arm: Path, keys: str) -> DaemonProcess:
    home = tmp_path / "home"
    home.mkdir(parents=True)
    tutti = Path(sys.executable).parent / "tutti-agent"
    argv = [sys.executable, str(RELAY), str(arm), "--", str(tutti)]
    command = ", ".join(f'"{a}"' for a in argv)
    (home / "agenthost.toml").write_text(
        f'[daemon]\n{keys}[providers."tutti-agent"]\ncommand = [{command}]\n'
    )
    return DaemonProcess(home).start()


def module_daemon(
    tmp_path_factory: pytest.TempPathFactory, name: str, keys: str
) -> Iterator[tuple[DaemonProcess, Path]]:
    """A module fixture's body: `_daemon` in a fresh folder, yielded with its arm file and
    stopped at the module's end."""
    tmp = tmp_path_factory.mktemp(name)
    arm = tmp / "armed"
    d = _daemon(tmp, arm, keys)
    try:
        yield d, arm
    finally:
        d.stop()


def _taken_pid(arm: Path) -> int:
    taken = arm.with_name(arm.name + ".taken")
    lines = wait_for(lambda: taken.exists() and taken.read_text().split("\n")[1:2], 10)
    return int(lines[0])


def _stopped(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    return False


def test_a_turn_start_a_stopped_app_server_never_answered_holds_no_session_after_its_turn(
    tmp_path: Path,
) -> None:
    """The host's inactivity limit fails the Turn (`provider_stopped_seconds` left at 30 s) and
    stops the runtime: the stop finds the app-server stopped and ends it at once, so the worker
    thread waiting for `turn/start` goes on and the next Turn starts on a new app-server."""
    arm = tmp_path / "armed"
    d = _daemon(tmp_path, arm, "turn_inactivity_seconds = 2\n")
    pid = None
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        arm.write_text("stop")
        turn = submit(c, sid, "never answered")
        pid = _taken_pid(arm)
        wait_for(lambda: _stopped(pid), 10)
        done = settle(c, sid, turn["turnId"], timeout=30)
        assert done["outcome"] == "failed", done
        assert "sent nothing for 2 s" in (done["error"] or ""), done
        next_turn_runs_and_the_stopped_server_is_gone(c, sid, pid)
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        d.stop()


def test_a_turn_start_a_frozen_app_server_never_answered_fails_as_it_is_killed(
    tmp_path: Path,
) -> None:
    """Frozen by its cgroup before `turn/start` reached it: the liveness request goes
    unanswered, the worker kills the app-server past `provider_stopped_seconds` — a SIGKILL
    that lands only once it is thawed — and the `turn/start` waiting on it fails then, in the
    words `provider_unresponsive`, not at its own limit (30 s); the next Turn starts on a new
    app-server while the old one is still frozen."""
    arm = tmp_path / "armed"
    d = _daemon(tmp_path, arm, "provider_stopped_seconds = 1\n")
    try:
        with freezer_group() as group:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            run_turn(c, sid, "warm")
            old = wait_for(lambda: _app_servers(sid), 10)
            freeze(group, old)
            turn = submit(c, sid, "never answered")
            done = settle(c, sid, turn["turnId"], timeout=NEXT_TURN_STARTS_S)
            assert done["outcome"] == "failed", done
            assert done["errorReason"] == "provider_unresponsive", done
            nxt = submit(c, sid, "next")
            wait_for(
                lambda: turn_of(c, sid, nxt["turnId"])["rootProviderTurnId"], NEXT_TURN_STARTS_S
            )
            assert all(pid_exists(pid) for pid in old)  # still frozen, its SIGKILL pending
            thaw(group)
            assert settle(c, sid, nxt["turnId"], timeout=30)["outcome"] == "completed"
            wait_for(lambda: not any(pid_exists(pid) for pid in old), 5)
    finally:
        d.stop()
