"""End-to-end: the daemon through its real sockets, with real worker and tutti-agent processes:
Sessions, turns, interactions, workers, restarts and events."""

from __future__ import annotations

import os
import re
import signal
import stat
import time
import uuid
from pathlib import Path

import msgpack
import psutil
import pytest

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    respond,
    run_turn,
    settle,
    status_of_last_fork,
    submit,
    timeline,
    turn_of,
    wait_for,
)
from transport.client import ApiError, EventSubscriber

pytestmark = pytest.mark.timeout(120)


def _assistant_texts(turn: dict) -> list[str]:
    return [m["text"] for m in turn["messages"] if m["kind"] == "assistant"]


def test_ready_line_names_endpoints_and_pid(daemon: DaemonProcess) -> None:
    assert daemon.ready["ready"] is True
    assert daemon.ready["api"].startswith("ipc://")
    assert daemon.ready["events"].startswith("ipc://")
    assert daemon.ready["pid"] == daemon.proc.pid
    # README.md, the user guide and protocol.md show every key of it and no other.
    root = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/user-guide.md", "docs/protocol.md"):
        text = (root / doc).read_text(encoding="utf-8")
        shown = text.split('{"ready": true', 1)[1].split("\n\n", 1)[0].split("\n- ", 1)[0]
        assert {"ready", *re.findall(r'"([A-Za-z]+)"', shown)} == set(daemon.ready), doc


def test_run_dir_is_private_and_sockets_owner_only(daemon: DaemonProcess) -> None:
    run = daemon.home / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    for name in ("api.sock", "events.sock", "events-exact.sock"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o600
    # Every run/ entry README.md's "Where data lives" names is there.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    listing = readme.split("\n## Where data lives", 1)[1].split("\n```\n", 2)[1]
    named = re.findall(r"\brun/[\w./<>-]+", listing)
    assert len(named) >= 6, named
    for name in named:  # the worker's log once its worker started (after the ready line)
        path = daemon.home / name.replace("<provider>", "tutti-agent")
        assert wait_for(path.exists), name


def test_host_status_reports_version_protocol_and_workers(daemon: DaemonProcess) -> None:
    c = daemon.client()
    status = c.call("host.status")
    assert status["protocol"] == 1
    assert status["home"] == str(daemon.home.resolve())
    assert isinstance(status["workers"], list)
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "hello")
    workers = c.call("host.status")["workers"]
    tutti = [w for w in workers if w["provider"] == "tutti-agent"]
    assert tutti and tutti[0]["pid"] > 0 and tutti[0]["restarts"] == 0


def test_session_create_get_list_title_pin_settings_delete(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = str(uuid.uuid4())
    s = create_session(c, agentSessionId=sid, title="Alpha", settings={"effort": "low"})
    assert s["agentSessionId"] == sid
    assert s["kind"] == "root" and s["provider"] == "tutti-agent"
    assert s["title"] == "Alpha" and s["settings"] == {"effort": "low"}
    assert s["lifecycleCapabilities"] == {
        "fork": False,
        "forkThroughTurn": False,
        "forkFullSession": False,
    }
    assert s["forkedFrom"] is None
    got = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    assert got["title"] == "Alpha"
    other = create_session(c, title="Beta")["agentSessionId"]
    listed = c.call("session.list", {"workspaceId": WS})
    assert {x["agentSessionId"] for x in listed["sessions"]} == {sid, other}
    t = c.call("session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": "A2"})
    assert t["session"]["title"] == "A2"
    p = c.call("session.pin", {"workspaceId": WS, "agentSessionId": sid, "pinned": True})
    assert p["session"]["pinned"] is True
    u = c.call(
        "session.updateSettings",
        {"workspaceId": WS, "agentSessionId": sid, "settings": {"effort": "high"}},
    )
    assert u["session"]["settings"] == {"effort": "high"}
    g = c.call("goal.set", {"workspaceId": WS, "agentSessionId": sid, "goal": "ship it"})
    assert g["session"]["goal"] == "ship it"
    g = c.call("goal.clear", {"workspaceId": WS, "agentSessionId": sid})
    assert g["session"]["goal"] is None
    assert c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid}) == {"deleted": True}
    with pytest.raises(ApiError) as err:
        c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
    assert err.value.status == 404 and err.value.reason == "workspace_agent_session_not_found"


def test_session_create_twice_with_same_id_conflicts(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = str(uuid.uuid4())
    create_session(c, agentSessionId=sid)
    with pytest.raises(ApiError) as err:
        create_session(c, agentSessionId=sid)
    assert err.value.status == 409


def test_turns_run_on_tutti_agent_and_settle_with_the_reply(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turns = [run_turn(c, sid, f"message {i}") for i in range(1, 4)]
    assert [t["sequence"] for t in turns] == [1, 2, 3]
    for i, turn in enumerate(turns, 1):
        assert turn["outcome"] == "completed"
        assert turn["rootProviderTurnId"]
        assert turn["providerForkBindingState"] == "bound"
        assert _assistant_texts(turn) == [f"echo: message {i}"]
        assert (
            turn["finalAssistantMessageId"]
            == [m for m in turn["messages"] if m["kind"] == "assistant"][-1]["messageId"]
        )
        assert turn["messages"][0]["kind"] == "user"
        assert turn["messages"][0]["text"] == f"message {i}"
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    assert session["providerSessionId"]
    assert session["lifecycleCapabilities"]["forkThroughTurn"] is True


def test_turn_submit_replay_returns_same_turn_and_runs_one_provider_turn(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    first = submit(c, sid, "only once", request_id="req-1")
    again = submit(c, sid, "only once", request_id="req-1")
    assert again["turnId"] == first["turnId"]
    settle(c, sid, first["turnId"])
    third = submit(c, sid, "only once", request_id="req-1")
    assert third["turnId"] == first["turnId"]
    turns = timeline(c, sid)
    assert len(turns) == 1
    assert _assistant_texts(turns[0]) == ["echo: only once"]
    # One provider turn: the provider thread holds exactly one turn.
    rollouts = list((daemon.home / "runtimes").rglob("rollout-*.jsonl"))
    assert len(rollouts) == 1
    starts = [line for line in rollouts[0].read_text().splitlines() if '"task_started"' in line]
    assert len(starts) == 1


def test_second_submit_while_turn_active_is_busy(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    active = submit(c, sid, "/slow 3000 wait")
    with pytest.raises(ApiError) as err:
        submit(c, sid, "second")
    assert err.value.status == 409 and err.value.reason == "agent_session_busy"
    settle(c, sid, active["turnId"])


def test_active_turn_and_pending_interaction_are_visible_in_timeline(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    slow_sid = create_session(c)["agentSessionId"]
    slow = submit(c, slow_sid, "/slow 4000 later")
    assert turn_of(c, slow_sid, slow["turnId"])["phase"] == "active"
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": slow_sid})["session"]
    assert session["activeTurnId"] == slow["turnId"]

    ask_sid = create_session(c)["agentSessionId"]
    ask = submit(c, ask_sid, "/ask what colour?")
    pending = wait_for(
        lambda: [
            i
            for i in turn_of(c, ask_sid, ask["turnId"])["interactions"]
            if i["status"] == "pending"
        ]
    )
    assert pending[0]["kind"] == "question"
    resolved = respond(c, ask_sid, ask["turnId"], pending[0]["requestId"], {"text": "blue"})
    assert resolved["status"] == "resolved"
    done = settle(c, ask_sid, ask["turnId"])
    assert _assistant_texts(done) == ["blue"]
    assert settle(c, slow_sid, slow["turnId"])["outcome"] == "completed"


@pytest.mark.parametrize(("decision", "reply"), [("approve", "approved"), ("decline", "declined")])
def test_approval_interaction_round_trip(daemon: DaemonProcess, decision: str, reply: str) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/approve rm -rf build")
    pending = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"])
    assert pending[0]["kind"] == "approval"
    respond(c, sid, turn["turnId"], pending[0]["requestId"], {"decision": decision})
    done = settle(c, sid, turn["turnId"])
    assert _assistant_texts(done) == [f"{reply}: rm -rf build"]


def test_an_answer_to_an_unknown_or_settled_interaction_is_typed(daemon: DaemonProcess) -> None:
    """docs/protocol.md's binding reasons: an Interaction the Turn never had is 404
    `interaction_not_found` (not `turn_not_found`: the Turn exists), one no longer pending is
    409 `conflict`, and an unknown Turn is 404 `turn_not_found`."""
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/ask what colour?")
    pending = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"])

    def answer(turn_id: str, request_id: str) -> tuple[int, str]:
        with pytest.raises(ApiError) as err:
            respond(c, sid, turn_id, request_id, {"text": "red"})
        return err.value.status, err.value.reason

    assert answer(turn["turnId"], "no-such-request") == (404, "interaction_not_found")
    assert answer(str(uuid.uuid4()), pending[0]["requestId"]) == (404, "turn_not_found")
    respond(c, sid, turn["turnId"], pending[0]["requestId"], {"text": "blue"})
    settle(c, sid, turn["turnId"])
    assert answer(turn["turnId"], pending[0]["requestId"]) == (409, "conflict")
    assert answer(turn["turnId"], "no-such-request") == (404, "interaction_not_found")


def test_an_answer_whose_turn_ends_before_its_reply_is_still_resolved(
    daemon: DaemonProcess,
) -> None:
    """The answer lets the provider end the Turn at once; its `turn/completed` can reach the
    Session before the worker's reply to `interaction.respond` (held back here). The caller
    still hears the Interaction resolved, and the record says so, not `superseded`."""
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/approve ls")
    pending = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"])
    c.call("debug.failpoints", {"points": {"worker.interaction.after_answer": "sleep:1500"}})
    try:
        answered = respond(c, sid, turn["turnId"], pending[0]["requestId"], {"decision": "approve"})
    finally:
        c.call("debug.failpoints", {"points": {"worker.interaction.after_answer": "off"}})
    assert (answered["status"], answered["output"]) == ("resolved", {"decision": "approve"})
    done = settle(c, sid, turn["turnId"])
    assert _assistant_texts(done) == ["approved: ls"]
    assert [i["status"] for i in done["interactions"]] == ["resolved"]


def test_an_answer_the_provider_took_is_recorded_after_a_fork_that_began_meanwhile(
    daemon: DaemonProcess,
) -> None:
    """The answer lets the Turn end before the worker's reply (held back), and a fork of the
    now settled Session begins in between (held at the provider): the record of the answer
    the provider took meets the fork's fence. It lands once the fence lifts, never inside the
    window, and the caller hears the resolved Interaction — not a 409 whose retry finds the
    Interaction `superseded` and the answer the provider took never recorded."""
    c = daemon.client(timeout=60)
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/approve ls")
    pending = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"])
    points = {
        "worker.interaction.after_answer": "sleep:2000",
        "worker.fork.before_provider_call": "sleep:4000",
    }
    c.call("debug.failpoints", {"points": points})
    try:
        answer = c.submit(
            "interaction.respond",
            {
                "workspaceId": WS,
                "agentSessionId": sid,
                "turnId": turn["turnId"],
                "requestId": pending[0]["requestId"],
                "response": {"decision": "approve"},
            },
        )
        wait_for(lambda: turn_of(c, sid, turn["turnId"])["phase"] == "settled")
        target = str(uuid.uuid4())
        fork = c.submit(
            "fork.create",
            {
                "workspaceId": WS,
                "agentSessionId": sid,
                "requestId": str(uuid.uuid4()),
                "targetAgentSessionId": target,
                "point": {"type": "latestSettled"},
            },
        )
        status, body = answer.result(timeout=30)
        fork_status, fork_body = fork.result(timeout=30)
    finally:
        c.call("debug.failpoints", {"points": {name: "off" for name in points}})
    assert fork_status in (200, 202), fork_body
    assert (status, body.get("interaction", {}).get("status")) == (200, "resolved"), body
    done = turn_of(c, sid, turn["turnId"])
    assert [i["status"] for i in done["interactions"]] == ["resolved"]
    assert _assistant_texts(done) == ["approved: ls"]


def test_turn_interrupt_settles_interrupted(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/slow 20000 never")
    wait_for(lambda: turn_of(c, sid, turn["turnId"])["rootProviderTurnId"])
    c.call("turn.interrupt", {"workspaceId": WS, "agentSessionId": sid, "turnId": turn["turnId"]})
    done = settle(c, sid, turn["turnId"])
    assert done["outcome"] == "interrupted"


def test_an_interrupt_of_a_settled_turn_during_a_fork_answers_the_turn_unchanged(
    daemon: DaemonProcess,
) -> None:
    """`turn.interrupt` of a settled Turn answers it unchanged (docs/design/internals.md,
    "Interactions and interrupts: their laws"), a fork of its Session in flight or not: it
    writes nothing, so the fork's fence has nothing to refuse (no Turn is active while a fork
    holds it)."""
    c = daemon.client(timeout=60)
    sid = create_session(c)["agentSessionId"]
    done = run_turn(c, sid, "hello")
    c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:3000"}})
    try:
        fork = c.submit(
            "fork.create",
            {
                "workspaceId": WS,
                "agentSessionId": sid,
                "requestId": str(uuid.uuid4()),
                "targetAgentSessionId": str(uuid.uuid4()),
                "point": {"type": "latestSettled"},
            },
        )
        wait_for(lambda: status_of_last_fork(daemon.home / "store.sqlite3", sid) == "dispatching")
        status, body = c.call_raw(
            "turn.interrupt", {"workspaceId": WS, "agentSessionId": sid, "turnId": done["turnId"]}
        )
        assert status_of_last_fork(daemon.home / "store.sqlite3", sid) == "dispatching"
        fork_status, fork_body = fork.result(timeout=30)
    finally:
        c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "off"}})
    assert fork_status in (200, 202), fork_body
    assert status == 200, body
    assert (body["turn"]["phase"], body["turn"]["outcome"]) == ("settled", "completed")


def test_failing_turn_settles_failed(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    done = run_turn(c, sid, "/fail the model broke")
    assert done["outcome"] == "failed"


def test_workspace_isolation_other_workspace_ids_are_not_found(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = run_turn(c, sid, "secret")
    for method, params in [
        ("session.get", {"agentSessionId": sid}),
        ("session.timeline", {"agentSessionId": sid}),
        ("session.updateTitle", {"agentSessionId": sid, "title": "x"}),
        ("session.pin", {"agentSessionId": sid, "pinned": True}),
        ("session.delete", {"agentSessionId": sid}),
        (
            "turn.submit",
            {"agentSessionId": sid, "requestId": "r", "input": [{"type": "text", "text": "x"}]},
        ),
        ("turn.interrupt", {"agentSessionId": sid, "turnId": turn["turnId"]}),
        (
            "fork.create",
            {
                "agentSessionId": sid,
                "requestId": "r",
                "targetAgentSessionId": str(uuid.uuid4()),
                "point": {"type": "throughTurn", "turnId": turn["turnId"]},
            },
        ),
    ]:
        with pytest.raises(ApiError) as err:
            c.call(method, {"workspaceId": "someone-else", **params})
        assert err.value.status == 404, method
    assert c.call("session.list", {"workspaceId": "someone-else"})["sessions"] == []
    # Still there for its own workspace.
    assert c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\xc1\xff not msgpack", "malformed_request"),
        (msgpack.packb([1, 2, 3]), "malformed_request"),
        (msgpack.packb({"v": 1, "method": "host.status", "params": {}}), "malformed_request"),
        (msgpack.packb({"v": 1, "id": "x", "params": {}}), "malformed_request"),
        (msgpack.packb({"id": "x", "method": "host.status", "params": {}}), "malformed_request"),
        (msgpack.packb({"v": "1", "id": "x", "method": "host.status"}), "malformed_request"),
        (msgpack.packb({"v": 1, "id": 7, "method": "host.status"}), "malformed_request"),
        (msgpack.packb({"v": 1, "id": "", "method": "host.status"}), "malformed_request"),
        (msgpack.packb({"v": 1, "id": "x" * 129, "method": "host.status"}), "malformed_request"),
        (msgpack.packb({"v": 1, "id": "x", "method": 5}), "malformed_request"),
        (msgpack.packb({"v": 1, "id": "x", "method": "no.such", "params": {}}), "unknown_method"),
        (
            msgpack.packb(
                {"v": 1, "id": "x", "method": "session.get", "params": {"workspaceId": 3}}
            ),
            "invalid_argument",
        ),
        (b"\x00" * ((1 << 20) + 1), "payload_too_large"),
    ],
)
def test_bad_frames_get_typed_errors_and_the_daemon_keeps_serving(
    daemon: DaemonProcess, frame: bytes, reason: str
) -> None:
    c = daemon.client()
    reply = c.exchange_frame(frame, timeout=10)
    assert reply["v"] == 1
    assert reply["error"]["reason"] == reason
    assert reply["status"] in (400, 413)
    assert isinstance(reply["error"]["retryable"], bool)
    assert c.call("host.status")["protocol"] == 1


def test_bad_params_name_the_field(daemon: DaemonProcess) -> None:
    c = daemon.client()
    with pytest.raises(ApiError) as err:
        c.call("session.create", {"workspaceId": WS, "provider": "nope"})
    assert err.value.reason == "invalid_argument" and err.value.params["field"] == "provider"
    with pytest.raises(ApiError) as err:
        c.call("session.get", {"workspaceId": WS, "agentSessionId": "not-a-uuid"})
    assert err.value.params["field"] == "agentSessionId"


def test_killed_worker_is_restarted_and_the_next_turn_succeeds(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "before")
    worker = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
    os.kill(worker["pid"], signal.SIGKILL)
    # No waiting for the restart: the next turn must succeed on its own.
    after = run_turn(c, sid, "after")
    assert after["outcome"] == "completed", after
    assert _assistant_texts(after) == ["echo: after"]
    workers = c.call("host.status")["workers"]
    restarted = next(w for w in workers if w["provider"] == "tutti-agent")
    assert restarted["restarts"] >= 1 and restarted["pid"] != worker["pid"]


def test_turn_in_flight_when_worker_dies_settles_failed(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "warm up")
    turn = submit(c, sid, "/slow 20000 long")
    wait_for(lambda: turn_of(c, sid, turn["turnId"])["rootProviderTurnId"])
    worker = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
    os.kill(worker["pid"], signal.SIGKILL)
    done = settle(c, sid, turn["turnId"], timeout=60)
    assert done["outcome"] in ("failed", "interrupted")
    assert run_turn(c, sid, "next")["outcome"] == "completed"


def test_a_killed_worker_takes_its_stopped_app_server_with_it(daemon: DaemonProcess) -> None:
    """An app-server that cannot read the EOF its dead worker leaves (stopped here; busy or
    wedged alike) is ended by the parent-death signal alone: it never outlives its worker
    holding the thread's writer beside the restarted worker's app-server."""
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "warm up")
    worker = next(w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent")
    servers = [p for p in psutil.Process(worker["pid"]).children() if "app-server" in p.cmdline()]
    assert servers, "the Session's app-server runs under the worker"
    for server in servers:
        server.suspend()
    os.kill(worker["pid"], signal.SIGKILL)
    _, alive = psutil.wait_procs(servers, timeout=5)
    for left in alive:
        left.kill()
    assert not alive, [p.pid for p in alive]
    assert run_turn(c, sid, "after")["outcome"] == "completed"


def test_store_reopen_across_daemon_restart_keeps_everything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client()
    sid = create_session(c, title="Persistent")["agentSessionId"]
    t1 = run_turn(c, sid, "one")
    t2 = run_turn(c, sid, "two")
    assert d.stop() == 0
    d2 = DaemonProcess(home).start()
    try:
        c2 = d2.client()
        session = c2.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert session["title"] == "Persistent"
        # Capability comes from the persisted attestation: projecting it spawned nothing.
        assert session["lifecycleCapabilities"]["forkThroughTurn"] is True
        assert [t["providerForkBindingState"] for t in timeline(c2, sid)] == ["bound", "bound"]
        # ... and started no provider runtime (the worker itself is started ahead, at ready).
        assert c2.call("host.status")["runtimes"].get("tutti-agent", {}).get("live", 0) == 0
        assert d2.proc is not None and not [
            p
            for p in psutil.Process(d2.proc.pid).children(recursive=True)
            if "app-server" in p.cmdline()
        ]
        turns = timeline(c2, sid)
        assert [t["turnId"] for t in turns] == [t1["turnId"], t2["turnId"]]
        assert [m["text"] for m in turns[1]["messages"]] == ["two", "echo: two"]
        # The historical session resumes on its provider thread.
        t3 = run_turn(c2, sid, "three")
        assert t3["outcome"] == "completed" and t3["sequence"] == 3
        session2 = c2.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert session2["providerSessionId"] == session["providerSessionId"]
    finally:
        d2.stop()


def test_events_are_published_after_changes(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sub = EventSubscriber(daemon.events, [WS])
    try:
        time.sleep(0.5)  # ZeroMQ slow joiner: let the subscription reach the PUB side
        sid = create_session(c)["agentSessionId"]
        turn = run_turn(c, sid, "evented")
        seen: list[dict] = []
        deadline_hits = 0
        while deadline_hits < 100:
            ev = sub.next(timeout=0.2)
            if ev is None:
                deadline_hits += 10
                continue
            seen.append(ev)
            if ev.get("type") == "turn.updated" and ev["turn"]["phase"] == "settled":
                break
        types = {e["type"] for e in seen}
        assert "turn.updated" in types
        settled = [
            e for e in seen if e["type"] == "turn.updated" and e["turn"]["phase"] == "settled"
        ]
        assert settled and settled[-1]["turn"]["turnId"] == turn["turnId"]
    finally:
        sub.close()
