"""How many fsyncs a fork child and a new rollout cost, and which ones.

Every written file is fsynced before the fork returns, and every
directory whose entries changed is fsynced once — but a fork child is written by one `writev`
and one file fsync, not one fsync per line.
Counts, never timings: these fail if a fsync per line is made or a directory fsync goes
missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fsyncs import counting_fsyncs
from tests.tutti_agent.items import explicit_turn
from tests.tutti_agent.storeutil import write_root
from tutti_agent.fork import ForkOptions, ForkPersistence, ForkService, ThroughTurn
from tutti_agent.rollout import RolloutItem, read_rollout
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)

TURNS = 10


def _ten_turn_source(store: ThreadStore) -> str:
    items: list[RolloutItem] = []
    for i in range(TURNS):
        items += explicit_turn(f"t{i}", f"question {i}", f"answer {i}")
    return write_root(store, items)


@pytest.mark.parametrize("persistence", list(ForkPersistence))
def test_fork_child_costs_one_file_fsync_and_one_directory_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistence: ForkPersistence
) -> None:
    store = ThreadStore(tmp_path / "tutti-home")
    source = _ten_turn_source(store)
    source_bytes = store.path_of(source).read_bytes()
    with counting_fsyncs(monkeypatch) as log:
        child = (
            ForkService(store)
            .fork(
                source,
                ForkOptions(boundary=ThroughTurn(f"t{TURNS - 1}"), persistence=persistence),
            )
            .child
        )
    path = store.path_of(child.thread_id)
    # Exactly the child file once and its directory once: not one fsync per copied line.
    assert log.count(path) == 1
    assert log.count(path.parent) == 1
    assert (log.total, log.files, log.dirs) == (2, 1, 1)
    # ... and the child is complete and the source untouched.
    assert sum(1 for t in child.lines if t.item.event_type == "task_complete") == TURNS
    assert len(read_rollout(path)) == child.own_segment.length
    assert store.path_of(source).read_bytes() == source_bytes


def test_new_rollout_in_a_fresh_home_fsyncs_every_changed_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "tutti-home"
    store = ThreadStore(home)
    with counting_fsyncs(monkeypatch) as log:
        thread_id = write_root(store, [])
    path = store.path_of(thread_id)
    # Directly in sessions/ (no YYYY/MM/DD below it): created tutti-home and sessions;
    # changed: each one's parent and sessions itself.
    assert path.parent == home / "sessions"
    changed = [tmp_path, home, home / "sessions"]
    assert [log.count(d) for d in changed] == [1] * len(changed)
    assert log.count(path) == 1
    assert (log.files, log.dirs) == (1, len(changed))


def test_live_appends_stay_durable_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's lines are announced one by one: each is fsynced before it returns (the
    documented law the batch write does not relax for live appends)."""
    store = ThreadStore(tmp_path / "tutti-home")
    thread_id = write_root(store, [])
    writer = store.open_writer(store.load(thread_id))
    with counting_fsyncs(monkeypatch) as log:
        for item in explicit_turn("t0", "u", "a"):
            writer.append(item)
    writer.close()
    assert log.count(store.path_of(thread_id)) == 4 and log.total == 4


@pytest.mark.parametrize("persistence", list(ForkPersistence))
def test_fork_child_is_not_read_back_and_equals_a_cold_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistence: ForkPersistence
) -> None:
    """The fork builds the child's history from the lines it just wrote and
    fsynced (checked as a load checks them), instead of reading and parsing the file again;
    what it returns is exactly what a cold load of the home reads, and a later read of the
    unchanged file reuses that parse."""
    import tutti_agent.store as store_module

    store = ThreadStore(tmp_path / "tutti-home")
    source = _ten_turn_source(store)
    store.load(source)  # the source's parse is cached, as in a warm app-server
    reads: list[Path] = []
    real = store_module.read_rollout

    def counted(path: Path) -> list[object]:
        reads.append(path)
        return real(path)  # type: ignore[return-value]

    monkeypatch.setattr(store_module, "read_rollout", counted)
    child = (
        ForkService(store)
        .fork(source, ForkOptions(boundary=ThroughTurn(f"t{TURNS - 1}"), persistence=persistence))
        .child
    )
    assert reads == []  # neither the child nor the source read again
    assert store.load(child.thread_id) == child
    assert reads == []  # the written lines are the file's cached parse
    cold = ThreadStore(tmp_path / "tutti-home").load(child.thread_id)
    assert cold == child


def test_a_waited_fork_materializes_in_the_calling_thread(tmp_path: Path) -> None:
    """`ForkService.fork` (what `thread/fork` calls and waits for) prepares and
    materializes in the caller's thread — no thread started per fork — and still holds the
    source's reservation until materialization ends (`fork_async` keeps the detached one)."""
    import threading

    from tutti_agent.fork import PreparedFork

    store = ThreadStore(tmp_path / "tutti-home")
    source = _ten_turn_source(store)
    seen: list[tuple[threading.Thread, bool]] = []

    class Hooks:
        def before_materialize(self, prepared: PreparedFork) -> None:
            seen.append((threading.current_thread(), store.is_reserved(source)))

        def after_child_write(self, child_thread_id: str) -> None:
            seen.append((threading.current_thread(), store.is_reserved(source)))

    threads = threading.active_count()
    ForkService(store, Hooks()).fork(source, ForkOptions(boundary=ThroughTurn(f"t{TURNS - 1}")))
    assert seen == [(threading.current_thread(), True)] * 2
    assert threading.active_count() == threads
    assert not store.is_reserved(source)


@pytest.mark.parametrize("persistence", list(ForkPersistence))
def test_a_fork_child_is_written_by_descriptor_in_one_writev_without_probing_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistence: ForkPersistence
) -> None:
    """A fork child is written once and left closed: no buffered file object (its `fstat`,
    `ioctl`, `lseek` and one `write` per chunk: the app-server's system calls per warm fork
    24 → 18), its lines in one `writev`, and `sessions/` — where the source lives — not
    `stat`ed before the create. Counts, not timings."""
    import builtins
    import os

    store = ThreadStore(tmp_path / "tutti-home")
    source = _ten_turn_source(store)
    store.load(source)  # warm, as the app-server is when the worker forks
    sessions = str(store.path_of(source).parent)
    opened: list[object] = []
    writevs: list[int] = []
    writes: list[int] = []
    stats: list[str] = []
    real_open, real_writev, real_write, real_stat = builtins.open, os.writev, os.write, os.stat

    def counted_open(file: object, *args: object, **kwargs: object) -> object:
        opened.append(file)
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    def counted_writev(fd: int, buffers: list[bytes]) -> int:
        writevs.append(len(buffers))
        return real_writev(fd, buffers)

    def counted_write(fd: int, data: bytes) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    def counted_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(os.fspath(path))  # type: ignore[arg-type]
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "open", counted_open)
    monkeypatch.setattr(os, "writev", counted_writev)
    monkeypatch.setattr(os, "write", counted_write)
    monkeypatch.setattr(os, "stat", counted_stat)
    with counting_fsyncs(monkeypatch) as log:
        child = (
            ForkService(store)
            .fork(
                source,
                ForkOptions(boundary=ThroughTurn(f"t{TURNS - 1}"), persistence=persistence),
            )
            .child
        )
    monkeypatch.undo()
    path = store.path_of(child.thread_id)
    assert opened == []
    assert len(writevs) == 1 and writes == []
    assert sessions not in stats
    assert (log.count(path), log.count(path.parent), log.total) == (1, 1, 2)
    assert len(read_rollout(path)) == child.own_segment.length


def test_a_fork_child_in_a_home_without_sessions_creates_it_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's directory missing (a home whose rollouts an older build filed under
    `sessions/YYYY/MM/DD`, or none): the create makes it and fsyncs every directory whose
    entries changed once, and the file once."""
    home = tmp_path / "tutti-home"
    store = ThreadStore(home)
    meta = {"id": "01a2454c-0000-7000-8000-000000000001", "forked_from_id": None}
    with counting_fsyncs(monkeypatch) as log:
        path, lines = store.create_child_lines(
            "01a2454c-0000-7000-8000-000000000001", meta, items=explicit_turn("t0", "u", "a")
        )
    assert path.parent == home / "sessions"
    assert [log.count(d) for d in (tmp_path, home, home / "sessions")] == [1, 1, 1]
    assert (log.count(path), log.files, log.dirs) == (1, 1, 3)
    assert read_rollout(path) == lines


def test_a_warm_load_stats_its_rollout_once_and_finds_a_moved_one_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load of a thread whose path the store remembers `stat`s that file once — the check
    that it is still a regular file and the key of its cached parse are one call (a fork's
    prepare loads its source: the app-server's `stat`s per warm fork 5 → 4). A rollout moved
    since is looked up again."""
    import os

    store = ThreadStore(tmp_path / "tutti-home")
    source = _ten_turn_source(store)
    first = store.load(source)
    path = store.path_of(source)
    stats: list[str] = []
    real_stat = os.stat

    def counted_stat(name: object, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(os.fspath(name))  # type: ignore[arg-type]
        return real_stat(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counted_stat)
    assert store.load(source) is first
    assert stats == [str(path)]
    monkeypatch.undo()
    # Moved where an older build filed rollouts: the remembered path is gone, the lookup finds it.
    dated = path.parent / "2026" / "12" / "05"
    dated.mkdir(parents=True)
    path.rename(dated / path.name)
    assert store.load(source).path == dated / path.name
