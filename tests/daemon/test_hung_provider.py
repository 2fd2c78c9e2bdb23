"""A hung provider, through the real daemon and a real tutti-agent app-server that is
SIGSTOPped mid-turn (a hung provider): past `turn_inactivity_seconds` the runtime is stopped
and the Turn settles `failed` with the reason; an interrupt of a hung runtime stops it and
settles the Turn `interrupted` within `turn_interrupt_seconds`, not a 502 after 30 s. The
Session works again afterwards (its runtime respawns)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    timeline,
    wait_for,
)
from tests.support.freezer import freezer_group

pytestmark = pytest.mark.timeout(120)


def _app_servers(session_id: str) -> list[int]:
    """Pids of the app-server processes whose provider home is this Session's."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"app-server" in cmdline and session_id.encode() in environ:
            pids.append(int(entry.name))
    return pids


def _daemon(tmp_path: Path, keys: str) -> DaemonProcess:
    home = tmp_path / "home"
    home.mkdir(parents=True)
    (home / "agenthost.toml").write_text("[daemon]\n" + keys)
    return DaemonProcess(home).start()


def _stop_app_server(sid: str) -> list[int]:
    pids = wait_for(lambda: _app_servers(sid), 10)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return list(pids)


def _cleanup(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_hung_turn_settles_failed_after_inactivity_limit(tmp_path: Path) -> None:
    # 4 s: the Turn after the hung one starts a fresh app-server under the same limit, and a
    # clean-clone run on 2 busy cores once took that Turn past 2 s of silence.
    d = _daemon(tmp_path, "turn_inactivity_seconds = 4\n")
    pids: list[int] = []
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        turn = submit(c, sid, "/slow 60000 never")
        # Hung mid-Turn: stopped once its `turn/start` was answered (stopped before it,
        # tests/daemon/test_stopped_turn_start.py).
        wait_for(lambda: timeline(c, sid)[-1]["rootProviderTurnId"])
        pids = _stop_app_server(sid)
        done = settle(c, sid, turn["turnId"], timeout=60)
        assert done["outcome"] == "failed", done
        assert "sent nothing" in (done["error"] or ""), done
        after = run_turn(c, sid, "after")
        assert after["outcome"] == "completed", after
    finally:
        _cleanup(pids)
        d.stop()


def test_interrupt_of_hung_runtime_settles_interrupted(tmp_path: Path) -> None:
    d = _daemon(tmp_path, "turn_interrupt_seconds = 2\n")
    pids: list[int] = []
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        turn = submit(c, sid, "/slow 60000 never")
        wait_for(
            lambda: c.call(
                "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 10}
            )["turns"][-1]["rootProviderTurnId"]
        )
        pids = _stop_app_server(sid)
        status, body = c.call_raw(
            "turn.interrupt",
            {"workspaceId": WS, "agentSessionId": sid, "turnId": turn["turnId"]},
            timeout=20,
        )
        assert status == 200, body
        assert body["turn"]["phase"] == "settled" and body["turn"]["outcome"] == "interrupted"
        assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        _cleanup(pids)
        d.stop()


def test_a_stopped_app_server_fails_its_turn_provider_stopped(tmp_path: Path) -> None:
    """The inactivity limit left at its default (30 min): the worker sees the app-server
    stopped (process state `T`) and, past `provider_stopped_seconds`, fails the Turn with
    the typed reason `provider_stopped`, naming the provider and the process."""
    d = _daemon(tmp_path, "provider_stopped_seconds = 1\n")
    pids: list[int] = []
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        turn = submit(c, sid, "/slow 600000 never")
        wait_for(
            lambda: c.call(
                "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 10}
            )["turns"][-1]["rootProviderTurnId"]
        )
        pids = _stop_app_server(sid)
        done = settle(c, sid, turn["turnId"], timeout=60)
        assert done["outcome"] == "failed", done
        assert done["errorReason"] == "provider_stopped", done
        assert f"tutti-agent app-server (pid {pids[0]})" in done["error"], done
        assert "stopped" in done["error"], done
        assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        _cleanup(pids)
        d.stop()


def test_an_idle_stopped_app_server_is_replaced_before_the_next_turn_needs_it(
    tmp_path: Path,
) -> None:
    """Stopped between Turns (nothing to fail yet): the worker kills it once it has been
    stopped `provider_stopped_seconds`, and the next Turn runs on a new app-server instead of
    waiting on the stopped one's `turn/start`."""
    d = _daemon(tmp_path, "provider_stopped_seconds = 1\n")
    pids: list[int] = []
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        pids = _stop_app_server(sid)
        wait_for(lambda: not set(_app_servers(sid)) & set(pids), 30)
        after = run_turn(c, sid, "after")
        assert after["outcome"] == "completed", after
        assert not set(_app_servers(sid)) & set(pids)
    finally:
        _cleanup(pids)
        d.stop()


def test_a_frozen_app_server_fails_its_turn_provider_unresponsive(tmp_path: Path) -> None:
    """Frozen with the cgroup freezer, not stopped: its process state says nothing, so only
    the liveness request (`thread/loaded/list`, unanswered past `provider_stopped_seconds`)
    tells the worker it is wedged. The Turn fails `provider_unresponsive` in words; the next
    Turn runs on a new app-server."""
    d = _daemon(tmp_path, "provider_stopped_seconds = 1\n")
    try:
        with freezer_group() as group:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            run_turn(c, sid, "warm")
            turn = submit(c, sid, "/slow 600000 never")
            wait_for(
                lambda: c.call(
                    "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 10}
                )["turns"][-1]["rootProviderTurnId"]
            )
            pids = wait_for(lambda: _app_servers(sid), 10)
            for pid in pids:
                (group / "cgroup.procs").write_text(str(pid))
            (group / "freezer.state").write_text("FROZEN")
            wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 10)
            states = {psutil.Process(pid).status() for pid in pids}
            assert not states & {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}, states
            done = settle(c, sid, turn["turnId"], timeout=60)
            assert done["outcome"] == "failed", done
            assert done["errorReason"] == "provider_unresponsive", done
            assert f"the tutti-agent app-server (pid {pids[0]}," in done["error"], done
            assert "thread/loaded/list" in done["error"], done
            (group / "freezer.state").write_text("THAWED")  # the worker's SIGKILL lands
            assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        d.stop()


def test_a_killed_app_server_s_late_exit_does_not_fail_its_successor_s_turn(
    tmp_path: Path,
) -> None:
    """The worker kills the frozen app-server, but its SIGKILL lands only once it is thawed:
    here, while the Session's next Turn already runs on a new app-server. The old one's exit
    is its own (its Turns were failed when it was killed); the new Turn completes."""
    d = _daemon(tmp_path, "provider_stopped_seconds = 1\n")
    try:
        with freezer_group() as group:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            run_turn(c, sid, "warm")
            turn = submit(c, sid, "/slow 600000 never")
            wait_for(lambda: timeline(c, sid)[-1]["rootProviderTurnId"])
            old = wait_for(lambda: _app_servers(sid), 10)
            for pid in old:
                (group / "cgroup.procs").write_text(str(pid))
            (group / "freezer.state").write_text("FROZEN")
            wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 10)
            done = settle(c, sid, turn["turnId"], timeout=60)
            assert done["errorReason"] == "provider_unresponsive", done
            # Killed, still frozen: the next Turn starts on a new app-server.
            nxt = submit(c, sid, "/slow 3000 next")
            wait_for(lambda: timeline(c, sid)[-1]["rootProviderTurnId"])
            assert all(psutil.pid_exists(pid) for pid in old)
            (group / "freezer.state").write_text("THAWED")  # the SIGKILL lands mid-Turn
            wait_for(lambda: not any(psutil.pid_exists(pid) for pid in old), 10)
            after = settle(c, sid, nxt["turnId"], timeout=60)
            assert after["outcome"] == "completed", str(after.get("error"))
    finally:
        d.stop()
