"""End-to-end fork saga through the socket, with real worker and tutti-agent processes:
commit, dispositions, barrier and ACK, replays, recovery by GET."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    run_turn,
    submit,
    timeline,
    wait_for,
)
from tests.support.homes import child_rollouts, rollouts, runtime_home, user_texts
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(180)


def fork(
    c: Client,
    sid: str,
    turn_id: str,
    *,
    request_id: str | None = None,
    target: str | None = None,
    ws: str = WS,
) -> tuple[int, dict[str, Any]]:
    status, body = c.call_raw(
        "fork.create",
        {
            "workspaceId": ws,
            "agentSessionId": sid,
            "requestId": request_id or str(uuid.uuid4()),
            "targetAgentSessionId": target or str(uuid.uuid4()),
            "point": {"type": "throughTurn", "turnId": turn_id},
        },
    )
    if status >= 400:
        raise ApiError.from_reply(status, body)
    return status, body["operation"]


def get_op(c: Client, op_id: str, ws: str = WS) -> dict[str, Any]:
    return dict(c.call("fork.get", {"workspaceId": ws, "operationId": op_id})["operation"])


def until_terminal(
    c: Client, op: dict[str, Any], timeout: float = 60, ws: str = WS
) -> dict[str, Any]:
    if op["status"] != "accepted":
        return op
    return dict(
        wait_for(
            lambda: (o := get_op(c, op["operationId"], ws))["status"] != "accepted" and o, timeout
        )
    )


def three_turn_source(c: Client) -> tuple[str, list[dict[str, Any]]]:
    sid = create_session(c, title="123")["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("first", "second", "third")]
    return sid, turns


def test_fork_commits_through_turn_with_one_provider_call(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    source_home = runtime_home(daemon.home, WS, sid)
    status, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert status in (200, 202)
    assert op["status"] == "committed", op
    assert op["phase"] == "committed" and op["error"] is None
    child = op["session"]
    assert child["agentSessionId"] == op["targetAgentSessionId"]
    assert child["kind"] == "root" and child["parentAgentSessionId"] is None
    assert child["title"] == "123 (2)"
    assert (
        child["providerSessionId"] and child["providerSessionId"] != turns[0]["rootProviderTurnId"]
    )
    lineage = op["lineage"]
    assert lineage["sourceAgentSessionId"] == sid
    assert lineage["sourceTurnId"] == turns[1]["turnId"]
    assert child["forkedFrom"] == lineage

    child_turns = timeline(c, child["agentSessionId"])
    assert len(child_turns) == 2
    assert lineage["targetTurnId"] == child_turns[1]["turnId"]
    assert {t["turnId"] for t in child_turns}.isdisjoint({t["turnId"] for t in turns})
    assert [[m["text"] for m in t["messages"]] for t in child_turns] == [
        ["first", "echo: first"],
        ["second", "echo: second"],
    ]
    # Same provider turn ids: the app-server child holds the exact prefix.
    assert [t["rootProviderTurnId"] for t in child_turns] == [
        t["rootProviderTurnId"] for t in turns[:2]
    ]
    # Exactly one provider child, created in the source home and bound into the child's.
    assert len(child_rollouts(source_home)) == 1
    child_home = runtime_home(daemon.home, WS, child["agentSessionId"])
    assert len(rollouts(child_home)) >= 1
    # The source is unchanged.
    assert [t["turnId"] for t in timeline(c, sid)] == [t["turnId"] for t in turns]


def test_child_turn_runs_on_its_own_provider_session_and_home(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    child_id = op["session"]["agentSessionId"]
    next_turn = run_turn(c, child_id, "fourth")
    assert next_turn["outcome"] == "completed" and next_turn["sequence"] == 3
    child = c.call("session.get", {"workspaceId": WS, "agentSessionId": child_id})["session"]
    child_home = runtime_home(daemon.home, WS, child_id)
    own = [p for p in rollouts(child_home) if child["providerSessionId"] in p.name]
    assert len(own) == 1
    texts = user_texts(own[0])
    assert "first" in texts and "second" in texts and "fourth" in texts
    assert "third" not in texts
    # The source's own thread did not grow.
    source_home = runtime_home(daemon.home, WS, sid)
    source_texts = [
        t
        for p in rollouts(source_home)
        if p not in child_rollouts(source_home)
        for t in user_texts(p)
    ]
    assert "fourth" not in source_texts


def test_second_fork_of_same_source_gets_title_three(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    first = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": first["operationId"]})
    second = until_terminal(c, fork(c, sid, turns[2]["turnId"])[1])
    assert first["session"]["title"] == "123 (2)"
    assert second["session"]["title"] == "123 (3)"


def test_fork_of_a_fork_commits(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    child_id = op["session"]["agentSessionId"]
    run_turn(c, child_id, "child turn")
    child_turns = timeline(c, child_id)
    grand = until_terminal(c, fork(c, child_id, child_turns[2]["turnId"])[1])
    assert grand["status"] == "committed", grand
    grand_turns = timeline(c, grand["session"]["agentSessionId"])
    assert [t["messages"][0]["text"] for t in grand_turns] == ["first", "second", "child turn"]


def test_replay_with_same_request_id_returns_the_same_operation(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    op = until_terminal(c, fork(c, sid, turns[1]["turnId"], request_id=rid, target=target)[1])
    status, again = fork(c, sid, turns[1]["turnId"], request_id=rid, target=target)
    assert status == 200
    assert again["operationId"] == op["operationId"] and again["status"] == "committed"
    with pytest.raises(ApiError) as err:
        fork(c, sid, turns[0]["turnId"], request_id=rid, target=target)
    assert err.value.reason == "agent_session_fork_request_conflict"
    assert len(child_rollouts(runtime_home(daemon.home, WS, sid))) == 1


def test_new_identity_on_held_boundary_gets_original_until_ack_then_new_branch(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    assert op["status"] == "committed"
    _, held = fork(c, sid, turns[1]["turnId"])
    assert held["operationId"] == op["operationId"]
    assert held["targetAgentSessionId"] == op["targetAgentSessionId"]
    acked = c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    assert acked["operation"]["operationId"] == op["operationId"]
    again = c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    assert again["operation"]["status"] == "committed"
    new = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    assert new["operationId"] != op["operationId"] and new["status"] == "committed"
    assert len(child_rollouts(runtime_home(daemon.home, WS, sid))) == 2


def test_fork_get_is_pure_and_never_acks(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    for _ in range(3):
        assert get_op(c, op["operationId"])["status"] == "committed"
    # Still held: GET did not release the barrier.
    assert fork(c, sid, turns[1]["turnId"])[1]["operationId"] == op["operationId"]


def test_ack_of_unknown_operation_id_is_not_found(daemon: DaemonProcess) -> None:
    c = daemon.client()
    with pytest.raises(ApiError) as err:
        c.call("fork.acknowledge", {"workspaceId": WS, "operationId": str(uuid.uuid4())})
    assert err.value.status == 404
    assert err.value.reason == "agent_session_fork_operation_not_found"


def test_boundary_errors_are_typed(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    with pytest.raises(ApiError) as err:
        fork(c, sid, str(uuid.uuid4()))
    assert err.value.status in (404, 409)
    active = submit(c, sid, "/slow 3000 busy")
    with pytest.raises(ApiError) as err:
        fork(c, sid, turns[1]["turnId"])
    assert err.value.reason == "agent_session_fork_conflict"
    # The submit claim is finished once the provider starts the turn; either blocks.
    assert err.value.params["forkBoundaryReason"] in (
        "source_turn_active",
        "source_submit_claim_active",
    )
    wait_for(lambda: timeline(c, sid)[-1]["phase"] == "settled")
    assert active["turnId"] == timeline(c, sid)[-1]["turnId"]


def test_fresh_session_without_attestation_is_not_forkable(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    assert c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"][
        "lifecycleCapabilities"
    ] == {"fork": False, "forkThroughTurn": False, "forkFullSession": False}


def _arm(c: Client, **points: str) -> None:
    c.call("debug.failpoints", {"points": {k.replace("_", "."): v for k, v in points.items()}})


@pytest.mark.parametrize(
    ("point", "action", "status", "children"),
    [
        ("worker.fork.before_provider_call", "error", "failed", 0),
        ("worker.fork.after_provider_call", "error", "unknown", 1),
        ("worker.bind.before_copy", "error", "unknown", 1),
        # The copy damaged after the binder made it durable: the readability proof refuses it.
        ("worker.bind.after_copy", "tamper", "unknown", 1),
    ],
)
def test_dispositions_from_worker_failpoints(
    daemon: DaemonProcess, point: str, action: str, status: str, children: int
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    c.call("debug.failpoints", {"points": {point: action}})
    op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    assert op["status"] == status, op
    assert op["session"] is None and op["lineage"] is None
    assert op["error"]
    assert len(child_rollouts(runtime_home(daemon.home, WS, sid))) == children
    # No canonical child exists unless committed.
    with pytest.raises(ApiError):
        c.call("session.get", {"workspaceId": WS, "agentSessionId": op["targetAgentSessionId"]})
    c.call("debug.failpoints", {"points": {point: "off"}})
    if status == "unknown":
        # Never redispatched: the same boundary keeps returning the unknown operation.
        again = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
        assert again["operationId"] == op["operationId"] and again["status"] == "unknown"
        with pytest.raises(ApiError) as err:
            c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
        assert err.value.reason == "agent_session_fork_acknowledge_conflict"
        assert len(child_rollouts(runtime_home(daemon.home, WS, sid))) == children
    else:
        # A confirmed failure releases the boundary: a new attempt may commit.
        again = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
        assert again["status"] == "committed"
    # The source fence is released in every terminal state.
    assert run_turn(c, sid, "after")["outcome"] == "completed"


def test_provider_rejection_is_failed(tmp_path: Path) -> None:
    d = DaemonProcess(
        tmp_path / "home", env={"TUTTI_AGENT_FAILPOINTS": "fork.before_materialize=error"}
    ).start()
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
        assert op["status"] == "failed", op
        assert "rejected" in op["error"]
        assert child_rollouts(runtime_home(d.home, WS, sid)) == []
    finally:
        d.stop()


def test_fenced_writes_are_rejected_while_a_fork_is_active_and_title_pin_are_not(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:2500"}})
    status, op = fork(c, sid, turns[1]["turnId"])
    assert status == 202 and op["status"] == "accepted"
    base = {"workspaceId": WS, "agentSessionId": sid}
    for method, params in [
        ("session.updateSettings", {"settings": {"x": 1}}),
        ("goal.set", {"goal": "g"}),
        ("session.delete", {}),
        ("turn.submit", {"requestId": "r1", "input": [{"type": "text", "text": "x"}]}),
    ]:
        with pytest.raises(ApiError) as err:
            c.call(method, {**base, **params})
        assert err.value.reason == "agent_session_fork_in_progress", method
        assert err.value.retryable is True
    assert c.call("session.updateTitle", {**base, "title": "renamed"})["session"]["title"] == (
        "renamed"
    )
    assert c.call("session.pin", {**base, "pinned": True})["session"]["pinned"] is True
    # GET never misclassifies the live dispatch as a leftover.
    live = get_op(c, op["operationId"])
    assert live["status"] == "accepted" and live["phase"] in ("frozen", "dispatching")
    done = until_terminal(c, op)
    assert done["status"] == "committed"
    # Frozen at prepare: the later rename does not reach the child's title.
    assert done["session"]["title"] == "123 (2)"
    assert c.call("session.updateSettings", {**base, "settings": {"x": 2}})["session"]


def test_caller_gone_during_dispatch_still_commits_and_replay_recovers_it(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:1500"}})
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    gone = Client(daemon.api, timeout=5)
    gone.submit(
        "fork.create",
        {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": rid,
            "targetAgentSessionId": target,
            "point": {"type": "throughTurn", "turnId": turns[1]["turnId"]},
        },
    )
    gone.close()  # the reply is lost with the caller
    # The engine retries with the same identity and gets the durable operation.
    op = wait_for(
        lambda: (
            (o := fork(c, sid, turns[1]["turnId"], request_id=rid, target=target)[1])["status"]
            == "committed"
            and o
        ),
        30,
    )
    assert op["targetAgentSessionId"] == target
    assert get_op(c, op["operationId"])["status"] == "committed"
    assert len(child_rollouts(runtime_home(daemon.home, WS, sid))) == 1


def _daemon_with_tutti_command(home: Path, command: str) -> DaemonProcess:
    home.mkdir(parents=True, exist_ok=True)
    (home / "agenthost.toml").write_text(
        f"[providers.tutti-agent]\ncommand = {json.dumps(command)}\n"
    )
    return DaemonProcess(home).start()


def test_driver_version_changed_between_prepare_and_dispatch_fails_without_dispatch(
    tmp_path: Path,
) -> None:
    version_file = tmp_path / "version"
    version_file.write_text("0.1.0")
    wrapper = tmp_path / "versioned_tutti.py"
    # The real Tutti Agent program, reporting the version the test writes (an upgrade).
    wrapper.write_text(
        "import sys, tutti_agent\n"
        f"tutti_agent.__version__ = open({str(version_file)!r}).read().strip()\n"
        "from tutti_agent.cli import main\n"
        "sys.exit(main())\n"
    )
    d = _daemon_with_tutti_command(tmp_path / "home", f"{sys.executable} {wrapper}")
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert session["lifecycleCapabilities"]["forkThroughTurn"] is True
        worker = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
        c.call("debug.failpoints", {"points": {"host.fork.after_prepare": "sleep:2500"}})
        pending = c.submit(
            "fork.create",
            fork_params(WS, sid, turns[1]["turnId"]),
        )
        time.sleep(0.8)  # inside the after_prepare window: upgrade the provider, drop the runtime
        version_file.write_text("0.2.0")
        os.kill(worker["pid"], signal.SIGKILL)
        status, body = pending.result(timeout=30)
        op = until_terminal(c, body["operation"])
        assert op["status"] == "failed", op
        # The host re-attests and sees the new version ("driver changed"), or — when the
        # fork's dispatch reached the respawned worker on the warm path first, as a loaded
        # machine can order it — the worker refuses the changed runtime before the provider
        # sees anything. Either way: failed, never dispatched to the provider, no child.
        assert "driver changed" in op["error"] or (
            "runtime changed since its attestation" in op["error"]
        ), op["error"]
        assert child_rollouts(runtime_home(d.home, WS, sid)) == []
    finally:
        d.stop()


def test_accepted_answer_without_child_id_is_unknown(tmp_path: Path) -> None:
    proxy = Path(__file__).parent.parent / "drivers" / "tamper_proxy.py"
    tutti = Path(sys.executable).parent / "tutti-agent"
    log = tmp_path / "proxy.log"
    d = _daemon_with_tutti_command(
        tmp_path / "home", f"{sys.executable} {proxy} empty_id {log} -- {tutti}"
    )
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
        assert op["status"] == "unknown", op
        assert op["session"] is None
        # One provider call was made and it is never repeated.
        assert log.read_text().count("thread/fork") == 1
        again = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
        assert again["operationId"] == op["operationId"]
        assert log.read_text().count("thread/fork") == 1
    finally:
        d.stop()


def test_provider_unavailable_before_any_operation_is_a_typed_502(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client()
    sid, turns = three_turn_source(c)
    rid0, target0 = str(uuid.uuid4()), str(uuid.uuid4())
    committed = until_terminal(
        c, fork(c, sid, turns[0]["turnId"], request_id=rid0, target=target0)[1]
    )
    assert committed["status"] == "committed"
    d.stop()
    # The provider is broken after a restart: runtime preparation cannot attach it.
    (home / "agenthost.toml").write_text('[providers.tutti-agent]\ncommand = "/bin/false"\n')
    d2 = DaemonProcess(home).start()
    try:
        c2 = d2.client()
        rid = str(uuid.uuid4())
        with pytest.raises(ApiError) as err:
            fork(c2, sid, turns[1]["turnId"], request_id=rid)
        assert err.value.status == 502
        assert err.value.code == "provider_error"
        assert err.value.reason == "agent_session_fork_failed"
        assert c2.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        # A replay, and a new identity on the held boundary, need no runtime at all.
        status, replay = fork(c2, sid, turns[0]["turnId"], request_id=rid0, target=target0)
        assert (status, replay["operationId"]) == (200, committed["operationId"])
        _, held = fork(c2, sid, turns[0]["turnId"])
        assert held["operationId"] == committed["operationId"]
    finally:
        d2.stop()
