"""`process_alive`, the host's no-round-trip check that a warm runtime's process is still there
(issue 20): a process killed a moment ago is dead to it at once — a SIGKILL waiting, a task
already exiting, a zombie — so the next fork or Turn takes the cold path instead of being
refused by the worker for a runtime that changed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from actors.session_runtime import alive_in_stat, process_alive, sigkill_pending

STAT = b"4242 (python3 (x) y) S 1 4242 4242 0 -1 %d 120 0 0 0 3 1 0 0 20 0 1 0 99 0 0"


def test_the_stat_line_says_running_zombie_or_exiting() -> None:
    assert alive_in_stat(STAT % 0x400000)
    assert not alive_in_stat(STAT.replace(b" S ", b" Z ") % 0x400000)
    assert not alive_in_stat(STAT.replace(b" S ", b" X ") % 0x400000)
    assert not alive_in_stat(STAT % (0x400000 | 0x4))  # PF_EXITING
    assert alive_in_stat(b"4242 (odd) S 1")  # no flags word: not evidence of an exit


def test_a_pending_sigkill_is_seen_in_the_process_or_its_main_thread() -> None:
    quiet = b"Name:\tx\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n"
    assert not sigkill_pending(quiet)
    assert sigkill_pending(
        quiet.replace(b"ShdPnd:\t0000000000000000", b"ShdPnd:\t0000000000000100")
    )
    assert sigkill_pending(
        quiet.replace(b"SigPnd:\t0000000000000000", b"SigPnd:\t0000000000000100")
    )
    # Another signal pending (SIGTERM, bit 15) is not a kill.
    assert not sigkill_pending(
        quiet.replace(b"ShdPnd:\t0000000000000000", b"ShdPnd:\t0000000000004000")
    )


def test_a_process_is_dead_to_it_as_soon_as_the_kill_returns() -> None:
    """Not only once it is a zombie: the kill returns before the process has run its exit."""
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert process_alive(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            assert not process_alive(proc.pid)
        finally:
            proc.kill()
            proc.wait(10)
        assert not process_alive(proc.pid)
