"""A clean stop (SIGTERM) of the real `agenthost serve` while a resource holds it up ends within
a bound, exit 0, and leaves no process of its home running (`Law.PROCESS_OWNED`): a provider
SIGSTOPped mid-Turn, a worker SIGSTOPped, a checkpoint's git stalled holding the shadow index's
lock (killed by the stop, as a killed daemon's are by the next start), the store held by
another process's write transaction while a write waits on it (answered `shutting_down`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import apsw
import pytest

from tests.daemon.test_hung_provider import _app_servers
from tests.support.daemon import REPO, WS, DaemonProcess, create_session, run_turn, submit, wait_for
from tests.support.invariants import check_processes
from tests.support.stalling_git_home import StallingGitHome, stalling_git_home
from tests.workspace.stalling_git import running
from transport.client import Client

pytestmark = pytest.mark.timeout(150)

STOP_BOUND_S = 60.0
"""Far past every bound a stop waits on (a worker's exit, the log's flush, a git's kill): a
stop that does not end by then waits on something it has no bound for."""


def _stops_cleanly(d: DaemonProcess) -> None:
    assert d.proc is not None
    d.proc.send_signal(signal.SIGTERM)
    try:
        rc = d.proc.wait(STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        d.kill()
        raise AssertionError(f"no exit {STOP_BOUND_S} s after SIGTERM: {d.tail_log()}") from None
    assert rc == 0, (rc, d.tail_log())
    assert check_processes(d.home, None) == []


def _workers(d: DaemonProcess) -> dict[str, int]:
    status = d.client().call("host.status", {})
    return {w["provider"]: w["pid"] for w in status.get("workers", []) if w.get("pid")}


def _warm_session(d: DaemonProcess) -> tuple[Client, str]:
    """A client and a Session whose runtime has run one Turn (its worker and provider up)."""
    c = d.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "warm")
    return c, sid


def _stall_a_capture(at: StallingGitHome) -> None:
    """A Session of the folder with one Turn recorded, then a Turn whose `git add` stalls
    (with its child) holding the shadow index's lock."""
    client = at.daemon.client()
    sid = create_session(client, cwd=str(at.folder))["agentSessionId"]
    assert run_turn(client, sid, "hello")["workspace"]["after"]
    (at.folder / "a.txt").write_text("a, changed\n")
    at.stall.arm()
    submit(client, sid, "stalled")
    wait_for(lambda: len(at.stall.pids()) == 2, 30)


def test_a_stop_with_a_provider_stopped_mid_turn(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c, sid = _warm_session(d)
        for pid in _app_servers(sid):
            os.kill(pid, signal.SIGSTOP)
        submit(c, sid, "never answered")
        time.sleep(0.5)
        _stops_cleanly(d)
    finally:
        d.kill()


def test_a_stop_with_a_worker_stopped(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c, sid = _warm_session(d)
        workers = _workers(d)
        assert workers, "host.status names no worker"
        for pid in workers.values():
            os.kill(pid, signal.SIGSTOP)
        submit(c, sid, "never started")
        time.sleep(0.5)
        _stops_cleanly(d)
    finally:
        d.kill()


def test_a_stop_with_a_checkpoint_git_stalled(tmp_path: Path) -> None:
    with stalling_git_home(tmp_path, "add", timeout_s=300.0) as at:
        _stall_a_capture(at)
        _stops_cleanly(at.daemon)


def test_a_stop_with_the_store_held_by_another_process(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    holder: apsw.Connection | None = None
    try:
        c = d.client()
        store = d.home / "store.sqlite3"
        holder = apsw.Connection(str(store))
        holder.execute("BEGIN IMMEDIATE")
        pending = c.submit(
            "session.create",
            {"workspaceId": WS, "provider": "tutti-agent", "title": "waits"},
        )
        time.sleep(1.0)
        assert not pending.done(), pending.result().body
        _stops_cleanly(d)
        reply = pending.result(timeout=5)  # answered, not dropped
        assert reply.status == 503 and reply.body["reason"] == "shutting_down", reply.body
    finally:
        if holder is not None:
            with contextlib.suppress(apsw.Error):
                holder.execute("ROLLBACK")
            holder.close()
        d.kill()


def test_a_start_refused_before_it_holds_the_home_leaves_the_live_daemons_gits(
    tmp_path: Path,
) -> None:
    """A second `serve` on a live home refused before it takes the home (an ipc endpoint in a
    directory open to others) closes without killing the gits of the daemon that holds it."""
    with stalling_git_home(tmp_path, "add", timeout_s=300.0) as at:
        _stall_a_capture(at)
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        shared.chmod(0o755)
        refused = subprocess.run(
            [sys.executable, "-m", "agenthost", "--home", str(at.home), "serve"]
            + ["--listen", f"ipc://{shared}/x.sock"],
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert all(running(pid) for pid in at.stall.pids()), "the live daemon's git was killed"
