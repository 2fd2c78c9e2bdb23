"""`agenthost serve`'s log queue on a real pipe: a line logged while the pipe is full is queued,
not waited on; a clean stop writes what is queued once the pipe is read again, and a stop on
a pipe nobody reads returns within its bound."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

import pytest

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
