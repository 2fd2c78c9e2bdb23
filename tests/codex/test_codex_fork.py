"""The Codex driver's through-turn fork against the real `codex app-server` 0.171.0 (seed 000 §7,
§7.1, §10): the exact request, every delivery disposition, the Referenced lineage copied into
the child's own home, the child's model input, fork of a fork, and self-repair at resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from codex_helpers import (
    CodexSession,
    EventLog,
    MakeDriver,
    calls,
    conversation,
    fork_request,
    home_of,
    open_session,
    relayed,
    run_turns,
    start,
)

from domain.enums import DeliveryDisposition
from drivers.app_server.driver import AppServerDriver
from drivers.binder import BinderError, iter_rollouts
from drivers.codex.lineage import CONTEXT_KEY, rollout_lineage
from model_fakes.responses import ResponsesServer

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]

SENT = {"one", "two", "three", "four", "five", "six"}


def test_fork_request_carries_only_thread_id_last_turn_id_and_exclude_turns(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """Nothing but the boundary (`lastTurnId`, seed 000 §7) and the answer's
    shape: `excludeTurns` (the child's turns are listed with `thread/turns/list`, a third less
    Codex CPU than the deprecated full hydration)."""
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("none", calls_log))
    src = open_session(driver, log, tmp_path)
    result = driver.fork(fork_request(src, src.turns[:2], home_of(tmp_path, "child")))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    [fork_call] = calls(calls_log, "thread/fork")
    assert fork_call["params"] == {
        "threadId": src.thread_id,
        "lastTurnId": src.turns[1],
        "excludeTurns": True,
    }
    assert result.child is not None
    # The source's Turns were listed (the frozen prefix proven) before the one mutation, and
    # the child's after it.
    listed = [(c["method"], c["params"].get("threadId")) for c in calls(calls_log)]
    at = listed.index(("thread/fork", src.thread_id))
    assert ("thread/turns/list", src.thread_id) in listed[:at]
    assert listed[at + 1 :].count(("thread/turns/list", result.child.provider_session_id)) == 1


def test_the_childs_turns_are_listed_while_its_bytes_are_bound_and_checked_before_its_names(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """The child's `thread/turns/list` is answered only once the bind's temp files are in the
    target home (the relay holds it): the bind wrote the child's bytes while the server
    listed, and named nothing before the listing was checked."""
    calls_log = tmp_path / "calls.jsonl"
    target = home_of(tmp_path, "child")
    driver = make_driver(command=relayed(f"hold_child_list:{target}", calls_log))
    src = open_session(driver, log, tmp_path)
    result = driver.fork(fork_request(src, src.turns[:2], target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and result.child.provider_turn_ids == tuple(src.turns[:2])
    [held] = calls(calls_log, "relay/held")
    assert held["params"] == {"staged": True, "named": False}


def test_committed_child_runs_from_its_own_home_with_the_source_home_deleted(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, model: ResponsesServer
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path)
    target = home_of(tmp_path, "child")
    result = driver.fork(fork_request(src, src.turns[:2], target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and result.binding is not None
    child_id = result.child.provider_session_id
    assert result.child.forked_from_id == src.thread_id != child_id
    assert result.child.provider_turn_ids == tuple(src.turns[:2])
    receipt = result.binding.receipt
    assert receipt["verifiedReadable"] is True
    # Codex 0.171 children are Referenced: the source rollout came along as an ancestor.
    assert [(r["threadId"], r["role"]) for r in receipt["rollouts"]] == [
        (child_id, "child"),
        (src.thread_id, "ancestor"),
    ]
    assert rollout_lineage(target, child_id) == [child_id, src.thread_id]

    driver.stop_session({"agentSessionId": src.name})
    shutil.rmtree(src.home)
    # The child inherits the source's runtime context (as the store clones it at commit).
    started = start(driver, tmp_path, "child", thread_id=child_id, context=src.context)
    assert started["providerSessionId"] == child_id
    before = len(model.requests)
    run_turns(driver, log, "child", ("four",))
    assert conversation(model.requests[before], SENT) == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
        ("user", "four"),
    ]


def test_unavailable_boundary_is_not_started_without_any_fork_call(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("none", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    before = list(iter_rollouts(src.home))
    for prefix in (
        [src.turns[0], "01a228cc-ffff-7000-8000-000000000000"],  # a turn the source lacks
        [src.turns[1], src.turns[0]],  # reordered
        [src.turns[1]],  # a gap: the first turn is missing
    ):
        result = driver.fork(fork_request(src, prefix, tmp_path / "t"))
        assert result.disposition is DeliveryDisposition.NOT_STARTED, prefix
    assert calls(calls_log, "thread/fork") == []
    assert list(iter_rollouts(src.home)) == before


def test_frozen_driver_version_differing_from_the_runtime_is_not_started(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("none", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one",))
    result = driver.fork(fork_request(src, src.turns, tmp_path / "t", version="0.170.0"))
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert calls(calls_log, "thread/fork") == []


def test_json_rpc_error_from_thread_fork_is_rejected(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("bogus_last_turn", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one",))
    result = driver.fork(fork_request(src, src.turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.REJECTED, result.error
    assert "turn not found" in (result.error or "")
    assert result.child is None
    assert len(calls(calls_log, "thread/fork")) == 1


@pytest.mark.parametrize(
    "mode",
    [
        "drop_first_turn",
        "extra_turn",
        "reorder",
        "child_is_source",
        "wrong_parent",
        "no_lineage",
        "empty_id",
    ],
)
def test_unverified_fork_answer_is_unknown_and_nothing_is_bound(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, mode: str
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed(mode, calls_log))
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    target = tmp_path / "t"
    result = driver.fork(fork_request(src, src.turns, target))
    assert result.disposition is DeliveryDisposition.UNKNOWN, (mode, result)
    assert result.binding is None
    assert len(calls(calls_log, "thread/fork")) == 1
    assert list(iter_rollouts(target)) == []
    assert [p for p in target.rglob("*") if not p.is_dir()] == []  # no temp file left either
    if mode in ("drop_first_turn", "extra_turn", "reorder"):
        # Refused for the listed turns (the relay tampered with them), not a lost relay.
        assert result.error is not None and "not exactly the frozen prefix" in result.error


def test_provider_lost_after_thread_fork_was_sent_is_unknown(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("die_on_fork", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one",))
    result = driver.fork(fork_request(src, src.turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert len(calls(calls_log, "thread/fork")) == 1


def test_thread_fork_timeout_is_unknown(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("hang_on_fork", calls_log), fork_timeout_s=1.0)
    src = open_session(driver, log, tmp_path, texts=("one",))
    result = driver.fork(fork_request(src, src.turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert len(calls(calls_log, "thread/fork")) == 1


def test_binder_failure_after_thread_fork_is_unknown_with_nothing_in_the_target(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver({"worker.bind.before_copy": "error"})
    src = open_session(driver, log, tmp_path, texts=("one",))
    target = tmp_path / "t"
    result = driver.fork(fork_request(src, src.turns, target))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert result.child is not None and result.child.provider_turn_ids == tuple(src.turns)
    assert list(iter_rollouts(target)) == []


def test_fork_of_a_fork_binds_the_whole_lineage_and_sees_its_turns(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, model: ResponsesServer
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path)
    first = driver.fork(fork_request(src, src.turns[:2], home_of(tmp_path, "child")))
    assert first.disposition is DeliveryDisposition.ACCEPTED, first.error
    assert first.child is not None
    child_id = first.child.provider_session_id
    started = start(driver, tmp_path, "child", thread_id=child_id, context=src.context)
    [four] = run_turns(driver, log, "child", ("four",))
    child = CodexSession(
        "child",
        home_of(tmp_path, "child"),
        child_id,
        src.version,
        [*src.turns[:2], four],
        dict(started["runtimeContext"]),
    )
    grand_home = home_of(tmp_path, "grandchild")
    second = driver.fork(fork_request(child, child.turns, grand_home))
    assert second.disposition is DeliveryDisposition.ACCEPTED, second.error
    assert second.child is not None
    grand_id = second.child.provider_session_id
    assert second.child.forked_from_id == child_id
    assert rollout_lineage(grand_home, grand_id) == [grand_id, child_id, src.thread_id]

    for name in ("src", "child"):
        driver.stop_session({"agentSessionId": name})
    shutil.rmtree(src.home)
    shutil.rmtree(child.home)
    start(driver, tmp_path, "grandchild", thread_id=grand_id, context=child.context)
    before = len(model.requests)
    run_turns(driver, log, "grandchild", ("five",))
    assert [t for r, t in conversation(model.requests[before], SENT) if r == "user"] == [
        "one",
        "two",
        "four",
        "five",
    ]


def _committed_child(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> tuple[AppServerDriver, CodexSession, str, Path]:
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    target = home_of(tmp_path, "child")
    result = driver.fork(fork_request(src, src.turns[:1], target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None
    return driver, src, result.child.provider_session_id, target


@pytest.mark.parametrize("damage", ["deleted", "truncated", "torn_tail"])
def test_resume_rebinds_a_damaged_child_from_its_source(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, damage: str
) -> None:
    driver, src, child_id, target = _committed_child(make_driver, log, tmp_path)
    [child_rollout] = [p for p in iter_rollouts(target) if child_id in p.name]
    good = child_rollout.read_bytes()
    if damage == "deleted":
        shutil.rmtree(target / "sessions")
    elif damage == "truncated":
        child_rollout.write_bytes(good[: good.index(b"\n") + 1])
    else:
        child_rollout.write_bytes(good[: len(good) - 7])
    started = start(driver, tmp_path, "child", thread_id=child_id, context=src.context)
    [repaired] = [p for p in iter_rollouts(target) if child_id in p.name]
    assert repaired.read_bytes() == good
    assert started["runtimeContext"][CONTEXT_KEY]["forkSource"] == {
        "home": str(src.home),
        "threadId": src.thread_id,
    }
    run_turns(driver, log, "child", ("four",))


def test_resume_keeps_the_childs_own_history_and_refuses_a_diverged_child(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver, src, child_id, target = _committed_child(make_driver, log, tmp_path)
    started = start(driver, tmp_path, "child", thread_id=child_id, context=src.context)
    # From now on the child's own context (naming itself and its fork source) is canonical.
    context = dict(started["runtimeContext"])
    run_turns(driver, log, "child", ("four",))
    driver.stop_session({"agentSessionId": "child"})
    [child_rollout] = [p for p in iter_rollouts(target) if child_id in p.name]
    grown = child_rollout.read_bytes()
    # The child's own turns are post-fork appends: a later resume keeps them.
    start(driver, tmp_path, "child", thread_id=child_id, context=context)
    assert child_rollout.read_bytes() == grown
    driver.stop_session({"agentSessionId": "child"})
    # A child whose bytes are no longer the source's plus appends is never overwritten.
    diverged = grown.replace(b'"timestamp":"2', b'"timestamp":"1', 1)
    assert diverged != grown
    child_rollout.write_bytes(diverged)
    with pytest.raises(BinderError):
        start(driver, tmp_path, "child", thread_id=child_id, context=context)
    assert child_rollout.read_bytes() == diverged
