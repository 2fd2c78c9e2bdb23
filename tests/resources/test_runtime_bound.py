"""Bounded provider runtimes, through the real daemon: many Sessions each running 3 turns at once,
with the live provider runtimes bounded per provider (`max_runtimes_per_provider`, here 4). Turns
beyond the bound queue (their Turn is accepted and stays `active` until a runtime slot frees; idle
runtimes are stopped least-recently-used first). Every turn completes; no worker restart, no 500, no
Turn left active; the worker never holds more than 4 app-servers.

The second test runs the full-size shape (200 × 3, bound 64) at test size: every runtime start
is slow (a wrapper sleeps before the app-server starts) and the inactivity limit is short. The
wait for a slot or a start permit counts against no limit (else Turns queued for a slot, or
whose runtime is still starting, would settle `failed` as "silent"), only
`max_runtime_starts_per_provider` runtimes start at once, and a stop waits for the start (else
it would race the start in the worker, which would attach the new app-server to a Session
nobody holds: alive, uncounted, past the bound).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, create_session, settle, submit, timeline
from transport.client import ApiError

pytestmark = pytest.mark.timeout(300)

SESSIONS = 12
TURNS = 3
LIMIT = 4


def _app_servers(pid: int) -> list[int]:
    """The live (not zombie) child processes of `pid` that run an app-server (`app-server`
    among their arguments, from the `setpriv` that execs it on): the runtimes the bound counts.
    The worker's other children are not runtimes: its one `setpriv --help` lookup, and any
    child between its fork and its exec, which still shows the worker's own command line (a
    sample once saw such a child beside 4 app-servers under a bound of 4)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        # An app-server that has exited but is not yet reaped (a zombie) runs nothing: it is
        # not one of the live app-servers the bound counts.
        if (
            int(fields.get("PPid", "0").strip() or 0) == pid
            and not fields.get("State", "").strip().startswith("Z")
            and b"app-server" in argv
        ):
            out.append(int(proc.name))
    return out


@pytest.mark.timeout(30)
def test_the_watcher_counts_app_servers_not_the_workers_other_children() -> None:
    """A child running an app-server counts; a helper child (the worker's `setpriv --help`, or
    a fork not yet exec'd) does not."""
    before = len(_app_servers(os.getpid()))
    helper = subprocess.Popen(["sleep", "30"])
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "app-server"])
    try:
        deadline = time.monotonic() + 10
        while len(_app_servers(os.getpid())) < before + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_app_servers(os.getpid())) == before + 1
    finally:
        for child in (helper, server):
            child.kill()
            child.wait()


def test_sessions_times_3_turns_complete_under_a_runtime_bound_of_4(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(f"[daemon]\nmax_runtimes_per_provider = {LIMIT}\n")
    _run_sessions(home, SESSIONS, TURNS, LIMIT)


def test_slow_starts_under_a_small_bound_are_queued_not_failed(tmp_path: Path) -> None:
    """6 Sessions × 2 turns, bound 2, each runtime start ≥ 1 s, `turn_inactivity_seconds = 2`:
    most Turns wait longer than 2 s for a slot. All complete, no restart, never more than 2
    app-servers, none left active."""
    home = tmp_path / "home"
    home.mkdir()
    wrapper = tmp_path / "slow-tutti-agent.sh"
    tutti = Path(sys.executable).parent / "tutti-agent"
    wrapper.write_text(f'#!/bin/sh\nsleep 1\nexec "{tutti}" "$@"\n')
    wrapper.chmod(0o755)
    (home / "agenthost.toml").write_text(
        "[daemon]\nmax_runtimes_per_provider = 2\n"
        "turn_inactivity_seconds = 2\n"
        f'[providers."tutti-agent"]\ncommand = ["/bin/sh", "{wrapper}"]\n'
    )
    _run_sessions(home, 6, 2, 2)


def _run_sessions(home: Path, sessions: int, turns: int, limit: int) -> None:
    d = DaemonProcess(home).start()
    errors: list[str] = []
    statuses: list[int] = []
    peak = [0]
    done = threading.Event()
    try:
        c = d.client(timeout=120)
        sids = [create_session(c)["agentSessionId"] for _ in range(sessions)]
        worker_pid = [0]

        def watch() -> None:
            # Sample the worker's live app-servers throughout the run.
            while not done.wait(0.05):
                if not worker_pid[0]:
                    for w in c.call("host.status")["workers"]:
                        if w["provider"] == "tutti-agent" and w["pid"]:
                            worker_pid[0] = w["pid"]
                    continue
                peak[0] = max(peak[0], len(_app_servers(worker_pid[0])))

        def drive(sid: str) -> None:
            own = d.client(timeout=120)
            for i in range(turns):
                request_id = str(uuid.uuid4())
                while True:
                    try:
                        turn = submit(own, sid, f"turn {i}", request_id=request_id)
                        break
                    except ApiError as exc:
                        statuses.append(exc.status)
                        if not exc.retryable:
                            errors.append(f"{sid} turn {i}: {exc}")
                            return
                        time.sleep(0.1)
                settled = settle(own, sid, turn["turnId"], timeout=240)
                if settled["outcome"] != "completed":
                    errors.append(f"{sid} turn {i}: {settled['outcome']} {settled.get('error')}")

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        threads = [threading.Thread(target=drive, args=(sid,)) for sid in sids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(280)
        done.set()
        watcher.join(5)
        assert not errors, errors[:5]
        assert 500 not in statuses
        status: dict[str, Any] = c.call("host.status")
        assert all(w["restarts"] == 0 for w in status["workers"]), status["workers"]
        assert status["runtimes"]["tutti-agent"]["live"] <= limit, status["runtimes"]
        assert status["runtimes"]["tutti-agent"]["queued"] == 0
        assert status["runtimes"]["tutti-agent"]["starting"] == 0
        for sid in sids:
            settled = timeline(c, sid)
            assert [t["outcome"] for t in settled] == ["completed"] * turns, settled
        assert 0 < peak[0] <= limit, peak[0]
    finally:
        done.set()
        d.stop()
