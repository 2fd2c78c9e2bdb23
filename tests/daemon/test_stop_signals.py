"""`agenthost serve` stops cleanly on SIGTERM (a service manager), SIGINT (Ctrl-C) and SIGHUP
(the terminal it runs in closed): exit 0, every process of its home gone — its workers and
their providers — its log saying why and that the stop finished, and the home free for the next
start. A SIGHUP ignored when it was started
(`nohup`) stays ignored: the daemon keeps serving."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import REPO, create_session, run_turn
from tests.support.invariants import check_processes
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def _serve(home: Path, *, ignore_hup: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost", "--home", str(home), "serve"],
        stdout=subprocess.PIPE,
        stderr=open(home / "daemon.log", "ab"),  # noqa: SIM115 - the child's for its life
        env=dict(os.environ, AGENTHOST_HOME=str(home), PYTHONPATH=str(REPO)),
        # As `nohup` leaves it: SIGHUP ignored, inherited across the exec.
        preexec_fn=(lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if ignore_hup else None,
    )
    assert proc.stdout is not None
    assert select.select([proc.stdout], [], [], 30)[0], "no ready line"
    return proc, str(json.loads(proc.stdout.readline())["api"])


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_serve_stops_cleanly_on(stop: signal.Signals, tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc, api = _serve(home)
    try:
        with Client(api, timeout=30) as client:
            assert run_turn(client, create_session(client)["agentSessionId"], "hi")["outcome"] == (
                "completed"
            )
        proc.send_signal(stop)
        assert proc.wait(60) == 0
        assert check_processes(home, None) == []
        # The log says why it went, and that the stop finished.
        log = (home / "daemon.log").read_text()
        assert f"stopping on {stop.name}" in log and log.rstrip().endswith("stopped"), log[-500:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    again, api = _serve(home)  # the home is free
    again.terminate()
    assert again.wait(60) == 0


def test_a_sighup_ignored_at_start_stays_ignored(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc, api = _serve(home, ignore_hup=True)
    try:
        proc.send_signal(signal.SIGHUP)
        with Client(api, timeout=30) as client:
            sid = create_session(client)["agentSessionId"]
            assert run_turn(client, sid, "still here")["outcome"] == "completed"
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


HOLD_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")  # the write lock, held until our stdin closes
print("held", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def _start_waiting_for_a_busy_store(home: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A daemon started (and stopped) once in `home`, then started again while another process
    holds the store's write lock: yields the second start once its log says its first write
    was deferred, and its log file. The start is killed if still running, the lock let go."""
    first, _ = _serve(home)
    first.terminate()
    assert first.wait(60) == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITE_LOCK, str(home / "store.sqlite3")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    proc: subprocess.Popen[bytes] | None = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        log_path = home / "daemon.log"
        log_path.write_text("")
        # The first write's wait for the lock at its least that still waits (10 s by default):
        # the start is deferred, and retried, after it.
        (home / "agenthost.toml").write_text("[daemon]\nstore_busy_timeout_ms = 100\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenthost", "--home", str(home), "serve"],
            stdout=subprocess.PIPE,
            stderr=open(log_path, "ab"),  # noqa: SIM115 - the child's for its life
            env=dict(os.environ, AGENTHOST_HOME=str(home), PYTHONPATH=str(REPO)),
        )
        deadline = time.monotonic() + 60
        while "deferred" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        yield proc, log_path
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_a_start_waiting_for_a_busy_store_ends_the_start(
    stop: signal.Signals, tmp_path: Path
) -> None:
    """Another process holds the store's write lock, so the start's first write waits (and is
    retried, up to its limit); a stop signal meanwhile ends the start there — exit 0, the log
    saying why, nothing left running — instead of being ignored until the retries run out and
    then failing `cannot start: the store is busy`."""
    home = tmp_path / "home"
    with _start_waiting_for_a_busy_store(home) as (proc, log_path):
        proc.send_signal(stop)
        assert proc.wait(60) == 0, log_path.read_text()
        log = log_path.read_text()
        assert f"stopping on {stop.name}: stopped while " in log, log[-800:]
        assert log.rstrip().endswith("stopped") and "cannot start" not in log, log[-800:]
        assert proc.stdout is not None and proc.stdout.read() == b""  # never ready
        assert check_processes(home, None) == []


def test_status_during_a_start_waiting_for_a_busy_store_says_it_is_starting(
    tmp_path: Path,
) -> None:
    """A start whose first write waits for a store another process keeps busy: `status`
    meanwhile says the daemon is starting and waiting for the store (exit 3 after its
    `--timeout`), not that it is "running but busy or hung" nor "still starting?"."""
    home = tmp_path / "home"
    with _start_waiting_for_a_busy_store(home) as (proc, _log):
        done = subprocess.run(
            [sys.executable, "-m", "agenthost.cli", "--home", str(home), "--timeout", "1"]
            + ["status"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, AGENTHOST_HOME=str(home), PYTHONPATH=str(REPO)),
        )
        assert done.returncode == 3, done.stderr
        assert f"agenthost (pid {proc.pid})" in done.stderr, done.stderr
        assert "is starting and waiting for the store (" in done.stderr, done.stderr
        assert "busy or hung" not in done.stderr and "still starting?" not in done.stderr
