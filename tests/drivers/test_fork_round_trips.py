"""What one tutti-agent fork costs the worker, counted: app-server spawns, JSON-RPC
round trips and fsyncs. A fork of a source whose live app-server already showed its turns, with
nothing since that could change them, does not read the source again; anything that could (a
turn started, a turn in progress) makes the next fork read it. The child is forked unloaded
(`loaded: false`): no `thread/unsubscribe` follows, unless a server loaded it anyway. Counts,
never timings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import EventLog, completed, wait_until
from test_tutti_driver import fork_calls, fork_request, open_session, proxied

from domain.enums import DeliveryDisposition
from drivers.app_server.driver import AppServerDriver
from tests.support.fsyncs import counting_fsyncs

Make = Callable[..., AppServerDriver]
pytestmark = pytest.mark.timeout(90)


def methods(log_path: Path) -> list[str]:
    return log_path.read_text().splitlines() if log_path.exists() else []


def test_forks_of_an_unchanged_source_read_it_once_and_spawn_nothing(
    make_driver: Make, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("none", calls))
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path)
    before = len(methods(calls))
    for i in range(3):
        target = tmp_path / "runtimes" / f"child-{i}" / "tutti-agent-home"
        result = driver.fork(fork_request(home, thread_id, version, turns, target))
        assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    made = Counter(methods(calls)[before:])
    # Not thread/read + thread/fork + thread/unsubscribe per fork (9 round trips): the child
    # is forked unloaded (`loaded: false`), so there is nothing to unsubscribe.
    assert made == {"thread/read": 1, "thread/fork": 3}
    assert "initialize" not in made  # no app-server spawned: not for the fork, nor the proof


def test_a_turn_after_a_fork_makes_the_next_fork_read_the_source_again(
    make_driver: Make, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("none", calls))
    log = EventLog()
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a", "b"))
    first = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "c1"))
    assert first.disposition is DeliveryDisposition.ACCEPTED, first.error
    started = driver.start_turn({"agentSessionId": "src", "turnId": "T3", "text": "c"}, log)
    log.wait_for(completed("T3"))
    prefix = [*turns, started["providerTurnId"]]
    # A stale read would not show the new turn: the fork would be refused (not_started).
    second = driver.fork(fork_request(home, thread_id, version, prefix, tmp_path / "c2"))
    assert second.disposition is DeliveryDisposition.ACCEPTED, second.error
    assert second.child is not None and list(second.child.provider_turn_ids) == prefix
    assert methods(calls).count("thread/read") == 2


def test_a_turn_in_progress_after_a_verified_read_is_still_not_started(
    make_driver: Make, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("none", calls))
    log = EventLog()
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a",))
    first = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "c1"))
    assert first.disposition is DeliveryDisposition.ACCEPTED, first.error
    slow = driver.start_turn({"agentSessionId": "src", "turnId": "S", "text": "/slow 60000 z"}, log)
    log.wait_for(lambda e: e["type"] == "turn.started" and e["turnId"] == "S")
    prefix = [*turns, slow["providerTurnId"]]
    result = driver.fork(fork_request(home, thread_id, version, prefix, tmp_path / "c2"))
    assert result.disposition is DeliveryDisposition.NOT_STARTED, result.error
    assert fork_calls(calls) == 1  # only the first fork reached the provider
    assert methods(calls).count("thread/read") == 2


def test_a_fork_fsyncs_in_the_worker_only_the_bound_copy(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own fsyncs for one fork (the binder's copy; the proof and the rest write
    nothing): the copied rollout once, and each directory whose entries changed once."""
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"  # runtimes/ exists
    with counting_fsyncs(monkeypatch) as fsyncs:
        result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    [receipt] = result.binding.receipt["rollouts"] if result.binding else []
    day = target / Path(receipt["relativePath"]).parent
    # runtimes/, child/, the home gained an entry; sessions/ got the file (tutti-agent files
    # a rollout directly in sessions/: no YYYY/MM/DD to make per child home).
    assert day == target / "sessions"
    changed = [target.parent.parent, target.parent, target, day]
    assert (fsyncs.files, fsyncs.dirs) == (1, len(changed))
    assert [fsyncs.count(d) for d in changed] == [1] * len(changed)
    assert fsyncs.count(day / Path(receipt["relativePath"]).name) == 1


def test_the_childs_directories_are_durable_before_the_bind_begins(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's target directories are created and fsynced while the provider
    call runs (`DirsAhead`), so when the binder starts they exist and every created
    directory's parent is already durable; the binder then fsyncs only the file and its own
    directory — the same syncs in all, each once."""
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"  # runtimes/ exists
    seen: dict[str, Any] = {}
    real_begin = driver.binder.begin

    def begin(source_home: Path, target_home: Path, child_id: str, **kwargs: Any) -> Any:
        seen["dirs fsynced"] = fsyncs.dirs
        seen["sessions"] = sorted(p.relative_to(target) for p in target.rglob("*"))
        return real_begin(source_home, target_home, child_id, **kwargs)

    monkeypatch.setattr(driver.binder, "begin", begin)
    with counting_fsyncs(monkeypatch) as fsyncs:
        result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    [receipt] = result.binding.receipt["rollouts"] if result.binding else []
    day = Path(receipt["relativePath"]).parent
    # Before the bind: sessions/ exists, and runtimes/, child/ and the home (each a created
    # directory's parent) were fsynced.
    assert day == Path("sessions")
    assert seen["sessions"] == [day], seen
    assert seen["dirs fsynced"] == 3
    assert (fsyncs.files, fsyncs.dirs) == (1, 4)
    assert fsyncs.count(target / day) == 1  # after the rename, by the binder


def test_the_childs_directories_are_made_by_the_forking_thread_after_the_fork_is_sent(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread hand-off for them: the thread that sent `thread/fork` creates the child's
    target directories while the provider works, then waits for its answer."""
    import os
    import threading

    from drivers.app_server.process import AppServerProcess

    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    log: list[tuple[str, int]] = []
    real_mkdir, real_send = os.mkdir, AppServerProcess.request_async

    def mkdir(path: Any, mode: int = 0o777) -> None:
        if str(path).startswith(str(target.parent)):
            log.append(("mkdir", threading.get_ident()))
        real_mkdir(path, mode)

    def request_async(self: AppServerProcess, method: str, params: Any) -> Any:
        log.append((method, threading.get_ident()))
        return real_send(self, method, params)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(AppServerProcess, "request_async", request_async)
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    made = [i for i, (what, _) in enumerate(log) if what == "mkdir"]
    # child/, the home, sessions/: each made once, by this thread.
    assert len(made) == 3
    assert {log[i][1] for i in made} == {threading.get_ident()}
    assert [what for what, _ in log[: made[0]]][-1] == "thread/fork"


def test_a_child_the_server_loaded_anyway_is_still_unsubscribed(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that ignores `loaded: false` (answers a loaded child) is sent
    `thread/unsubscribe` for it, so a long-lived source server never accumulates children."""
    from drivers.app_server.process import AppServerProcess

    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("none", calls))
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path)
    real_send = AppServerProcess.request_async

    def request_async(self: AppServerProcess, method: str, params: Any) -> Any:
        if method == "thread/fork":
            params = {k: v for k, v in params.items() if k != "loaded"}  # an older server
        return real_send(self, method, params)

    monkeypatch.setattr(AppServerProcess, "request_async", request_async)
    before = len(methods(calls))
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert wait_until(lambda: "thread/unsubscribe" in methods(calls)[before:])


@pytest.mark.parametrize("server_honours", [True, False])
def test_the_source_read_and_the_fork_ask_for_the_turns_without_items(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_honours: bool
) -> None:
    """tutti-agent is asked for turns without their items (`turnItems: false`) where the
    worker reads only their ids and statuses — the source's `thread/read`, `thread/fork` —
    and a resume for no turns at all; a server that ignores the field (answers every item)
    forks the same."""
    from drivers.app_server.process import AppServerProcess

    sent: list[tuple[str, dict[str, Any]]] = []
    real_send = AppServerProcess.request_async

    def request_async(self: AppServerProcess, method: str, params: Any) -> Any:
        sent.append((method, dict(params or {})))
        if not server_honours:
            params = {
                k: v for k, v in (params or {}).items() if k not in ("turnItems", "turnColumns")
            }
        return real_send(self, method, params)

    monkeypatch.setattr(AppServerProcess, "request_async", request_async)
    home, thread_id, version, turns = open_session(make_driver(), EventLog(), tmp_path)
    # A driver of its own (a restarted worker): its runtime resumes the thread, then reads it.
    driver = make_driver()
    del sent[:]
    driver.start_session(
        {
            "agentSessionId": "src",
            "home": str(home),
            "cwd": str(tmp_path),
            "settings": {},
            "model": None,
            "providerSessionId": thread_id,
        }
    )
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and list(result.child.provider_turn_ids) == turns
    by_method = {method: params for method, params in sent}
    assert by_method["thread/resume"].get("excludeTurns") is True
    assert by_method["thread/read"].get("turnItems") is False
    assert by_method["thread/fork"].get("turnItems") is False
    assert by_method["thread/read"].get("turnColumns") is True
    assert by_method["thread/fork"].get("turnColumns") is True


def _answers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The (method, future) of every request the worker sends, its answer read later."""
    from drivers.app_server.process import AppServerProcess

    seen: list[tuple[str, Any]] = []
    real_send = AppServerProcess.request_async

    def request_async(self: AppServerProcess, method: str, params: Any) -> Any:
        future = real_send(self, method, params)
        seen.append((method, future))
        return future

    monkeypatch.setattr(AppServerProcess, "request_async", request_async)
    return seen


def test_the_source_read_and_the_fork_are_answered_turn_columns_not_turn_objects(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tutti-agent answers the fork's source read and `thread/fork` with the turns' ids and
    statuses as two columns (`turnColumns`), no turn object on the wire: what the worker
    decodes of a 10,000-Turn source is 20,000 strings, not 10,000 objects of nine fields."""
    seen = _answers(monkeypatch)
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a", "b"))
    del seen[:]
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and list(result.child.provider_turn_ids) == turns
    answered = {method: future.result(timeout=5) for method, future in seen}
    for method in ("thread/read", "thread/fork"):
        thread = answered[method]["thread"]
        assert thread["turns"] == [], method
        assert thread["turnIds"] == turns, method
        assert thread["turnStatuses"] == ["completed", "completed"], method


def test_turn_columns_of_different_lengths_leave_the_source_unread(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source read whose columns disagree in length is malformed: the fork is not started
    (nothing forked), never judged on the ids alone."""
    from drivers.app_server import fork as fork_module

    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    real = fork_module.thread_of

    def short_statuses(result: Any) -> Any:
        thread = dict(real(result))
        if "turnStatuses" in thread:
            thread["turnStatuses"] = thread["turnStatuses"][:-1]
        return thread

    monkeypatch.setattr(fork_module, "thread_of", short_statuses)
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert "turnStatuses" in (result.error or "")


def test_a_fork_lstats_each_component_of_the_target_homes_chain_once(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The symlink check of the target home's chain is made once per fork: `DirsAhead`'s walk
    while the provider forks (the ancestors it found no link, the directories it made), which
    the bind's check of the homes takes instead of `lstat`ing them again; the path about to
    be written is still `lstat`ed right before the write, and the source home's own
    components at the bind."""
    import os

    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    lstats: list[str] = []
    real_lstat = os.lstat

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        lstats.append(os.fspath(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    chain = [*(str(a) for a in reversed(target.parents[:-1])), str(target)]
    for component in chain:
        # Once each, by the walk, down to `child`, which it found missing and made, and the
        # home below it: made by the walk, never `lstat`ed.
        assert lstats.count(component) == (0 if component == str(target) else 1), component
    # Below the home: the lookup's root and, right before the write, its directory.
    assert lstats.count(str(target / "sessions")) == 2
    # The source home's own components (not shared with the target's chain): at the bind.
    assert lstats.count(str(Path(home))) == 1


def _naming_its_runtime(driver: AppServerDriver, request: Any, sid: str = "src") -> Any:
    """`request` with the `runtimeGeneration` the worker stamps (`<incarnation>:<generation>`)
    of the Session's live runtime, as a fork the worker's generation check let through."""
    from dataclasses import replace

    generation = driver.runtime_generation(sid, request.source.home)
    assert generation is not None
    return replace(request, extra={**request.extra, "runtimeGeneration": f"w1:{generation}"})


def test_a_fork_naming_its_live_runtime_does_not_ask_its_liveness_again(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker let the fork through after finding the named runtime live (its generation
    check, on the same thread); the fork takes that runtime without a second `waitid` and
    `/proc` read. A fork naming no generation still asks."""
    from drivers.app_server import process

    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    asked: list[int] = []
    real = process.child_running

    def child_running(proc: Any) -> bool:
        asked.append(proc.pid)
        return real(proc)

    monkeypatch.setattr(process, "child_running", child_running)
    target = tmp_path / "runtimes" / "child-0" / "tutti-agent-home"
    named = _naming_its_runtime(driver, fork_request(home, thread_id, version, turns, target))
    asked.clear()  # the generation read above asked once, as the worker's check does
    result = driver.fork(named)
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert asked == []
    target = tmp_path / "runtimes" / "child-1" / "tutti-agent-home"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert len(asked) == 1
    assert driver.spawns == 1  # the Session's own: no transient runtime for either fork


def test_a_fork_naming_a_runtime_that_died_since_is_not_run_on_a_transient_one(
    make_driver: Make, tmp_path: Path
) -> None:
    """A runtime that dies after the worker's check: the fork bound to its attestation is
    not forked on a transient app-server spawned for it; it fails its own call, before
    anything is written (`not_started`)."""
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    named = _naming_its_runtime(driver, fork_request(home, thread_id, version, turns, target))
    runtime = driver._sessions.get("src").runtime  # type: ignore[union-attr]
    assert runtime is not None
    runtime.proc._proc.kill()  # type: ignore[union-attr]
    runtime.proc._proc.wait()  # type: ignore[union-attr]
    spawns = driver.spawns
    result = driver.fork(named)
    assert result.disposition is not DeliveryDisposition.ACCEPTED
    assert driver.spawns == spawns
    assert not target.exists() or not list(target.rglob("rollout-*"))
