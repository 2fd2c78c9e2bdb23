"""The tutti-agent driver against the real `tutti-agent app-server` subprocess: sessions, turns and
their events, interactions, interrupts, app-server death, idle stop, attestation, and the fork
with every delivery disposition (seed 000 §7.1) and the host_copy binder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import PROXY, TUTTI_BIN, EventLog, completed, wait_until

from domain.enums import DeliveryDisposition
from domain.errors import HostError, SessionBusy
from domain.worker_messages import ForkRequest, ForkResult
from drivers.app_server.driver import AppServerDriver
from drivers.app_server.process import AppServerProcess, private_env
from drivers.app_server.state import SETTLED_TURN_IDS_KEPT
from drivers.binder import RolloutBinder, iter_rollouts
from tests.support.left_processes import ended, left_behind, marker_of, reap

Make = Callable[..., AppServerDriver]


@pytest.fixture
def log() -> EventLog:
    return EventLog()


def open_session(
    driver: AppServerDriver,
    log: EventLog,
    root: Path,
    name: str = "src",
    texts: tuple[str, ...] = ("one", "two", "three"),
) -> tuple[Path, str, str, list[str]]:
    home = root / "runtimes" / name / "tutti-agent-home"
    started = driver.start_session(
        {"agentSessionId": name, "home": str(home), "cwd": str(root), "settings": {}, "model": None}
    )
    provider_turns = []
    for i, text in enumerate(texts, 1):
        turn_id = f"{name}-T{i}"
        result = driver.start_turn({"agentSessionId": name, "turnId": turn_id, "text": text}, log)
        log.wait_for(completed(turn_id))
        provider_turns.append(result["providerTurnId"])
    version = started["runtimeContext"]["driverVersion"]
    return home, started["providerSessionId"], version, provider_turns


def resume_request(home: Path, cwd: Path, thread_id: str) -> dict[str, Any]:
    """`session.start` of Session `src` again on its home, resuming its thread."""
    return {
        "agentSessionId": "src",
        "home": str(home),
        "cwd": str(cwd),
        "settings": {},
        "model": None,
        "providerSessionId": thread_id,
    }


def fork_request(
    source_home: Path,
    thread_id: str,
    version: str,
    prefix: list[str],
    target_home: Path,
    source_sid: str = "src",
) -> ForkRequest:
    return ForkRequest.from_wire(
        {
            "source": {
                "agentSessionId": source_sid,
                "providerSessionId": thread_id,
                "home": str(source_home),
                "cwd": str(source_home.parent),
            },
            "target": {"agentSessionId": "child", "home": str(target_home)},
            "providerTurnIds": prefix,
            "title": "src (2)",
            "driverKind": "tutti-agent",
            "driverVersion": version,
        }
    )


def proxied(mode: str, log_path: Path) -> list[str]:
    return [sys.executable, PROXY, mode, str(log_path), "--", TUTTI_BIN]


def fork_calls(log_path: Path) -> int:
    if not log_path.exists():
        return 0
    return log_path.read_text().splitlines().count("thread/fork")


# ------------------------------------------------------------------------- sessions & turns


@pytest.mark.timeout(60)
def test_turn_streams_started_binding_items_and_completed(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    _, thread_id, _, [provider_turn] = open_session(driver, log, tmp_path, texts=("hello",))
    events = log.of_turn("src-T1")
    # The binding rides on `turn.started` (one event, one actor message): no `turn.binding`.
    assert events[0]["type"] == "turn.started"
    assert "turn.binding" not in {e["type"] for e in events}
    assert events[0]["providerTurnId"] == provider_turn
    assert json.loads(events[0]["bindingJson"]) == {
        "schemaVersion": 1,
        "threadId": thread_id,
        "providerTurnId": provider_turn,
    }
    items = [e["item"] for e in events if e["type"] == "item"]
    # The provider's copy of the user's message is not sent: the daemon's claim wrote it.
    assert [(i["kind"], i["text"]) for i in items] == [("assistant", "echo: hello")]
    assert events[-1] == {
        "type": "turn.completed",
        "turnId": "src-T1",
        "providerTurnId": provider_turn,
        "outcome": "completed",
    }


@pytest.mark.timeout(60)
def test_tool_directive_maps_to_reasoning_tool_call_and_tool_result(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=("/tool grep needle",))
    kinds = [e["item"]["kind"] for e in log.of_turn("src-T1") if e["type"] == "item"]
    assert kinds == ["reasoning", "tool_call", "tool_result", "assistant"]


@pytest.mark.timeout(60)
def test_failing_turn_completes_with_failed_outcome_and_error(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=("/fail boom",))
    done = log.wait_for(completed("src-T1"))
    assert done["outcome"] == "failed" and "boom" in done["error"]


@pytest.mark.timeout(60)
def test_question_round_trip_answers_with_the_given_text(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=())
    driver.start_turn({"agentSessionId": "src", "turnId": "Q", "text": "/ask colour?"}, log)
    asked = log.wait_for(lambda e: e["type"] == "interaction.requested")
    assert asked["kind"] == "question" and asked["turnId"] == "Q"
    assert asked["input"]["text"] == "colour?"
    driver.respond_interaction(
        {"agentSessionId": "src", "requestId": asked["requestId"], "response": {"text": "blue"}}
    )
    log.wait_for(completed("Q"))
    replies = [
        e["item"]["text"]
        for e in log.of_turn("Q")
        if e["type"] == "item" and e["item"]["kind"] == "assistant"
    ]
    assert replies == ["blue"]
    with pytest.raises(HostError):  # answered once; a second answer is a conflict
        driver.respond_interaction(
            {"agentSessionId": "src", "requestId": asked["requestId"], "response": {"text": "x"}}
        )


@pytest.mark.timeout(60)
def test_declined_approval_round_trip(make_driver: Make, log: EventLog, tmp_path: Path) -> None:
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=())
    driver.start_turn({"agentSessionId": "src", "turnId": "A", "text": "/approve rm -rf x"}, log)
    asked = log.wait_for(lambda e: e["type"] == "interaction.requested")
    assert asked["kind"] == "approval"
    driver.respond_interaction(
        {
            "agentSessionId": "src",
            "requestId": asked["requestId"],
            "response": {"decision": "decline"},
        }
    )
    log.wait_for(completed("A"))
    texts = [e["item"]["text"] for e in log.of_turn("A") if e["type"] == "item"]
    assert "declined: rm -rf x" in texts


@pytest.mark.timeout(60)
def test_two_answers_at_once_reach_the_provider_once(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    """Two answers to one pending approval, sent at once: one is taken (it reaches the
    provider), the other is refused `interaction_not_pending` before it is sent — never
    both accepted, the provider taking one while the host records the other."""
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=())
    driver.start_turn({"agentSessionId": "src", "turnId": "R", "text": "/approve ls"}, log)
    asked = log.wait_for(lambda e: e["type"] == "interaction.requested")
    proc = driver._session({"agentSessionId": "src"}).runtime.proc
    sent: list[object] = []
    both_in = threading.Barrier(2, timeout=2)
    real_respond = proc.respond

    def respond(request_id: object, result: dict[str, object]) -> None:
        sent.append(result)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_in.wait()  # the first waits for a second answer to reach the provider too
        real_respond(request_id, result)

    proc.respond = respond  # type: ignore[method-assign]
    answers: list[str] = []

    def answer(decision: str) -> None:
        try:
            driver.respond_interaction(
                {
                    "agentSessionId": "src",
                    "requestId": asked["requestId"],
                    "response": {"decision": decision},
                }
            )
            answers.append(f"taken {decision}")
        except HostError as exc:
            answers.append(f"refused {exc.reason}")

    threads = [threading.Thread(target=answer, args=(d,)) for d in ("approve", "decline")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(sent) == 1, sent
    assert sorted(a.split()[0] for a in answers) == ["refused", "taken"], answers
    assert "refused interaction_not_pending" in answers
    log.wait_for(completed("R"))


@pytest.mark.timeout(60)
def test_second_turn_while_one_is_active_is_busy_and_interrupt_ends_it(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=())
    started = driver.start_turn(
        {"agentSessionId": "src", "turnId": "S", "text": "/slow 60000 later"}, log
    )
    with pytest.raises(SessionBusy):
        driver.start_turn({"agentSessionId": "src", "turnId": "S2", "text": "hi"}, log)
    driver.interrupt_turn({"agentSessionId": "src", "providerTurnId": started["providerTurnId"]})
    assert log.wait_for(completed("S"))["outcome"] == "interrupted"


@pytest.mark.timeout(60)
def test_app_server_death_fails_the_active_turn_and_the_next_turn_respawns(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=())
    driver.start_turn({"agentSessionId": "src", "turnId": "S", "text": "/slow 60000 x"}, log)
    log.wait_for(lambda e: e["type"] == "turn.started")
    pid = driver._sessions["src"].runtime.proc.pid  # type: ignore[union-attr]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    done = log.wait_for(completed("S"))
    assert done["outcome"] == "failed" and "exited" in done["error"]
    driver.start_turn({"agentSessionId": "src", "turnId": "N", "text": "again"}, log)
    assert log.wait_for(completed("N"))["outcome"] == "completed"


@pytest.mark.timeout(60)
def test_session_resume_reopens_the_same_thread_with_its_history(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    home, thread_id, _, turns = open_session(driver, log, tmp_path, texts=("a", "b"))
    driver.stop_session({"agentSessionId": "src"})
    fresh = make_driver()
    resumed = fresh.start_session(resume_request(home, tmp_path, thread_id))
    assert resumed["providerSessionId"] == thread_id
    fresh.start_turn({"agentSessionId": "src", "turnId": "C", "text": "c"}, log)
    assert log.wait_for(completed("C"))["outcome"] == "completed"


@pytest.mark.timeout(60)
def test_idle_app_server_is_stopped_and_respawned_on_the_next_turn(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver(idle_timeout_s=0.3)
    open_session(driver, log, tmp_path, texts=("a",))
    proc = driver._sessions["src"].runtime.proc  # type: ignore[union-attr]
    assert proc.pid is not None
    left = [left_behind(proc.pid)]  # a tool's process the idle stop ends with its runtime
    try:
        assert wait_until(lambda: not proc.alive)
        assert wait_until(lambda: ended(left[0].pid))
    finally:
        reap(left)
    driver.start_turn({"agentSessionId": "src", "turnId": "B", "text": "b"}, log)
    assert log.wait_for(completed("B"))["outcome"] == "completed"


@pytest.mark.timeout(60)
def test_a_stop_ends_what_its_runtime_left_before_it_is_answered_and_not_the_next_runtime(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    home, thread_id, _, _ = open_session(driver, log, tmp_path, texts=("a",))
    first = driver.runtime_pid("src", str(home))
    assert first is not None
    left, stopped = [left_behind(first)], marker_of(first)
    try:
        driver.stop_session({"agentSessionId": "src"})
        assert ended(left[0].pid), "the stopped runtime's tool process outlived the stop"
        # The next runtime on the same home, started right after the answer: its own marker,
        # and nothing of the stop reaches it or what it starts.
        driver.start_session(resume_request(home, tmp_path, thread_id))
        driver.start_turn({"agentSessionId": "src", "turnId": "B", "text": "b"}, log)
        assert log.wait_for(completed("B"))["outcome"] == "completed"
        second = driver.runtime_pid("src", str(home))
        assert second is not None and marker_of(second) != stopped
        left.append(left_behind(second))
        assert not ended(second) and not ended(left[1].pid)
        driver.close()  # the worker's shutdown is a stop too
        assert ended(left[1].pid)
    finally:
        reap(left)


@pytest.mark.timeout(60)
def test_attestation_reports_kind_version_gate_and_binding(
    make_driver: Make, tmp_path: Path
) -> None:
    att = make_driver().attest({"home": str(tmp_path / "h"), "cwd": str(tmp_path)})
    assert att["driverKind"] == "tutti-agent"
    assert att["userAgent"].startswith(f"tutti_agent/{att['driverVersion']} ")
    assert att["bindingMode"] == "host_copy" and att["binderAvailable"] is True
    assert att["forkThroughTurn"] is True


# ------------------------------------------------------------------------- fork


@pytest.mark.timeout(60)
def test_fork_through_turn_is_accepted_bound_and_readable_from_the_child_home(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, log, tmp_path)
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    result = driver.fork(fork_request(home, thread_id, version, turns[:2], target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and result.binding is not None
    assert result.child.provider_turn_ids == tuple(turns[:2])
    assert result.child.forked_from_id == thread_id != result.child.provider_session_id
    receipt = result.binding.receipt
    assert receipt["verifiedReadable"] is True
    [copied] = list(iter_rollouts(target))
    assert copied.name.endswith(f"-{result.child.provider_session_id}.jsonl")
    assert receipt["rollouts"][0]["targetSize"] == copied.stat().st_size
    # The child continues from its own home, with only the source's first two turns.
    child_log = EventLog()
    driver.start_session(
        {
            "agentSessionId": "child",
            "home": str(target),
            "cwd": str(tmp_path),
            "settings": {},
            "model": None,
            "providerSessionId": result.child.provider_session_id,
        }
    )
    driver.start_turn({"agentSessionId": "child", "turnId": "C1", "text": "next"}, child_log)
    assert child_log.wait_for(completed("C1"))["outcome"] == "completed"


@pytest.mark.timeout(60)
def test_fork_of_a_cold_source_spawns_its_own_runtime(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a", "b"))
    driver.stop_session({"agentSessionId": "src"})
    target = tmp_path / "t"
    result = make_driver().fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda t: [*t[:1], "01a228cc-ffff-7000-8000-000000000000"], id="unknown-turn"),
        pytest.param(lambda t: [t[1], t[0]], id="reordered-prefix"),
        pytest.param(lambda t: [t[1]], id="gap-in-prefix"),
    ],
)
def test_source_not_showing_the_frozen_prefix_is_not_started_without_any_fork_call(
    make_driver: Make, log: EventLog, tmp_path: Path, mangle: Callable[[list[str]], list[str]]
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("none", calls))
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a", "b"))
    before = list(iter_rollouts(home))
    result = driver.fork(fork_request(home, thread_id, version, mangle(turns), tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert fork_calls(calls) == 0
    assert list(iter_rollouts(home)) == before


@pytest.mark.timeout(60)
def test_in_progress_boundary_turn_is_not_started(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("none", calls))
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a",))
    slow = driver.start_turn({"agentSessionId": "src", "turnId": "S", "text": "/slow 60000 z"}, log)
    log.wait_for(lambda e: e["type"] == "turn.started" and e["turnId"] == "S")
    prefix = [*turns, slow["providerTurnId"]]
    result = driver.fork(fork_request(home, thread_id, version, prefix, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert fork_calls(calls) == 0


@pytest.mark.timeout(60)
def test_driver_version_differing_from_the_frozen_one_is_not_started(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("none", calls))
    home, thread_id, _, turns = open_session(driver, log, tmp_path, texts=("a",))
    result = driver.fork(fork_request(home, thread_id, "0.0.9", turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert fork_calls(calls) == 0


@pytest.mark.timeout(60)
def test_failpoint_error_before_the_provider_call_is_not_started(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(
        {"worker.fork.before_provider_call": "error"}, command=proxied("none", calls)
    )
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a",))
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert fork_calls(calls) == 0


@pytest.mark.timeout(60)
def test_json_rpc_error_from_thread_fork_is_rejected(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver(env={"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=error"})
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a",))
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.REJECTED
    assert result.child is None


@pytest.mark.timeout(60)
def test_app_server_dying_after_thread_fork_was_sent_is_unknown(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver(env={"TUTTI_AGENT_FAILPOINTS": "fork.after_child_write=exit"})
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a", "b"))
    target = tmp_path / "t"
    result = driver.fork(fork_request(home, thread_id, version, turns[:1], target))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert len(list(iter_rollouts(home))) == 2  # the source and exactly one provider child
    assert list(iter_rollouts(target)) == []


@pytest.mark.timeout(60)
def test_relay_dying_with_the_fork_request_in_flight_is_unknown(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied("die_on_fork", calls))
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a",))
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert fork_calls(calls) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "mode",
    ["drop_first_turn", "extra_turn", "reorder", "child_is_source", "wrong_parent", "empty_id"],
)
def test_unverifiable_fork_answer_is_unknown_and_nothing_is_bound(
    make_driver: Make, log: EventLog, tmp_path: Path, mode: str
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=proxied(mode, calls))
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a", "b"))
    target = tmp_path / "t"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.UNKNOWN, mode
    assert result.binding is None
    assert fork_calls(calls) == 1
    assert list(iter_rollouts(target)) == []


@pytest.mark.timeout(60)
def test_binder_failure_after_the_provider_call_is_unknown(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver({"worker.bind.before_copy": "error"})
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a",))
    target = tmp_path / "t"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert result.child is not None and result.child.provider_turn_ids == tuple(turns)
    assert list(iter_rollouts(target)) == []


@pytest.mark.timeout(60)
def test_failpoint_error_after_the_provider_call_is_unknown(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver({"worker.fork.after_provider_call": "error"})
    home, thread_id, version, turns = open_session(driver, log, tmp_path, texts=("a",))
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.UNKNOWN


def test_accepted_result_cannot_exist_without_child_and_binding() -> None:
    with pytest.raises(ValueError):
        ForkResult(DeliveryDisposition.ACCEPTED)


@pytest.mark.timeout(60)
def test_referenced_child_is_readable_from_the_target_home_only_with_its_lineage(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    """Codex-0.171-like Referenced children need their ancestors: the binder copies them."""
    driver = make_driver()
    home, thread_id, _, turns = open_session(driver, log, tmp_path, texts=("a", "b"))
    driver.stop_session({"agentSessionId": "src"})
    server = AppServerProcess(
        [TUTTI_BIN, "app-server"], env=private_env(None, "TUTTI_AGENT_HOME", home)
    )
    server.start()
    try:
        server.initialize("t", "0")
        forked = server.request(
            "thread/fork",
            {"threadId": thread_id, "lastTurnId": turns[0], "persistence": "referenced"},
        )
    finally:
        server.close()
    child_id = forked["thread"]["id"]
    target = tmp_path / "target"
    receipt = RolloutBinder().bind(home, target, child_id)
    assert [r.role for r in receipt.rollouts] == ["child", "ancestor"]

    def read_child() -> list[str]:
        reader = AppServerProcess(
            [TUTTI_BIN, "app-server"], env=private_env(None, "TUTTI_AGENT_HOME", target)
        )
        reader.start()
        try:
            reader.initialize("t", "0")
            result = reader.request("thread/read", {"threadId": child_id, "includeTurns": True})
            return [t["id"] for t in result["thread"]["turns"]]
        finally:
            reader.close()

    assert read_child() == turns[:1]
    # Without the ancestor the child cannot be read: the lineage copy is what makes it work.
    [ancestor] = [p for p in iter_rollouts(target) if thread_id in p.name]
    ancestor.unlink()
    with pytest.raises(Exception):  # noqa: B017 - any provider failure proves the dependency
        read_child()


def test_a_sessions_provider_turn_ids_are_bounded_by_the_newest_settled(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    """The worker's map of provider turn ids to canonical Turns keeps the newest settled ones
    only: it grew by one entry per Turn for the life of the worker."""
    driver = make_driver()
    texts = tuple(f"t{i}" for i in range(SETTLED_TURN_IDS_KEPT + 2))
    _, _, _, provider_turns = open_session(driver, log, tmp_path, texts=texts)
    session = driver._sessions["src"]
    assert list(session.turns) == provider_turns[-SETTLED_TURN_IDS_KEPT:]
    assert not session.active


@pytest.mark.timeout(60)
def test_a_warm_fork_builds_few_paths_on_its_thread(
    make_driver: Make, log: EventLog, tmp_path: Path
) -> None:
    """The fork's thread hands the request's home strings to the binder (which builds no
    `Path`) and builds one `Path` of the target home for the provider's hooks: 53 entries
    into pathlib per warm fork before (13 `Path`s built: one per home per use, per lookup
    match, per relative path), 22 then (4 built: the Session's home compared, the target
    home, the proof reader's and its lookup's match; the reader's lookup joins its
    `sessions/` as a string; the rest the reader's hashes and `fspath`s), 26 now: the
    boundary Turn's end checked in the source's rollout before `thread/fork` (its home's
    `Path`, that home's key and the kept line's file, read again).
    Counted by a profile hook on this thread."""
    from tests.drivers.test_binder_fsyncs import pathlib_entries

    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, log, tmp_path)
    requests = [
        fork_request(home, thread_id, version, turns, tmp_path / "runtimes" / f"c{i}" / "h")
        for i in range(3)
    ]
    driver.fork(requests[0])  # warm: the validate-ahead memo, the reader's imports
    counts = []
    results: list[ForkResult] = []
    for request in requests[1:]:
        counts.append(pathlib_entries(lambda r=request: results.append(driver.fork(r))))
    for result in results:
        assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert max(counts) <= 26, counts
