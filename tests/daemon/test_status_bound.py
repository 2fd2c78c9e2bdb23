"""`host.status` answers within its bound whatever part of the daemon is stuck
(docs/reliability.md, "host.status answers"): a real daemon, each fault held while the status
is asked for with a client whose timeout is the bound — answered before it, not timed.

- the reader pool full of `session.create`s waiting on a store whose writer another process
  holds (each waits out the busy timeout, 10 s): `host.status` runs on threads of its own;
- the HostActor busy (its thread held by a message it is handling): the live Session actors
  are counted from the routes, not asked of the actor;
- a provider whose program stalls on `--version` (a real program that sleeps): the version
  is probed once, on a thread of its own, and answered null, named in `late`;
- the checkpoint store's size walk stalled: answered as last known, named in `late`, and one
  walk at a time whoever asks."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from actors.host_actor import CountActors
from agenthost.daemon import Daemon
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

WS = "status-bound"
BOUND_S = 6.0
"""The client's timeout for `host.status` while a fault holds: above the one part's wait
(`STATUS_PART_WAIT_S`, 1 s) with room for a loaded machine, below every fault's length (the
busy timeout's 10 s, the HostActor's old 10 s ask, the version probe's 10 s)."""


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _status(daemon: Daemon) -> dict[str, Any]:
    """One `host.status` on a fresh client whose call waits `BOUND_S` at most."""
    client = Client(daemon.api_endpoint, timeout=BOUND_S)
    try:
        result: dict[str, Any] = client.call("host.status")
        return result
    finally:
        client.close()


def test_status_answers_while_the_reader_pool_waits_on_a_held_store_writer(
    running: tuple[Daemon, Client],
) -> None:
    daemon, client = running
    assert daemon.store is not None
    client.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})
    holder = apsw.Connection(str(daemon.store.path))
    holder.execute("BEGIN IMMEDIATE")  # another process's writer: every write waits on it
    outcomes: list[int] = []
    creates = [
        threading.Thread(target=_create, args=(daemon, outcomes), daemon=True) for _ in range(8)
    ]
    try:
        for t in creates:
            t.start()
        # Every reader thread taken by a create waiting on the store (none answered yet).
        pool = daemon.api.plumbing._pool
        _wait_until(lambda: pool.idle == 0 and len(pool.threads) == pool.max_threads)
        assert outcomes == []
        status = _status(daemon)
        assert status["protocol"] == 1
        assert outcomes == [], "the fault held while the status was answered"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        for t in creates:
            t.join(30)


def _create(daemon: Daemon, outcomes: list[int]) -> None:
    client = Client(daemon.api_endpoint, timeout=60)
    try:
        status, _ = client.call_raw(
            "session.create", {"workspaceId": WS, "provider": "tutti-agent"}
        )
        outcomes.append(status)
    finally:
        client.close()


def test_status_answers_while_the_host_actor_is_busy(running: tuple[Daemon, Client]) -> None:
    daemon, client = running
    client.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})
    held, release = threading.Event(), threading.Event()

    def busy(_count: int) -> None:  # runs on the HostActor's thread, holding it
        held.set()
        release.wait(60)

    daemon.host.tell(CountActors(busy))
    try:
        assert held.wait(10)
        status = _status(daemon)
        assert status["sessionActors"] == len(daemon.routes)
    finally:
        release.set()


def test_a_stalled_provider_version_is_answered_late_not_waited_for(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    stall = tmp_path / "stalling-codex"
    started = tmp_path / "version-asked"
    stall.write_text(f'#!/bin/sh\necho "$@" >> {started}\nexec sleep 60\n')
    stall.chmod(stall.stat().st_mode | stat.S_IXUSR)
    (home / "agenthost.toml").write_text(f'[providers.codex]\ncommand = "{stall}"\n')
    with in_process_daemon(home, timeout=30.0) as (daemon, _client):
        first = _status(daemon)
        codex = next(p for p in first["providers"] if p["provider"] == "codex")
        assert codex["installed"] and codex["version"] is None and codex["versionPending"]
        assert "providers.codex.version" in first["late"]
        # Asked again while the probe still stalls: answered, and the program asked once.
        second = _status(daemon)
        assert "providers.codex.version" in second["late"]
        assert started.read_text().split() == ["--version"]
        others = [p for p in second["providers"] if p["provider"] != "codex"]
        assert all(not p["versionPending"] for p in others)


def test_statuses_asked_together_while_a_version_stalls_are_all_answered(
    tmp_path: Path,
) -> None:
    """20 at once on 20 clients while the version probe stalls: a part late past its wait
    is answered at once to every later ask (waited from its probe's start, not per ask), so
    none waits in line behind the status threads (20 × 1 s over 2 threads would be 10 s)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    stall = tmp_path / "stalling-codex"
    stall.write_text("#!/bin/sh\nexec sleep 60\n")
    stall.chmod(stall.stat().st_mode | stat.S_IXUSR)
    (home / "agenthost.toml").write_text(f'[providers.codex]\ncommand = "{stall}"\n')
    with in_process_daemon(home, timeout=30.0) as (daemon, _client):
        answers: list[list[str]] = []
        failures: list[BaseException] = []

        def ask() -> None:
            try:
                answers.append(_status(daemon)["late"])
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        askers = [threading.Thread(target=ask, daemon=True) for _ in range(20)]
        for t in askers:
            t.start()
        for t in askers:
            t.join(30)
        assert failures == []
        assert len(answers) == 20
        assert all("providers.codex.version" in late for late in answers)


def test_a_stalled_checkpoint_size_walk_is_answered_as_last_known(
    running: tuple[Daemon, Client],
) -> None:
    daemon, _client = running
    janitor = daemon.ctx.checkpoint_janitor
    assert janitor is not None
    # The store's real walk, held at its start by a gate (a walk of a huge or stalled
    # filesystem): the one part here that stands in for the fault.
    walk = janitor.shadow.size_bytes
    gate, walks = threading.Event(), []

    def stalled() -> int:
        walks.append(1)
        gate.wait(60)
        return walk()

    janitor._size = None
    janitor.shadow.size_bytes = stalled  # type: ignore[method-assign]
    try:
        first = _status(daemon)
        assert "checkpoints.bytes" in first["late"]
        assert first["checkpoints"]["bytes"] is None  # never measured before
        second = _status(daemon)
        assert "checkpoints.bytes" in second["late"]
        assert len(walks) == 1, "one walk at a time, whoever asks"
    finally:
        gate.set()
    _wait_until(lambda: not janitor.size_late)
    third = _status(daemon)
    assert third["late"] == [] and isinstance(third["checkpoints"]["bytes"], int)
    assert len(walks) == 1  # the measured size is kept for the cache's few seconds


def _wait_until(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    done = threading.Event()
    deadline = os.times().elapsed + timeout
    while not pred():
        if os.times().elapsed > deadline:
            raise AssertionError("condition not met")
        done.wait(0.01)
