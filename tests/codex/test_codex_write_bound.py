"""No writer waits for good on an app-server's full stdin when no Turn runs. A real `codex
app-server`, idle (no Turn: the liveness check asks it nothing) and cgroup-frozen (it reads
nothing; its process state says nothing), takes a `notify` larger than its pipe and, behind
it, a `respond`: past the write bound (`write_limit_s`) the server is killed
(`provider_unresponsive`), both writers return an error in those words, and the Session's next
Turn runs on a new app-server."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from codex_helpers import EventLog, codex_bin, codex_pids, home_of, run_turns, start

from drivers.app_server.process import AppServerClosed
from drivers.codex.driver import create_driver as codex_driver
from drivers.failpoints import Failpoints
from drivers.liveness import PROVIDER_UNRESPONSIVE
from model_fakes.responses import ResponsesServer
from tests.support.daemon import wait_for
from tests.support.freezer import freeze, freezer_group, release, running, thaw

pytestmark = [pytest.mark.timeout(120)]


def test_writes_to_a_frozen_idle_app_server_fail_unresponsive_and_the_next_turn_respawns(
    tmp_path: Path, log: EventLog
) -> None:
    with freezer_group() as group, ResponsesServer() as server:
        driver = codex_driver(
            {
                "command": [codex_bin()],
                "model": "mock-model",
                "model_base_url": server.base_url,
                "stopped_limit_s": 1.0,
                "write_limit_s": 2.0,
            },
            Failpoints(None),
        )
        pids: list[int] = []
        try:
            start(driver, tmp_path, "s")
            run_turns(driver, log, "s", ("warm",))  # a rollout the next server resumes
            session = driver._sessions.get("s")
            assert session is not None and session.runtime is not None
            proc = session.runtime.proc
            old_pid = proc.pid
            pids = codex_pids(home_of(tmp_path, "s"))
            assert pids and not session.active
            freeze(group, pids)
            closed: dict[str, AppServerClosed] = {}

            def write(name: str, send: Callable[[], None]) -> None:
                try:
                    send()
                except AppServerClosed as exc:
                    closed[name] = exc

            big = threading.Thread(
                target=write,
                args=("notify", lambda: proc.notify("agenthost/padding", {"pad": "x" * (1 << 20)})),
            )
            big.start()
            wait_for(proc._write_lock.locked)  # the notify waits on the full pipe, holding it
            small = threading.Thread(
                target=write, args=("respond", lambda: proc.respond(7, {"decision": "accept"}))
            )
            small.start()
            big.join(30)
            small.join(30)
            assert not big.is_alive() and not small.is_alive()
            assert sorted(closed) == ["notify", "respond"]
            for exc in closed.values():
                assert str(exc).startswith(PROVIDER_UNRESPONSIVE), exc
                assert exc.sent is False
            assert not proc.alive and not session.runtime.alive
            thaw(group)  # the SIGKILL sent lands
            wait_for(lambda: not any(running(pid) for pid in pids))
            run_turns(driver, log, "s", ("after",))
            assert session.runtime is not None and session.runtime.proc.pid != old_pid
        finally:
            release(group, pids)
            driver.close()
