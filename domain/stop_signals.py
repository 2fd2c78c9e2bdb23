"""A process's stop signals and the main loop's wait for them (the daemon's and a worker's).

A handler only records the signal: a handler that took a lock (`Event.set`) could deadlock with
the main thread interrupted inside that same lock. The main loop is woken at once by the
signal's byte on a wake-up pipe (`signal.set_wakeup_fd`) instead of finding the flag at its
next poll; the poll is left for what else ends it (a fatal fault, a dead parent).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable, Iterable


class StopSignals:
    """Installed on the main thread: `received` lists the stop signals taken, oldest first."""

    def __init__(
        self, signals: Iterable[signal.Signals], *, keep_ignored: Iterable[signal.Signals] = ()
    ) -> None:
        # `keep_ignored`: those of them ignored when the process started stay ignored (a daemon
        # started by `nohup` keeps ignoring the SIGHUP of the terminal it was started from).
        kept = frozenset(keep_ignored)
        self.received: list[int] = []
        self._wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for stop in signals:
            if stop in kept and signal.getsignal(stop) is signal.SIG_IGN:
                continue
            signal.signal(stop, lambda signum, _frame: self.received.append(signum))

    def __bool__(self) -> bool:
        return bool(self.received)

    def first_name(self) -> str:
        return signal.Signals(self.received[0]).name

    def wait(self, stop_also: Callable[[], bool], poll_s: float) -> None:
        """Return once a stop signal came or `stop_also()` holds (looked at every `poll_s`)."""
        while not self.received and not stop_also():
            select.select([self._wake_r], [], [], poll_s)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 512)
