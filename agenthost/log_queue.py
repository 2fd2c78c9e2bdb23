"""The daemon's log, never waited on: `agenthost serve` logs through a bounded queue that one
thread of its own (`agenthost-log`) writes to stderr.

A stderr nobody reads (a launcher that reads only the ready line from stdout and keeps the
stderr pipe; a terminal paused with Ctrl-S; `serve 2>&1 | less` at a page) fills its pipe, and a
write to it waits until it is read. Logged inline, that wait was any thread's that logged —
a request's reader, a Session's actor, `host.status`'s — and, behind the handler's lock, every
other thread's that logged after it: the daemon answered nothing. Now a thread that logs only
formats the line and queues it; a line that finds the queue full is dropped and counted
(`host.status` → `log: {dropped, queued, capacity}`, an extension). A SIGKILL loses the lines
still queued; a clean stop writes them first, for a bounded time (`stop`), and the process then
exits whether or not they were read (`LogQueue._write`). An exception nothing
caught (in a thread, on the main thread, or "ignored" in a `__del__` or a callback) is logged
the same way while the queue is installed, never printed to stderr by Python's default hooks.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import sys
import threading
from types import TracebackType
from typing import IO, Any

CAPACITY = 1024
"""Log lines queued at most (one LogRecord each, its message already formatted)."""

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Dropping(logging.handlers.QueueHandler):
    """Queues a record without waiting: a full queue drops it, counted."""

    def __init__(self, sink: LogQueue) -> None:
        super().__init__(sink.queue)
        self._sink = sink

    def enqueue(self, record: logging.LogRecord) -> None:
        # Its size read, then put, without a lock: threads logging at once may pass the
        # bound by a few lines (no more than there are of them).
        if self._sink.queue.qsize() >= self._sink.capacity:
            self._sink.count_dropped()
        else:
            self._sink.queue.put(record)


class LogQueue:
    """The queue, its writer thread and the count of lines dropped."""

    def __init__(self, stream: IO[str], capacity: int = CAPACITY) -> None:
        # `SimpleQueue` (C): a put and the writer's wake-up are one lock each, not a Python
        # `Condition`'s (-v: about 10 futex calls a line with `queue.Queue`, measured).
        self.queue: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
        self.capacity = capacity
        self.dropped = 0
        self._lock = threading.Lock()
        self.formatter = logging.Formatter(FORMAT)
        self._stream = stream
        self._fd = _fileno(stream)
        self.handler = _Dropping(self)
        self._thread = threading.Thread(target=self._drain, name="agenthost-log", daemon=True)
        self._hooks: _Hooks | None = None

    def count_dropped(self) -> None:
        with self._lock:
            self.dropped += 1

    def start(self) -> None:
        self._thread.start()

    def _drain(self) -> None:
        while (record := self.queue.get()) is not None:
            self._write(record)  # its write may wait on the stream: here only

    def _write(self, record: logging.LogRecord) -> None:
        """One line, written by `os.write` to the stream's descriptor: a write that waits on
        a stream nobody reads holds no lock of Python's (not a `logging.Handler`'s, which
        `logging.shutdown` takes at exit, nor `sys.stderr`'s buffer, which the interpreter
        flushes at exit) — a stop whose bound ran out leaves this thread waiting and the
        process still exits. A line the stream refuses (closed, broken) is counted dropped."""
        try:
            line = self.formatter.format(record) + "\n"
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is one line lost
            self.count_dropped()
            return
        if self._fd is None:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (OSError, ValueError):
                self.count_dropped()
            return
        data = memoryview(line.encode("utf-8", "backslashreplace"))
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError:
            self.count_dropped()

    def stop(self, timeout: float) -> bool:
        """Write what is queued and end the writer, waited for up to `timeout` (a stream
        still unread keeps the rest); whether all was written. Lines logged after it go
        to the logging module's last resort (warnings and worse, to stderr)."""
        logging.getLogger().removeHandler(self.handler)
        if self._hooks is not None:
            self._hooks.restore()
            self._hooks = None
        if self in _INSTALLED:
            _INSTALLED.remove(self)
        self.queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def status(self) -> dict[str, Any]:
        return {"dropped": self.dropped, "queued": self.queue.qsize(), "capacity": self.capacity}


def _fileno(stream: IO[str]) -> int | None:
    """The descriptor under `stream`, its buffer written out first; None for a stream with no
    descriptor (written through its own `write`)."""
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


_INSTALLED: list[LogQueue] = []

_uncaught = logging.getLogger("agenthost.uncaught")

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _exc_info(
    kind: type[BaseException], value: BaseException | None, tb: TracebackType | None
) -> ExcInfo | None:
    return None if value is None else (kind, value, tb)


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    # Python's own hook writes to stderr from the raising thread: on a pipe nobody reads, that
    # thread waited for good, holding stderr's buffer lock.
    if args.exc_type is SystemExit:  # a thread's SystemExit ends it silently, as by default
        return
    name = args.thread.name if args.thread is not None else "?"
    info = _exc_info(args.exc_type, args.exc_value, args.exc_traceback)
    _uncaught.error("uncaught exception in thread %s", name, exc_info=info)


def _log_exception(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    _uncaught.error("uncaught exception", exc_info=(kind, value, tb))


def _log_unraisable(args: sys.UnraisableHookArgs) -> None:
    try:
        where = repr(args.object) if args.object is not None else ""
    except Exception:  # noqa: BLE001 - a repr that raises must not hide the exception
        where = f"<{type(args.object).__name__} object>"
    message = args.err_msg or "Exception ignored in"
    info = _exc_info(args.exc_type, args.exc_value, args.exc_traceback)
    _uncaught.error("%s: %s", message, where, exc_info=info)


class _Hooks:
    """Python's three hooks for an exception nothing caught, pointed at the log while a
    `LogQueue` is installed; the ones found are put back at its stop."""

    def __init__(self) -> None:
        self._thread = threading.excepthook
        self._sys = sys.excepthook
        self._unraisable = sys.unraisablehook

    @classmethod
    def route(cls) -> _Hooks:
        saved = cls()
        threading.excepthook = _log_thread_exception
        sys.excepthook = _log_exception
        sys.unraisablehook = _log_unraisable
        return saved

    def restore(self) -> None:
        threading.excepthook = self._thread
        sys.excepthook = self._sys
        sys.unraisablehook = self._unraisable


def install(stream: IO[str], level: int) -> LogQueue:
    """The root logger's one handler: a `LogQueue` on `stream` (what `logging.basicConfig`
    did with the stream itself), started."""
    sink = LogQueue(stream)
    root = logging.getLogger()
    root.setLevel(level)
    root.addHandler(sink.handler)
    sink._hooks = _Hooks.route()
    sink.start()
    _INSTALLED.append(sink)
    return sink


def status() -> dict[str, Any] | None:
    """The installed queue's counts (`host.status`'s `log`), None when the daemon logs
    otherwise (in-process in a test: its host's own handlers)."""
    return _INSTALLED[-1].status() if _INSTALLED else None
