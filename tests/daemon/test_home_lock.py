"""One daemon per home, through real `agenthost serve` processes: a second
`serve` on a live home exits 1 naming the live daemon and changes nothing (its turn
completes, its fork commits), even after `run/` was removed under the live daemon (the lock is
on the home directory; the daemon makes `run/` again and serves new clients); a daemon whose
home is moved away stops; a SIGKILLed daemon's stale lock and socket do not block a restart;
the CLI tells a dead daemon (lock free: exit 3 at once) from a hung one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drivers.worker_spawn import fallback_socket_dir
from tests.daemon.test_fork_saga import fork, get_op, three_turn_source, until_terminal
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    respond,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.invariants import socket_dirs_of

pytestmark = pytest.mark.timeout(120)

# Request ids: UUIDs, and the client's own `<hex>-<hex>-<n>` ids.
REQUEST_ID = re.compile(r"[0-9a-f]{4,}-[0-9a-f]{4,}")


def agenthost(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTHOST_")}
    return subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def remove_run(run: Path) -> None:
    """`rm -r run/` as a cleaner does it, again while it fails: the live daemon's workers
    (started ahead) may make their own directory in it between the listing and the rmdir."""
    for _ in range(50):
        try:
            shutil.rmtree(run)
            return
        except FileNotFoundError:
            return
        except OSError:
            continue
    shutil.rmtree(run)


def snapshot(home: Path) -> dict[str, str]:
    """Every byte of the store and the provider homes. SQLite's -shm is left out: readers
    update their read marks in it, and the live daemon reads while we look."""
    out: dict[str, str] = {}
    for root in (home, home / "runtimes"):
        paths = root.rglob("*") if root.name == "runtimes" else root.glob("store.sqlite3*")
        for path in sorted(paths):
            if path.is_file() and not path.name.endswith("-shm"):
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_dir():
                out[str(path)] = "dir"
    return out


def quiet_snapshot(home: Path) -> dict[str, str]:
    """A snapshot the live daemon is not in the middle of changing (two equal in a row)."""
    last: list[dict[str, str]] = [snapshot(home)]

    def stable() -> bool:
        now = snapshot(home)
        same = now == last[0]
        last[0] = now
        return same

    wait_for(stable, 20, interval=0.3)
    return last[0]


def test_a_second_serve_on_a_live_home_exits_1_and_touches_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        other = create_session(c)["agentSessionId"]
        run_turn(c, other, "warm")  # its runtime is up
        # Held by events, not by timers, so a slow machine cannot let either finish while the
        # second `serve` runs: the fork hangs inside the worker before its provider call until
        # the point is disarmed, and the turn waits on a question until it is answered.
        c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "hang"}})
        _, op = fork(c, sid, turns[1]["turnId"])
        asking = submit(c, other, "/ask still running?")
        wait_for(lambda: get_op(c, op["operationId"])["phase"] == "dispatching")
        pending = wait_for(
            lambda: [
                i
                for i in turn_of(c, other, asking["turnId"])["interactions"]
                if i["status"] == "pending"
            ]
        )
        before = quiet_snapshot(home)

        second = agenthost(home, "serve")
        after = snapshot(home)

        assert second.returncode == 1, second.stderr
        assert f"another agenthost (pid {d.proc.pid}) is serving {home}" in second.stderr
        assert "Traceback" not in second.stderr
        assert after == before  # no recovery ran on the live store, no provider home changed
        # The live daemon's work is untouched: its turn completes and its fork commits.
        c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "off"}})
        c.call(
            "interaction.respond",
            {
                "workspaceId": WS,
                "agentSessionId": other,
                "turnId": asking["turnId"],
                "requestId": pending[0]["requestId"],
                "response": {"text": "yes"},
            },
        )
        assert settle(c, other, asking["turnId"])["outcome"] == "completed"
        assert until_terminal(c, op, timeout=60)["status"] == "committed"
        assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        d.stop()
    assert "InvalidTransition" not in d.tail_log(10**7)


def test_removing_run_under_a_live_daemon_neither_frees_the_home_nor_ends_its_turn(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")  # its worker and runtime are up
        asking = submit(c, sid, "/ask still running?")  # held by a question, not a timer
        pending = wait_for(
            lambda: [
                i
                for i in turn_of(c, sid, asking["turnId"])["interactions"]
                if i["status"] == "pending"
            ]
        )
        before = quiet_snapshot(home)

        remove_run(home / "run")  # what a cleaner of old /tmp entries does
        second = agenthost(home, "serve", timeout=30)
        after = snapshot(home)

        assert second.returncode == 1, second.stderr
        assert f"is serving {home}" in second.stderr and "another agenthost" in second.stderr
        assert "Traceback" not in second.stderr
        assert after == before  # no recovery ran on the live store, no provider home changed
        # The live daemon's Turn goes on, on the connection it already had.
        respond(c, sid, asking["turnId"], pending[0]["requestId"], {"text": "yes"})
        assert settle(c, sid, asking["turnId"])["outcome"] == "completed"

        # `run/` is made again, 0700, with the lock naming the live daemon and a socket a new
        # client reaches; the CLI finds the daemon there, and a third `serve` names its pid.
        # The restore renews the lock first and writes connection.json last: wait for both.
        lock = home / "run" / "daemon.lock"
        connection = home / "run" / "connection.json"
        wait_for(
            lambda: (
                lock.exists()
                and lock.read_text().strip() == str(d.proc.pid)
                and connection.exists()
            )
        )
        assert (home / "run").stat().st_mode & 0o777 == 0o700
        assert connection.stat().st_mode & 0o777 == 0o600
        status = agenthost(home, "--json", "status")
        assert status.returncode == 0, status.stderr
        assert run_turn(d.client(), sid, "after")["outcome"] == "completed"  # a new connection
        third = agenthost(home, "serve", timeout=30)
        assert third.returncode == 1
        assert f"another agenthost (pid {d.proc.pid}) is serving {home}" in third.stderr
    finally:
        assert d.stop() == 0
    log = d.tail_log(10**7)
    assert "was removed under the live daemon: made it again" in log
    assert "interrupted" not in log and "InvalidTransition" not in log


def test_files_removed_from_run_are_made_again(tmp_path: Path) -> None:
    """A removal that leaves `run/` itself (or races the daemon's own restoring): the socket
    is bound again and the lock file rewritten; the connection already made keeps working."""
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        for name in ("api.sock", "daemon.lock"):
            (home / "run" / name).unlink()
        lock = home / "run" / "daemon.lock"
        wait_for(lambda: lock.exists() and lock.read_text().strip() == str(d.proc.pid))
        wait_for(lambda: (home / "run" / "api.sock").exists())
        assert run_turn(d.client(), sid, "new connection")["outcome"] == "completed"
        assert run_turn(c, sid, "old connection")["outcome"] == "completed"
    finally:
        assert d.stop() == 0


def test_a_run_dir_one_of_our_writers_made_0755_is_tightened_not_fatal(tmp_path: Path) -> None:
    """`run/` removed, then made again under the umask (0755) by one of the daemon's own
    writers before the daemon restored it (a worker's failpoint state directory, say): the
    daemon sets it back to 0700 and keeps serving, it does not stop."""
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run = home / "run"
        remove_run(run)
        run.mkdir(mode=0o755)
        os.chmod(run, 0o755)
        wait_for(lambda: (run / "api.sock").exists() and (run.stat().st_mode & 0o777) == 0o700)
        assert d.proc is not None and d.proc.poll() is None
        assert run_turn(d.client(), sid, "after the race")["outcome"] == "completed"
    finally:
        assert d.stop() == 0


def test_a_second_serve_while_run_dir_is_0755_is_told_the_home_is_served(tmp_path: Path) -> None:
    """The instant between one of the live daemon's writers making `run/` again under the umask
    (0755) and the daemon tightening it: a second `serve` then must exit 1 naming the live
    daemon (not 2, "unsafe") and change nothing. The live daemon is held stopped over that
    instant (SIGSTOP: it keeps its lock), so the instant lasts as long as the test needs."""
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    assert d.proc is not None
    try:
        sid = create_session(d.client())["agentSessionId"]
        run = home / "run"
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            remove_run(run)
            run.mkdir(mode=0o755)
            os.chmod(run, 0o755)
            second = agenthost(home, "serve")
            assert second.returncode == 1, second.stderr
            assert "is serving" in second.stderr, second.stderr
            # Nothing of a daemon's made by the second (the live daemon's workers, not
            # stopped, may make their own directories in `run/` meanwhile: the race itself).
            made = {"daemon.lock", "api.sock", "events.sock", "connection.json", "keys"}
            assert not made & set(os.listdir(run)), os.listdir(run)
            assert (run.stat().st_mode & 0o777) == 0o755
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        wait_for(lambda: (run / "api.sock").exists() and (run.stat().st_mode & 0o777) == 0o700)
        assert run_turn(d.client(), sid, "after the second serve")["outcome"] == "completed"
    finally:
        assert d.stop() == 0


def test_a_daemon_whose_home_is_moved_away_stops(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    moved = tmp_path / "moved"
    try:
        create_session(d.client())
        os.rename(home, moved)  # its store is no longer where any client or daemon looks
        assert d.wait_exit(20) == 1
    finally:
        d.kill()
    assert "removed or replaced under the live daemon" in (moved / "daemon.log").read_text()


def test_a_sigkilled_daemons_stale_lock_and_socket_do_not_block_a_restart(
    tmp_path: Path,
) -> None:
    # A home long enough that its workers' sockets live in a directory outside it
    # (`drivers.worker_spawn.socket_dir`), short enough for its own api socket.
    home = tmp_path / ("h" * (84 - len(str(tmp_path))))
    lock = home / "run" / "daemon.lock"
    sock_dir = fallback_socket_dir(home / "run" / "workers")
    d = DaemonProcess(home).start()
    assert lock.read_text().strip() == str(d.proc.pid)
    sid = create_session(d.client())["agentSessionId"]
    for _ in range(3):
        d.kill()
        # What a SIGKILL leaves behind: the socket file and the lock file naming a dead pid,
        # and the workers' socket directory, which the next start takes again.
        assert (home / "run" / "api.sock").exists()
        assert lock.read_text().strip() == str(d.proc.pid)
        assert socket_dirs_of(home) == [sock_dir]
        d = DaemonProcess(home).start()
    d2 = d
    try:
        assert lock.read_text().strip() == str(d2.proc.pid)
        assert run_turn(d2.client(), sid, "back")["outcome"] == "completed"
        # ... and the restarted daemon holds the home as exclusively as the first one did.
        third = agenthost(home, "serve")
        assert third.returncode == 1
        assert f"another agenthost (pid {d2.proc.pid}) is serving {home}" in third.stderr
    finally:
        d2.stop()
    assert lock.read_text() == ""  # a clean stop names no daemon
    assert socket_dirs_of(home) == []


def test_the_cli_tells_a_dead_daemon_at_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    create_session(d.client())
    d.kill()
    assert (home / "run" / "api.sock").exists()  # stale: ZeroMQ alone would wait --timeout
    # --timeout is far beyond the subprocess limit: only the free lock can answer in time.
    done = agenthost(home, "--timeout", "600", "status", timeout=45)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("agenthost: daemon_unreachable: no agenthost is serving")
    assert not REQUEST_ID.search(done.stderr)
    done = agenthost(home, "--timeout", "600", "--json", "sessions", timeout=45)
    assert done.returncode == 3
    error = json.loads(done.stdout)["error"]
    assert error["reason"] == "daemon_unreachable" and not REQUEST_ID.search(error["message"])


def test_a_hung_daemon_is_reported_without_an_internal_request_id(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        d.client().call("host.status", {})
        assert d.proc is not None
        os.kill(d.proc.pid, signal.SIGSTOP)  # alive and holding the home, but silent
        try:
            done = agenthost(home, "--timeout", "1", "status")
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        assert done.returncode == 3
        assert "daemon_unreachable" in done.stderr
        assert f"agenthost (pid {d.proc.pid}) is running but busy or hung" in done.stderr
        assert not REQUEST_ID.search(done.stderr)
    finally:
        d.stop()


def test_say_during_a_stop_is_told_the_daemon_is_stopping_at_once(tmp_path: Path) -> None:
    """A stop held up (its worker SIGSTOPped: the stop waits for it within its bound) has
    closed the API socket and still holds the home: a `say` then is told in words that the
    daemon is stopping, exit 3, at once — not after its `--timeout` (600 here, far beyond the
    subprocess limit) as "has not opened" or "exited without replying"."""
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    workers: list[int] = []
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "warm")["outcome"] == "completed"
        workers = [w["pid"] for w in c.call("host.status", {})["workers"] if w.get("pid")]
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: not (home / "run" / "api.sock").exists(), 30)
        assert d.proc.poll() is None  # still stopping: it waits for the stopped worker
        done = agenthost(home, "--timeout", "600", "say", sid, "during the stop", timeout=45)
        assert done.returncode == 3, done.stderr
        assert f"the agenthost serving {home} (pid {d.proc.pid}) is stopping" in done.stderr, (
            done.stderr
        )
        assert not REQUEST_ID.search(done.stderr)
    finally:
        for pid in workers:  # stopped: nothing else ends them once the daemon is killed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        d.kill()
