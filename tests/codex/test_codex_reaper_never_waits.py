"""No check or close of one app-server waits for good on a writer stuck on its stdin. The
driver's reaper checks every Session of the worker on one thread: a real `codex app-server`,
SIGSTOPped (or frozen) mid-Turn, with a writer stuck on its full stdin (holding the write
lock), is still found stopped (or unresponsive) and killed, its Turn failed, the writer let
go — the liveness request the same tick would send never waits behind that writer. The
worker's close ends such a server after a bounded wait for the lock, and the other Sessions'."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import pytest
from codex_helpers import EventLog, codex_bin, codex_pids, completed, home_of, run_turns, start

from drivers.app_server.driver import AppServerDriver
from drivers.app_server.process import AppServerClosed
from drivers.codex.driver import create_driver as codex_driver
from drivers.errors import DriverError
from drivers.failpoints import Failpoints
from model_fakes.responses import ResponsesServer
from tests.support.daemon import wait_for
from tests.support.freezer import freeze, freezer_group, release, running, thaw

pytestmark = [pytest.mark.timeout(120)]

PROBE = "thread/loaded/list"


def test_a_stopped_app_server_with_a_writer_stuck_on_its_stdin_is_still_killed(
    tmp_path: Path, log: EventLog
) -> None:
    _stuck_writer_then_killed(tmp_path, log, group=None)


def test_a_frozen_app_server_with_a_writer_stuck_on_its_stdin_is_killed_unresponsive(
    tmp_path: Path, log: EventLog
) -> None:
    """Frozen (cgroup freezer: not stopped, its process state says nothing), the liveness
    request cannot leave past the stuck writer: that counts as no answer, from the first try,
    and past `stopped_limit_s` the Turn fails unresponsive and the app-server is killed."""
    with freezer_group() as group:
        _stuck_writer_then_killed(tmp_path, log, group=group)


def _stuck_writer_then_killed(tmp_path: Path, log: EventLog, group: Path | None) -> None:
    gate = threading.Event()
    gate.set()
    pids: list[int] = []
    with ResponsesServer(gate=gate, hold_after=1) as server:
        driver = codex_driver(
            {
                "command": [codex_bin()],
                "model": "mock-model",
                "model_base_url": server.base_url,
                "stopped_limit_s": 2.0,
            },
            Failpoints(None),
        )
        try:
            start(driver, tmp_path, "s")
            run_turns(driver, log, "s", ("warm",))
            session = driver._sessions.get("s")
            assert session is not None and session.runtime is not None
            proc = session.runtime.proc
            # No liveness request until the fault is in place (then the next tick sends one).
            driver.provider.liveness_probe = None  # type: ignore[misc]
            gate.clear()
            driver.start_turn({"agentSessionId": "s", "turnId": "held", "text": "held"}, log)
            wait_for(lambda: bool(session.active))
            pids = codex_pids(home_of(tmp_path, "s"))
            assert pids
            if group is None:
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
            else:
                freeze(group, pids)
            closed: list[AppServerClosed] = []

            def write_more_than_its_pipe_holds() -> None:
                try:
                    proc.notify("agenthost/padding", {"pad": "x" * (1 << 20)})
                except AppServerClosed as exc:
                    closed.append(exc)

            writer = threading.Thread(target=write_more_than_its_pipe_holds)
            writer.start()
            wait_for(proc._write_lock.locked)  # the writer waits on the full pipe, holding it
            driver.provider.liveness_probe = PROBE  # type: ignore[misc]
            done = log.wait_for(completed("held"), timeout=30)
            assert done["outcome"] == "failed", done
            assert "the codex app-server (pid " in done["error"], done
            if group is None:
                assert "process state stopped" in done["error"], done
            else:
                assert PROBE in done["error"], done
                thaw(group)  # the SIGKILL sent lands
            writer.join(30)
            assert not writer.is_alive() and len(closed) == 1
        finally:
            gate.set()
            release(group, pids)
            driver.close()


def test_closing_the_driver_ends_a_stopped_app_server_that_a_writer_waits_on(
    tmp_path: Path, log: EventLog
) -> None:
    """The worker's close (its shutdown) closes every Session's app-server; one SIGSTOPped with
    a writer stuck on its full stdin holds the write lock the EOF is sent under: the close
    waits for it a bounded time, then ends that server (terminate, kill), which lets the
    writer go — it never waits on the writer for good, nor leaves the other Sessions open."""
    driver = codex_driver(
        {"command": [codex_bin()], "model": "mock-model", "model_base_url": _URL},
        Failpoints(None),
    )
    pids: list[int] = []
    try:
        for name in ("stuck", "other"):
            start(driver, tmp_path, name)
        sessions = [driver._sessions.get(name) for name in ("stuck", "other")]
        procs = [s.runtime.proc for s in sessions if s is not None and s.runtime is not None]
        assert len(procs) == 2
        pids = codex_pids(home_of(tmp_path, "stuck"))
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        closed: list[AppServerClosed] = []

        def write_more_than_its_pipe_holds() -> None:
            try:
                procs[0].notify("agenthost/padding", {"pad": "x" * (1 << 20)})
            except AppServerClosed as exc:
                closed.append(exc)

        writer = threading.Thread(target=write_more_than_its_pipe_holds)
        writer.start()
        wait_for(procs[0]._write_lock.locked)  # the writer waits on the full pipe, holding it
        closer = threading.Thread(target=driver.close)
        closer.start()
        closer.join(30)
        assert not closer.is_alive()
        writer.join(30)
        assert not writer.is_alive() and len(closed) == 1
        assert [p.pid for p in procs if p.pid is not None and running(p.pid)] == []
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        driver.close()


_URL = "http://127.0.0.1:9/v1"  # no model call is made: the Sessions only start


def test_a_turn_start_stuck_on_a_frozen_app_servers_stdin_fails_unresponsive(
    tmp_path: Path, log: EventLog
) -> None:
    """A `turn/start` larger than the pipe, written to a frozen app-server (it reads nothing;
    its process state says nothing), waits in its write, holding the Session: the liveness
    request is asked while a Turn is awaited too, cannot leave, and past `stopped_limit_s`
    the server is killed and the start fails in words, instead of waiting for good."""
    with freezer_group() as group:
        driver = codex_driver(
            {
                "command": [codex_bin()],
                "model": "mock-model",
                "model_base_url": _URL,
                "stopped_limit_s": 1.0,
            },
            Failpoints(None),
        )
        pids: list[int] = []
        try:
            start(driver, tmp_path, "s")
            pids = codex_pids(home_of(tmp_path, "s"))
            assert pids
            freeze(group, pids)
            failed: list[DriverError] = []

            def start_a_large_turn() -> None:
                params = {"agentSessionId": "s", "turnId": "big", "text": "x" * (1 << 20)}
                try:
                    driver.start_turn(params, log)
                except DriverError as exc:
                    failed.append(exc)

            starter = threading.Thread(target=start_a_large_turn)
            starter.start()
            # Killed while frozen, the server dies once thawed (the SIGKILL lands then).
            wait_for(lambda: "the codex app-server (pid " in str(_stopped_error(driver)))
            thaw(group)
            starter.join(30)
            assert not starter.is_alive() and len(failed) == 1
            assert PROBE in str(failed[0]), failed
        finally:
            release(group, pids)
            driver.close()


def _stopped_error(driver: AppServerDriver) -> str | None:
    session = driver._sessions.get("s")
    runtime = None if session is None else session.runtime
    return None if runtime is None else runtime.stopped_error
