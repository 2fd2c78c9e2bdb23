"""A soak's daemon whose start a test's timeout cut short is not left serving: the caller never
got it to stop, and the next run on the same `--basetemp` (the same home path) met it as a
process of its home outside its daemon's tree (`process_owned`, a false violation)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

import pytest

from tests.support.daemon import DaemonProcess


class Cut(Exception):
    """What a test's timeout raises in the waiting thread."""


def test_a_daemon_start_cut_short_leaves_no_daemon_running(tmp_path: Path) -> None:
    def cut(signum: int, frame: FrameType | None) -> None:
        raise Cut

    before = signal.signal(signal.SIGUSR1, cut)
    d = DaemonProcess(tmp_path / "home")

    def cut_once_spawned() -> None:
        # Right after the spawn (a fork and exec), long before the daemon is ready (its imports,
        # its store): not after a fixed time, which a loaded machine's start can outrun.
        deadline = time.monotonic() + 60
        while d.proc is None and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGUSR1)

    timer = threading.Thread(target=cut_once_spawned)
    timer.start()
    try:
        with pytest.raises(Cut):
            d.start()
    finally:
        timer.join()
        signal.signal(signal.SIGUSR1, before)
    assert d.proc is not None, "the start was cut before it spawned the daemon"
    assert d.proc.poll() is not None, "the daemon whose start was cut serves on"
