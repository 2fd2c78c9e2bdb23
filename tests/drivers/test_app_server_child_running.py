"""`child_running`: an app-server that has exited is not running, even while another thread
is inside `Popen.wait()` (the reader, which saw its stdout close) — where `Popen.poll()`
alone answers None. A worker that believed the dead runtime live would stamp its old
generation and the host would skip a fork's re-attestation."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time

from actors.session_runtime import process_alive
from drivers.app_server.process import child_running


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]


def test_a_zombie_is_not_running_while_another_thread_holds_the_wait() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child_running(proc)
        # What a thread inside `wait()` holds: `poll()` cannot take it and answers None.
        with proc._waitpid_lock:
            proc.send_signal(signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _state(proc.pid) != b"Z":
                assert time.monotonic() < deadline, "the child never became a zombie"
                time.sleep(0.005)
            assert proc.poll() is None  # the trap: poll alone calls the zombie running
            assert not child_running(proc)
            assert _state(proc.pid) == b"Z"  # seen without reaping it
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not child_running(proc)


def test_a_reaped_child_is_not_running() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not child_running(proc)


def test_a_running_child_is_asked_by_one_waitid_without_poll(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A running app-server's check is `waitid` and `/proc` (as the host's), not `Popen.poll`'s
    lock and `wait4` before it (the worker asks twice a fork); an exited one is still reaped."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    polls: list[int] = []
    real_poll = proc.poll
    proc.poll = lambda: polls.append(1) or real_poll()  # type: ignore[method-assign]
    waitids: list[int] = []
    real_waitid = os.waitid

    def counting_waitid(*args: int) -> object:
        waitids.append(1)
        return real_waitid(*args)

    monkeypatch.setattr(os, "waitid", counting_waitid)
    try:
        for _ in range(5):
            assert child_running(proc)
        assert (len(polls), len(waitids)) == (0, 5)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        deadline = time.monotonic() + 10
        while _state(proc.pid) != b"Z":
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.005)
    assert not child_running(proc)
    assert polls == [1]  # the exited child reaped by the check
    assert proc.returncode == 0
    assert not child_running(proc)
    assert polls == [1]  # then its return code answers, no system call


_SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]


def test_a_child_whose_leader_exited_is_not_running_before_it_is_waitable() -> None:
    """A killed multi-threaded app-server's leader is a zombie until its last thread has gone,
    and only then waitable: the host's `/proc` check calls it dead at once, so the worker must
    too (else a `session.start` in that window stamps the dying runtime's generation and the
    next fork is refused by the worker). Made exact here: the child's leader thread exits
    alone (`SYS_exit`, not `exit_group`) while another of its threads keeps running."""
    code = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        f"ctypes.CDLL(None).syscall({_SYS_EXIT}, 0)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while _state(proc.pid) != b"Z":
            assert time.monotonic() < deadline, "the leader never exited"
            time.sleep(0.005)
        # Not waitable: the trap `waitid` alone falls into.
        assert os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        assert not process_alive(proc.pid)  # the host's view
        assert not child_running(proc)
    finally:
        proc.kill()
        proc.wait()
