"""What one Codex fork costs the worker, counted: forks of an unchanged source on its
live app-server read the source once, spawn no app-server (the child's readability is proven
in the worker, the child's own runtime starts only at its first use), and still unsubscribe
every child; a new turn makes the next fork read the source again. Counts, never timings."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from codex_helpers import MakeDriver, calls, fork_request, open_session, relayed, run_turns

from domain.enums import DeliveryDisposition
from tests.support.events import EventLog
from tests.support.fsyncs import counting_fsyncs

pytestmark = pytest.mark.timeout(120)


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def methods(log_path: Path) -> list[str]:
    return [c["method"] for c in calls(log_path)]


def source_lists(log_path: Path, thread_id: str) -> int:
    """The `thread/turns/list` requests of `thread_id` that started a listing (no cursor)."""
    listed = calls(log_path, "thread/turns/list")
    return sum(
        1 for c in listed if c["params"]["threadId"] == thread_id and "cursor" not in c["params"]
    )


def test_codex_forks_of_an_unchanged_source_read_it_once_and_spawn_nothing(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("none", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    spawns, before = driver.spawns, len(methods(calls_log))
    for i in range(3):
        result = driver.fork(fork_request(src, src.turns, tmp_path / f"child-{i}"))
        assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
        assert result.binding is not None
        assert result.binding.receipt["readabilityProof"] == "in_worker"
    assert wait_until(lambda: methods(calls_log)[before:].count("thread/unsubscribe") == 3)
    made = Counter(methods(calls_log)[before:])
    # Not a source read + thread/fork + thread/unsubscribe per fork, all awaited: the
    # source's Turns are listed once (a page at a time), the child's turns are listed
    # (`excludeTurns`: less Codex CPU than a hydrated fork answer) and the unsubscribe is not
    # awaited.
    assert made == {"thread/fork": 3, "thread/turns/list": 4, "thread/unsubscribe": 3}
    assert source_lists(calls_log, src.thread_id) == 1
    assert driver.spawns == spawns  # no app-server started by a fork

    # A turn since the last read: the next fork reads the source again and sees it.
    prefix = [*src.turns, *run_turns(driver, log, src.name, ("three",))]
    result = driver.fork(fork_request(src, prefix, tmp_path / "child-3"))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and list(result.child.provider_turn_ids) == prefix
    assert source_lists(calls_log, src.thread_id) == 2


def test_codex_fork_fsyncs_in_the_worker_only_the_bound_lineage(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own fsyncs for one Codex fork: the Referenced child and its source ancestor
    once each, and each directory whose entries changed once — one that both files were
    renamed into included (the names appear after both files' bytes are durable, then their
    directories are fsynced together); the proof writes nothing."""
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("one",))
    target = tmp_path / "child" / "codex-home"  # tmp_path exists
    with counting_fsyncs(monkeypatch) as fsyncs:
        result = driver.fork(fork_request(src, src.turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None
    rollouts = result.binding.receipt["rollouts"]
    assert [r["role"] for r in rollouts] == ["child", "ancestor"]
    assert fsyncs.files == 2
    assert [fsyncs.count(target / r["relativePath"]) for r in rollouts] == [1, 1]
    # Each file's directory and the parent of every directory the bind created, once.
    expected: Counter[Path] = Counter()
    existing = {tmp_path}
    for rollout in reversed(rollouts):
        path = target / rollout["relativePath"]
        missing = [d for d in path.parents if d not in existing and tmp_path in d.parents]
        existing.update(missing)
        expected.update({path.parent, *(d.parent for d in missing)} - set(expected))
    assert fsyncs.dirs == sum(expected.values())
    assert {d: fsyncs.count(d) for d in expected} == dict(expected)
