"""A Copied child's long prefix goes from the source's file to the child's in the kernel
(`copy_file_range`): the app-server's thread touches a few pages for a prefix of thousands,
and the child holds the source's bytes exactly; a short prefix is still read and written in
the child's one `writev`."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from tests.tutti_agent.items import explicit_turn
from tutti_agent.fork import ForkOptions, ForkService, ThroughTurn
from tutti_agent.ids import uuid7
from tutti_agent.rollout import RolloutItem, SpanSource, read_rollout
from tutti_agent.store import SPAN_COPY_MIN_BYTES, ThreadStore

pytestmark = pytest.mark.timeout(60)

TURNS = 400
TEXT = "q" * 100_000
"""400 Turns of a 100 kB question: a 40 MB prefix, above glibc's largest dynamic mmap
threshold (32 MB), so a read of it into this process is fresh pages whatever came before."""


def _big_source(store: ThreadStore) -> str:
    thread_id = uuid7()
    items: list[RolloutItem] = []
    for i in range(TURNS):
        items += explicit_turn(f"t{i}", TEXT, f"answer {i}")
    meta = {"id": thread_id, "cwd": "/w", "model": "m", "model_provider": "tutti"}
    store.create_rollout(thread_id, meta, items=items).close()
    return thread_id


def _thread_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def test_a_long_copied_prefix_is_copied_by_the_kernel_byte_for_byte(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path / "home")
    source = _big_source(store)
    history = store.load(source)  # warm, as the app-server is when the worker forks
    start, stop = history.lines[0].end_byte_offset, history.lines[-1].end_byte_offset
    copied = store.copied_span(history, len(history.lines))
    assert copied is not None and isinstance(copied.data, SpanSource)
    assert len(copied.data) == stop - start >= SPAN_COPY_MIN_BYTES
    copied.data.close()
    before = _thread_faults()
    child = ForkService(store).fork(
        source, ForkOptions(boundary=ThroughTurn(f"t{TURNS - 1}"), keep_child_parse=False)
    )
    faults = _thread_faults() - before
    pages = (stop - start) // 4096
    assert faults < pages // 8, f"{faults} page faults for a prefix of {pages} pages"
    child_path = store.path_of(child.head.thread_id if child.head else child.child.thread_id)
    data, source_bytes = child_path.read_bytes(), store.path_of(source).read_bytes()
    first_end = data.index(b"\n") + 1
    assert data[first_end : first_end + stop - start] == source_bytes[start:stop]
    lines = read_rollout(child_path)
    assert [ln.ordinal for ln in lines] == list(range(len(history.lines) + 1))


def test_the_copied_span_holds_the_source_open_until_the_child_is_written(
    tmp_path: Path,
) -> None:
    """Each descriptor `copied_span` opens is closed once the child is written."""
    store = ThreadStore(tmp_path / "home")
    source = _big_source(store)
    store.load(source)
    fds = set(os.listdir("/proc/self/fd"))
    ForkService(store).fork(source, ForkOptions(boundary=ThroughTurn(f"t{TURNS - 1}")))
    ForkService(store).fork(source, ForkOptions(boundary=ThroughTurn("t0")))
    assert set(os.listdir("/proc/self/fd")) <= fds
