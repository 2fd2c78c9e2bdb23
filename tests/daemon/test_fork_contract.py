"""Seed 000 strict-contract points through the daemon's socket: model content is
never rewritten by the fork, every fork conflict names a `forkBoundaryReason`, the binder and
forkability verdicts fail closed, one provider call per operation, replay after delete."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.context import runtime_key
from actors.host_actor import WorkerEvent
from agenthost.config import Config
from agenthost.daemon import Daemon
from model_fakes.responses import FunctionCall, ResponsesServer, last_user_text
from storage.store import Store
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    run_turn,
    timeline,
    wait_for,
)
from tests.support.homes import child_rollouts, runtime_home
from tests.support.store_reads import fence_holder, fork_operations_of
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def tutti_responses(tmp_path: Path) -> Iterator[tuple[DaemonProcess, dict[str, Any]]]:
    """A daemon whose tutti-agent talks to a local Responses server; `state["arguments"]` is
    what the model's `function_call` carries when the user says "call the tool"."""
    state: dict[str, Any] = {"arguments": "{}"}

    def reply(body: dict[str, Any]) -> str | FunctionCall:
        if last_user_text(body) == "call the tool":
            return FunctionCall("lookup_reference", state["arguments"])
        return f"echo: {last_user_text(body)}"

    with ResponsesServer(reply) as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            yield d, state
        finally:
            d.stop()


def test_tutti_function_call_arguments_with_typed_keys_are_copied_byte_identical(
    tutti_responses: tuple[DaemonProcess, dict[str, Any]],
) -> None:
    d, state = tutti_responses
    c = d.client()
    sid = create_session(c, title="t")["agentSessionId"]
    first = run_turn(c, sid, "one")
    state["arguments"] = json.dumps({"messageId": "abc", "turnId": first["turnId"]})
    second = run_turn(c, sid, "call the tool")
    assert second["outcome"] == "completed", second
    source_calls = [m for m in timeline(c, sid)[1]["messages"] if m["kind"] == "tool_call"]
    assert [m["payload"]["arguments"] for m in source_calls] == [state["arguments"]]
    _, op = fork(c, sid, second["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    child = timeline(c, op["session"]["agentSessionId"])
    child_calls = [m for m in child[1]["messages"] if m["kind"] == "tool_call"]
    assert [json.dumps(m["payload"], sort_keys=True) for m in child_calls] == [
        json.dumps(m["payload"], sort_keys=True) for m in source_calls
    ]


def test_every_fork_conflict_carries_a_fork_boundary_reason(daemon: DaemonProcess) -> None:
    """PROTOCOL: 409 `agent_session_fork_conflict` always has `params.forkBoundaryReason`,
    also for target-id conflicts (history-reference errors: tests/storage)."""
    c = daemon.client()
    sid = create_session(c, title="t")["agentSessionId"]
    turn = run_turn(c, sid, "one")
    other = create_session(c, title="o")["agentSessionId"]
    for target, why in ((sid, "target_equals_source"), (other, "target_session_exists")):
        with pytest.raises(ApiError) as err:
            fork(c, sid, turn["turnId"], target=target)
        assert err.value.reason == "agent_session_fork_conflict"
        assert err.value.params["forkBoundaryReason"] == why
        assert err.value.params["field"] == "targetAgentSessionId"
    with pytest.raises(ApiError) as err:
        fork(c, sid, str(uuid.uuid4()))
    assert err.value.params["forkBoundaryReason"] == "turn_not_found"


def test_binder_not_attested_available_fails_the_fork_before_dispatch(
    daemon: DaemonProcess,
) -> None:
    """Seed 000 §7: a re-attestation that does not say `binderAvailable: true` refuses before
    the provider is called: `failed`, no provider child, the source unfenced."""
    c = daemon.client()
    sid = create_session(c, title="t")["agentSessionId"]
    turn = run_turn(c, sid, "one")
    c.call("debug.failpoints", {"points": {"worker.binder.available": "error"}})
    _, op = fork(c, sid, turn["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "failed", op
    assert "binder unavailable" in op["error"]
    assert child_rollouts(runtime_home(daemon.home, WS, sid)) == []
    assert run_turn(c, sid, "two")["outcome"] == "completed"  # fence released
    c.call("debug.failpoints", {"points": {"worker.binder.available": "off"}})
    _, op = fork(c, sid, turn["turnId"])
    assert until_terminal(c, op)["status"] == "committed"


def test_replay_after_the_source_was_deleted_answers_the_committed_operation(
    daemon: DaemonProcess,
) -> None:
    """Seed 000 §8: same requestId, and a new identity on the held (unACKed) barrier, both
    answer the durable committed operation after the source was deleted — never 404 — and
    the operation can still be ACKed. A fork that never existed still gets 404."""
    c = daemon.client()
    sid = create_session(c, title="t")["agentSessionId"]
    turn = run_turn(c, sid, "one")
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    _, op = fork(c, sid, turn["turnId"], request_id=rid, target=target)
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    status, again = fork(c, sid, turn["turnId"], request_id=rid, target=target)
    assert status == 200 and again["operationId"] == op["operationId"]
    assert again["status"] == "committed" and again["session"]["agentSessionId"] == target
    _, held = fork(c, sid, turn["turnId"])  # new identity: the barrier's original
    assert held["operationId"] == op["operationId"]
    acked = c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    assert acked["operation"]["status"] == "committed"
    with pytest.raises(ApiError) as err:
        fork(c, sid, turn["turnId"])  # barrier released: nothing durable answers any more
    assert err.value.status == 404


def test_fork_request_carries_the_source_canonical_turn_id(daemon: DaemonProcess) -> None:
    """Seed 000 §7 provider-neutral input: the worker's fork request names the canonical
    boundary Turn; the driver echoes it in the binding receipt the operation stores."""
    c = daemon.client()
    sid = create_session(c, title="t")["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("one", "two")]
    _, op = fork(c, sid, turns[0]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    store = Store.open(daemon.home / "store.sqlite3")
    try:
        stored = store.fork_queries.get_fork_operation(WS, op["operationId"])
    finally:
        store.close()
    assert stored.binding_receipt["sourceCanonicalTurnId"] == turns[0]["turnId"]


def _daemon_with_wrapped_tutti(tmp_path: Path, patch: str) -> DaemonProcess:
    """A daemon whose tutti-agent is the real program with `patch` (Python) applied first."""
    wrapper = tmp_path / "wrapped_tutti.py"
    wrapper.write_text(f"import sys\n{patch}\nfrom tutti_agent.cli import main\nsys.exit(main())\n")
    home = tmp_path / "home"
    home.mkdir()
    command = f"{sys.executable} {wrapper}"
    (home / "agenthost.toml").write_text(
        f"[providers.tutti-agent]\ncommand = {json.dumps(command)}\n"
    )
    return DaemonProcess(home).start()


WRONG_BRAND = """
import tutti_agent.server as server
_initialize = server.AppServer.initialize
def initialize(self, params):
    reply = _initialize(self, params)
    reply.result["userAgent"] = "codex_cli_rs/0.200.0 (Linux; x86_64)"  # not tutti_agent/<v>
    return reply
server.AppServer.initialize = initialize
"""


def test_wrong_brand_runtime_shows_no_fork_and_is_refused_before_any_operation(
    tmp_path: Path,
) -> None:
    """Seed 000 §3.2: the driver's attested verdict is the only capability. A runtime that
    answers with another brand's user agent (a version above every gate) is not forkable:
    no Fork shown, and `fork.create` is refused before an operation exists or the source is
    fenced — not dispatched into a `failed` operation."""
    d = _daemon_with_wrapped_tutti(tmp_path, WRONG_BRAND)
    try:
        c = d.client()
        sid = create_session(c, title="t")["agentSessionId"]
        turn = run_turn(c, sid, "one")
        session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert session["lifecycleCapabilities"]["forkThroughTurn"] is False
        rid = str(uuid.uuid4())
        with pytest.raises(ApiError) as err:
            fork(c, sid, turn["turnId"], request_id=rid)
        assert err.value.reason == "agent_session_fork_unsupported"
        store = Store.open(d.home / "store.sqlite3")
        try:
            assert fork_operations_of(store, WS, sid) == []
        finally:
            store.close()
        assert run_turn(c, sid, "two")["outcome"] == "completed"
    finally:
        d.stop()


def test_late_turn_binding_while_fenced_is_applied_after_the_fence_releases(
    tmp_path: Path,
) -> None:
    """Seed 000 §7 Claude 3: a trailing `turn.binding` (a late checkpoint) that arrives while a
    fork fences the source is not lost: the operation dispatches the binding it froze, and
    the late one is written as soon as the fence is released."""
    home = tmp_path / "home"
    daemon = Daemon(Config(home=home), failpoints_enabled=True)
    daemon.start()
    client = Client(daemon.api_endpoint, timeout=30)
    try:
        assert daemon.store is not None
        sid = create_session(client)["agentSessionId"]
        turns = [run_turn(client, sid, text) for text in ("one", "two")]
        before = daemon.store.turns.get_turn(WS, sid, turns[0]["turnId"]).provider_turn_binding_json
        # Hold the fence: the worker sleeps before the provider call (the actor stays free).
        client.call(
            "debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:1500"}}
        )
        pending = client.submit(
            "fork.create",
            fork_params(WS, sid, turns[1]["turnId"]),
        )
        wait_for(lambda: fence_holder(daemon.store, WS, sid) is not None)  # type: ignore[arg-type]
        late = json.dumps({"checkpoint": "late", "n": 1})
        daemon.host.tell(
            WorkerEvent(
                runtime_key(WS, sid),
                {"type": "turn.binding", "turnId": turns[0]["turnId"], "bindingJson": late},
            )
        )
        status, body = pending.result(timeout=30)
        op = until_terminal(client, body["operation"])
        assert op["status"] == "committed", op
        # The operation kept the binding it froze (the child's twin has it, not the late one)…
        child_turns, _ = daemon.store.history.timeline(WS, op["targetAgentSessionId"], limit=10)
        assert child_turns[0].provider_turn_binding_json == before != late
        # …and the late checkpoint landed once the fence was released.
        wait_for(
            lambda: (
                daemon.store.turns.get_turn(  # type: ignore[union-attr]
                    WS, sid, turns[0]["turnId"]
                ).provider_turn_binding_json
                == late
            )
        )
    finally:
        client.close()
        daemon.close()


SUB_AGENT_ITEM = """
import tutti_agent.turns as turns
_agent_message = turns._TurnIO.agent_message
def agent_message(self, text, item_id=None):
    if "delegate" in text:
        # What a Codex app-server streams when the model spawns a sub-agent thread.
        self.emit_item({"type": "collabAgentToolCall", "id": "collab_1", "tool": "spawnAgent",
                        "status": "completed", "senderThreadId": "t-1",
                        "receiverThreadIds": ["t-2"], "prompt": "look around"})
    return _agent_message(self, text, item_id)
turns._TurnIO.agent_message = agent_message
"""


def test_app_server_sub_agent_item_in_the_boundary_is_descendant_lane(tmp_path: Path) -> None:
    """Seed 000 §4: an app-server sub-agent/collaboration item is recorded as a descendant
    lane, so a boundary that holds it is refused (`descendant_lane_in_boundary`) while a
    boundary before it still forks."""
    d = _daemon_with_wrapped_tutti(tmp_path, SUB_AGENT_ITEM)
    try:
        c = d.client()
        sid = create_session(c, title="t")["agentSessionId"]
        turns = [run_turn(c, sid, text) for text in ("one", "delegate", "three")]
        lanes = [m for m in timeline(c, sid)[1]["messages"] if m["kind"] == "collabAgentToolCall"]
        assert len(lanes) == 1 and lanes[0]["payload"]["descendantLane"] is True
        for turn in turns[1:]:
            with pytest.raises(ApiError) as err:
                fork(c, sid, turn["turnId"])
            assert err.value.params["forkBoundaryReason"] == "descendant_lane_in_boundary"
        _, op = fork(c, sid, turns[0]["turnId"])
        assert until_terminal(c, op)["status"] == "committed"
    finally:
        d.stop()
