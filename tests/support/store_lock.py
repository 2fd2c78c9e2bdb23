"""A real store fault for tests: another process holding SQLite's write lock on the store file
(`BEGIN IMMEDIATE` on its own connection), as a backup tool or a second reader gone wrong
would. Nothing is mocked: the daemon's writes meet a genuinely locked database."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from types import TracebackType

_HOLDER = r"""
import sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.set_busy_timeout(30_000)
conn.execute("BEGIN IMMEDIATE")
sys.stdout.write("locked\n")
sys.stdout.flush()
sys.stdin.read()  # hold the lock until the test closes our stdin (or kills us)
conn.execute("ROLLBACK")
"""


class WriteLockHolder:
    """`with WriteLockHolder(store_path):` holds the write lock from another process."""

    def __init__(self, store_path: Path) -> None:
        self.store_path = store_path
        self.proc: subprocess.Popen[str] | None = None

    def acquire(self) -> WriteLockHolder:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(self.store_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "locked":
            self.release()
            raise RuntimeError(f"could not take the write lock of {self.store_path}")
        return self

    def release(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(10)

    def __enter__(self) -> WriteLockHolder:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class ReleaseWhenLogged(logging.Handler):
    """`with ReleaseWhenLogged(holder, "opening the store deferred"):` lets go of `holder`'s
    lock when a log record whose message holds `text` is emitted (the write that met the lock
    has backed off: it is tried again after the lock is gone), and counts those records. No
    timer: the lock is held exactly until the write under test has met it."""

    def __init__(self, holder: WriteLockHolder, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.holder = holder
        self.text = text
        self.seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen += 1
            self.holder.release()

    def __enter__(self) -> ReleaseWhenLogged:
        root = logging.getLogger()
        self._level = root.level
        root.setLevel(min(root.level or logging.WARNING, logging.WARNING))
        root.addHandler(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self._level)
        self.holder.release()
