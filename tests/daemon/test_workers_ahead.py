"""The providers' workers started ahead of their first use (`daemon.workers_ahead`): once the
ready line is out and start-up recovery's deferred commits are made, the daemon spawns the
worker of each configured, installed provider, which loads its driver as it starts; the first
Turn then spawns only its app-server. Real daemons, workers and app-servers; processes counted
with psutil (no timing is asserted)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from agenthost.config import load_config
from agenthost.daemon import Daemon
from drivers.supervisor import WorkerSupervisor
from tests.support.daemon import DaemonProcess, create_session, run_turn, wait_for
from tests.support.invariants import check_processes

pytestmark = pytest.mark.timeout(120)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _workers(pid: int) -> list[psutil.Process]:
    return [p for p in _descendants(pid) if "drivers.worker" in _cmdline(p)]


def _app_servers(pid: int) -> list[psutil.Process]:
    return [p for p in _descendants(pid) if "app-server" in _cmdline(p)]


def _ready_worker(d: DaemonProcess, provider: str) -> dict[str, Any]:
    """Wait, through `host.status` only (which spawns nothing), for `provider`'s worker."""
    c = d.client()

    def ready() -> dict[str, Any] | None:
        rows = [w for w in c.call("host.status")["workers"] if w["provider"] == provider]
        return rows[0] if rows and rows[0]["state"] == "ready" else None

    return wait_for(ready, timeout=60)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _of_home(home: Path) -> list[psutil.Process]:
    """Every live process whose command line names `home` (a worker's `--connect` endpoint is
    under the home's run dir)."""
    out = []
    for proc in psutil.process_iter():
        if any(str(home) in a for a in _cmdline(proc)) and _alive(proc.pid):
            out.append(proc)
    return out


def test_the_worker_is_started_ahead_and_serves_the_first_turn(daemon: DaemonProcess) -> None:
    worker = _ready_worker(daemon, "tutti-agent")
    assert daemon.proc is not None
    # Ahead of any request: one worker, its driver loaded, and no provider runtime yet.
    assert [p.pid for p in _workers(daemon.proc.pid)] == [worker["pid"]]
    assert _app_servers(daemon.proc.pid) == []
    c = daemon.client()
    assert c.call("host.status")["runtimes"].get("tutti-agent", {}).get("live", 0) == 0
    # The first Turn's path spawned the app-server only: the worker is the one started ahead.
    sid = create_session(c)["agentSessionId"]
    assert run_turn(c, sid, "hello")["outcome"] == "completed"
    after = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
    assert after["pid"] == worker["pid"] and after["restarts"] == 0
    assert [p.pid for p in _workers(daemon.proc.pid)] == [worker["pid"]]
    assert len(_app_servers(daemon.proc.pid)) == 1
    log = daemon.tail_log(100_000)
    assert "worker of tutti-agent started ahead of its first use" in log


def test_a_provider_not_installed_gets_no_worker_and_no_noise(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "agenthost.toml").write_text(
        '[providers.codex]\ncommand = "/nonexistent/codex"\n'
        '[providers.claude-code]\ncli_path = "/nonexistent/claude"\n'
    )
    d = DaemonProcess(home).start()
    try:
        _ready_worker(d, "tutti-agent")
        c = d.client()
        # The list of providers started ahead was decided in one go, before tutti-agent's
        # worker was asked for: a host.status later still names it alone.
        time.sleep(0.5)
        assert [w["provider"] for w in c.call("host.status")["workers"]] == ["tutti-agent"]
        assert d.proc is not None and len(_workers(d.proc.pid)) == 1
    finally:
        d.stop()
    log = d.tail_log(100_000)
    for word in ("codex", "claude", "Traceback", "ERROR", "WARNING"):
        assert word not in log, log
    assert not (home / "run" / "workers" / "worker-codex.log").exists()
    assert not (home / "run" / "workers" / "worker-claude-code.log").exists()


def test_workers_ahead_off_spawns_each_worker_at_its_first_use(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "agenthost.toml").write_text("[daemon]\nworkers_ahead = false\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        time.sleep(0.5)
        assert c.call("host.status")["workers"] == []
        assert d.proc is not None and _workers(d.proc.pid) == []
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "hello")["outcome"] == "completed"
        assert [w["provider"] for w in c.call("host.status")["workers"]] == ["tutti-agent"]
    finally:
        d.stop()
    assert "started ahead" not in d.tail_log(100_000)


def test_a_worker_started_ahead_is_restarted_after_its_death_and_ends_with_the_daemon(
    daemon: DaemonProcess,
) -> None:
    first = _ready_worker(daemon, "tutti-agent")
    os.kill(first["pid"], signal.SIGKILL)
    c = daemon.client()
    # No request needs it: the supervisor restarts it as any worker of its own.
    again = wait_for(
        lambda: next(
            (
                w
                for w in c.call("host.status")["workers"]
                if w["state"] == "ready" and w["pid"] != first["pid"]
            ),
            None,
        ),
        timeout=60,
    )
    assert again["restarts"] == 1
    sid = create_session(c)["agentSessionId"]
    assert run_turn(c, sid, "hello")["outcome"] == "completed"
    assert daemon.proc is not None
    tree = [p.pid for p in _descendants(daemon.proc.pid)]
    assert again["pid"] in tree and len(tree) == 2  # the worker and its Session's app-server
    assert not check_processes(daemon.home, daemon.proc.pid)
    assert daemon.stop() == 0
    # No orphan: nothing of the daemon's tree, nothing naming its home, is left running.
    assert wait_for(lambda: not any(_alive(pid) for pid in tree), timeout=30)
    assert wait_for(lambda: _of_home(daemon.home) == [], timeout=30)
    assert not check_processes(daemon.home, None)


def test_the_workers_wait_for_the_commits_recovery_deferred_past_ready(tmp_path: Path) -> None:
    from tests.daemon.test_deferred_recovery import _leftovers

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    _leftovers(home, 120)
    workdir = tmp_path / "work"
    workdir.mkdir()
    daemon = Daemon(load_config(home), default_cwd=workdir, commits_before_ready=0)
    try:
        daemon.start()
        deferred = daemon.deferred_commits
        assert deferred is not None and deferred.pending > 0
        thread = daemon.start_workers_ahead()
        assert thread is not None
        seen_pending = False
        while True:
            # Read the worker rows first: one seen means the commits were all made before.
            rows = daemon.supervisor.status()
            done = deferred.wait(0)
            if rows:
                assert done, "a worker was started while recovery's commits were still running"
                break
            seen_pending = seen_pending or not done
            time.sleep(0.002)
        assert seen_pending, "the commits ended before the first look: nothing was tested"
        thread.join(30)
        assert [r["provider"] for r in daemon.supervisor.status()] == ["tutti-agent"]
    finally:
        daemon.close()


def test_a_worker_loads_its_driver_as_it_starts(tmp_path: Path) -> None:
    """`start_ahead` spawns the worker without a request; the worker loads its driver on its
    own (`preload`), so the first request finds it loaded."""
    sup = WorkerSupervisor(tmp_path / "run")
    try:
        sup.start_ahead("tutti-agent")
        row = wait_for(
            lambda: next((w for w in sup.status() if w["state"] == "ready"), None), timeout=30
        )
        # Sent only once the driver had time to load: a ping is on the fast lane and does
        # not load it itself.
        got = wait_for(
            lambda: (
                r
                if (r := sup.request("tutti-agent", "worker.ping", {}, 15).result(20))[
                    "driverLoaded"
                ]
                else None
            ),
            timeout=30,
        )
        assert got["pid"] == row["pid"]
        # A second `start_ahead` of a provider with a worker spawns nothing.
        sup.start_ahead("tutti-agent")
        assert sup.request("tutti-agent", "worker.ping", {}, 15).result(20)["pid"] == row["pid"]
        assert [w["restarts"] for w in sup.status()] == [0]
    finally:
        sup.close()
    assert not _alive(row["pid"])


def test_a_worker_without_a_driver_says_nothing_until_asked(tmp_path: Path) -> None:
    """A provider whose driver cannot load: the worker started ahead stays quiet (no
    traceback in its log) and the first request gets the typed error, as before."""
    sup = WorkerSupervisor(tmp_path / "run")
    try:
        sup.start_ahead("nope-" + uuid.uuid4().hex[:6])
        rows = wait_for(lambda: [w for w in sup.status() if w["state"] == "ready"], timeout=30)
        provider = rows[0]["provider"]
        ping = sup.request(provider, "worker.ping", {}, 15).result(20)
        assert ping["driverLoaded"] is False
    finally:
        sup.close()
    log = (tmp_path / "run" / f"worker-{provider}.log").read_text(errors="replace")
    assert "Traceback" not in log, log
