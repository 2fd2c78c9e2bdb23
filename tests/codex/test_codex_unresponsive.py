"""A Codex app-server that runs but answers nothing, through the real daemon: the pinned
`codex app-server` is frozen with the cgroup freezer mid-Turn (its processes are then in
`disk-sleep`, not stopped, so their process state says nothing; only the liveness request can
tell). Past `provider_stopped_seconds` the Turn fails `provider_unresponsive` in words, and the
daemon keeps serving: the next Turn runs on a new app-server."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import psutil
import pytest
from codex_helpers import codex_pids, write_config

from model_fakes.responses import ResponsesServer
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
from tests.support.homes import runtime_home

pytestmark = [pytest.mark.timeout(180)]


def test_a_frozen_codex_app_server_fails_its_turn_provider_unresponsive(tmp_path: Path) -> None:
    gate = threading.Event()
    gate.set()
    with ResponsesServer(gate=gate, hold_after=1) as server, freezer_group() as group:
        home = tmp_path / "home"
        write_config(home, server, "[daemon]\nprovider_stopped_seconds = 1\n")
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            cwd = tmp_path / "cwd"
            cwd.mkdir()
            sid = create_session(c, provider="codex", cwd=str(cwd))["agentSessionId"]
            assert run_turn(c, sid, "warm")["outcome"] == "completed"
            gate.clear()
            turn = submit(c, sid, "held")
            wait_for(lambda: timeline(c, sid)[-1]["rootProviderTurnId"], 60)
            pids = codex_pids(runtime_home(d.home, WS, sid, "codex-home"))
            assert pids
            for pid in pids:
                (group / "cgroup.procs").write_text(str(pid))
            (group / "freezer.state").write_text("FROZEN")
            wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 10)
            # Frozen, not stopped: no process state gives it away.
            states = {psutil.Process(pid).status() for pid in pids}
            assert not states & {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}, states
            done = settle(c, sid, turn["turnId"], timeout=60)
            assert done["outcome"] == "failed", done
            assert done["errorReason"] == "provider_unresponsive", done
            assert "the codex app-server (pid " in done["error"], done
            assert "thread/loaded/list" in done["error"], done
            # Thawed, the SIGKILL the worker sent lands; the next Turn runs on a new one.
            (group / "freezer.state").write_text("THAWED")
            gate.set()
            after = run_turn(c, sid, "after")
            assert after["outcome"] == "completed", str(after.get("error"))
        finally:
            gate.set()
            with contextlib.suppress(OSError):
                (group / "freezer.state").write_text("THAWED")
            d.stop()
