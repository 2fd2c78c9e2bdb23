"""`agenthost serve`'s log queue on a real pipe: a line logged while the pipe is full is queued,
not waited on; a clean stop writes what is queued once the pipe is read again, and a stop on
a pipe nobody reads returns within its bound. While installed, an exception nothing caught
(a thread's, the main thread's, one raised in a `__del__`) is a line of the log."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import Iterator

import pytest

from agenthost import log_queue
from agenthost.log_queue import LogQueue

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:  # filled to the brim: the next write would wait
        while True:
            os.write(write, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write, True)
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):
            os.close(fd)


def _logger(sink: LogQueue) -> logging.Logger:
    logger = logging.getLogger(f"test-log-queue-{id(sink)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(sink.handler)
    return logger


def test_a_stop_writes_the_queued_lines_once_the_stream_is_read(pipe: tuple[int, int]) -> None:
    read, write = pipe
    stream = os.fdopen(os.dup(write), "w")
    sink = LogQueue(stream, capacity=8)
    sink.start()
    logger = _logger(sink)
    for i in range(12):  # each returns at once: 8 queued (and 1 in the stuck write) or dropped
        logger.info("line %d", i)
    assert sink.dropped >= 3
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(read, 1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    assert sink.stop(timeout=10)
    stream.close()
    os.close(write)
    reader.join(10)
    lines = [line for line in got.decode().splitlines() if "line " in line]
    assert len(lines) == 12 - sink.dropped
    assert lines[0].endswith("line 0")


def test_a_stop_on_a_stream_nobody_reads_returns_within_its_bound(pipe: tuple[int, int]) -> None:
    read, write = pipe
    stream = os.fdopen(os.dup(write), "w")
    sink = LogQueue(stream, capacity=4)
    sink.start()
    logger = _logger(sink)
    for i in range(10):
        logger.info("line %d", i)
    assert sink.stop(timeout=0.5) is False  # the writer still waits on the pipe
    reader = threading.Thread(
        target=lambda: [None for _ in iter(lambda: os.read(read, 1 << 16), b"")]
    )
    reader.start()  # read at last: the writer finishes what it holds and ends
    assert sink.stop(timeout=10)
    stream.close()
    os.close(write)
    reader.join(10)


class _RaisesInDel:
    def __del__(self) -> None:
        raise ValueError("raised in __del__")


def test_an_installed_queue_logs_exceptions_nothing_caught_and_its_stop_puts_the_hooks_back(
    pipe: tuple[int, int],
) -> None:
    read, write = pipe
    stream = os.fdopen(os.dup(write), "w")
    found = (threading.excepthook, sys.excepthook, sys.unraisablehook)
    root = logging.getLogger()
    level = root.level
    sink = log_queue.install(stream, logging.INFO)
    try:
        # The writer is held by the full pipe: what these queue stays in the queue, readable.
        logging.getLogger("agenthost.probe").info("first line: the writer takes it")
        thread = threading.Thread(target=lambda: 1 / 0, name="probe-raises")
        thread.start()
        thread.join(10)
        assert not thread.is_alive()
        _RaisesInDel()  # dropped at once: its __del__'s error goes to sys.unraisablehook
        sys.excepthook(KeyError, KeyError("on the main thread"), None)
        lines = []
        while len(lines) < 3:
            record = sink.queue.get(timeout=10)
            assert record is not None
            if record.name == "agenthost.uncaught":
                lines.append(record.getMessage())
        assert "uncaught exception in thread probe-raises" in lines[0]
        assert "ZeroDivisionError" in lines[0]
        assert "raised in __del__" in lines[1]
        assert "KeyError: 'on the main thread'" in lines[2]
    finally:
        os.set_blocking(read, False)
        with contextlib.suppress(BlockingIOError):  # the pipe read: the writer ends its line
            while os.read(read, 1 << 16):
                pass
        sink.stop(10)
        root.setLevel(level)
    assert (threading.excepthook, sys.excepthook, sys.unraisablehook) == found


def test_a_stream_without_a_descriptor_is_written_through_its_own_write() -> None:
    """A stream with no file descriptor (an in-process daemon under a capturing test runner)
    gets each line by its own `write`."""
    stream = io.StringIO()
    sink = LogQueue(stream, capacity=8)
    sink.start()
    _logger(sink).info("line %d", 7)
    assert sink.stop(timeout=10)
    assert stream.getvalue().endswith("line 7\n") and sink.dropped == 0
