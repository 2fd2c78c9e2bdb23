"""The whole fork saga through the daemon's socket with `provider: "claude-code"`: real daemon,
real Claude worker, real SDK + CLI, the local MessagesServer; plus a SIGKILL of the Claude
worker right after `fork_session` (→ unknown, never redispatched, exactly one child).

The tests that arm no failpoint share one daemon (a Session and a cwd of their own each, the
model's reply switched per test); those that arm one get a daemon of their own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_fakes.messages import (
    MessagesReplyFn,
    MessagesServer,
    ToolUse,
    default_reply,
    last_user_text,
    model_input_texts,
    tool_result,
)
from storage.store import Store
from tests.daemon.test_fork_resolve import resolve, unknown_fork
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    submit,
    timeline,
    turn_of,
    wait_for,
)
from transport.client import ApiError

pytestmark = [pytest.mark.claude, pytest.mark.timeout(180)]


class SwitchedReply:
    """The shared daemon's model answers with the reply of the test running now (the echo
    between tests)."""

    def __init__(self) -> None:
        self.reply: MessagesReplyFn = default_reply

    def __call__(self, body: dict[str, Any]) -> str | ToolUse:
        return self.reply(body)


@pytest.fixture(scope="module")
def shared_daemon(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DaemonProcess, MessagesServer, SwitchedReply]]:
    replies = SwitchedReply()
    with MessagesServer(replies) as server:
        home = tmp_path_factory.mktemp("claude-daemon") / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            yield d, server, replies
        finally:
            d.stop()


@pytest.fixture
def claude_daemon(
    shared_daemon: tuple[DaemonProcess, MessagesServer, SwitchedReply], tmp_path: Path
) -> Iterator[tuple[DaemonProcess, MessagesServer]]:
    """The module's daemon, answering with the echo unless the test says otherwise
    (`model_reply`), and an empty `tmp_path / "cwd"` for the test's Sessions."""
    d, server, replies = shared_daemon
    (tmp_path / "cwd").mkdir()
    try:
        yield d, server
    finally:
        replies.reply = default_reply


@pytest.fixture
def model_reply(
    shared_daemon: tuple[DaemonProcess, MessagesServer, SwitchedReply],
    claude_daemon: tuple[DaemonProcess, MessagesServer],
) -> SwitchedReply:
    """Set `.reply` to answer this test's model requests with a reply of its own."""
    return shared_daemon[2]


@pytest.fixture
def own_claude_daemon(tmp_path: Path) -> Iterator[tuple[DaemonProcess, MessagesServer]]:
    """A daemon of the test's own, for a test that arms a failpoint (a kill, a tamper)."""
    with MessagesServer() as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        d = DaemonProcess(home).start()
        try:
            yield d, server
        finally:
            d.stop()


def claude_source(d: DaemonProcess, cwd: Path) -> tuple[str, list[dict]]:
    c = d.client()
    sid = create_session(c, provider="claude-code", title="claude", cwd=str(cwd))["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("one", "two", "three")]
    assert [t["outcome"] for t in turns] == ["completed"] * 3, turns
    return sid, turns


def child_transcripts(home: Path, source: str | None = None) -> list[Path]:
    """Claude transcripts that are fork children (their entries carry `forkedFrom`); with
    `source` (a provider session id), only the children forked from it."""
    out = []
    for path in home.glob("runtimes/*/*/claude-config/projects/*/*.jsonl"):
        text = path.read_text()
        if '"forkedFrom"' in text and (source is None or f'"{source}"' in text):
            out.append(path)
    return out


def provider_id_of(d: DaemonProcess, sid: str) -> str:
    session = d.client().call("session.get", {"workspaceId": WS, "agentSessionId": sid})
    return str(session["session"]["providerSessionId"])


def test_claude_fork_commits_through_the_socket_and_child_turn_sees_turns_one_and_two(
    claude_daemon: tuple[DaemonProcess, MessagesServer], tmp_path: Path
) -> None:
    d, server = claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    assert all(t["providerForkBindingState"] == "bound" for t in turns), turns
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    child = op["session"]
    assert child["providerSessionId"] not in (None, "")
    # Seed 000 §7: the fork request named the canonical boundary Turn (echoed in the receipt).
    store = Store.open(d.home / "store.sqlite3")
    try:
        receipt = store.fork_queries.get_fork_operation(WS, op["operationId"]).binding_receipt
    finally:
        store.close()
    assert receipt["sourceCanonicalTurnId"] == turns[1]["turnId"]
    # The worker asked for the next child's home once the answer had left (`after_answer`):
    # the spares shaped like this child's (its cwd's project directory; the shared daemon's
    # other tests' forks had cwds of their own).
    source = provider_id_of(d, sid)
    (child_transcript,) = child_transcripts(d.home, source)
    project = f"claude-config/projects/{child_transcript.parent.name}"
    wait_for(lambda: len(list(d.home.glob(f"runtimes/*/.claude-spare-*/{project}"))) == 2)
    child_turns = timeline(c, child["agentSessionId"])
    assert len(child_turns) == 2
    assert all(t["providerForkBindingState"] == "bound" for t in child_turns)
    n = len(server.requests)
    assert run_turn(c, child["agentSessionId"], "four")["outcome"] == "completed"
    assert model_input_texts(server.requests[n]) == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
        ("user", "four"),
    ]
    assert len(child_transcripts(d.home, source)) == 1


def test_claude_worker_killed_after_fork_session_is_unknown_with_at_most_one_child(
    own_claude_daemon: tuple[DaemonProcess, MessagesServer], tmp_path: Path
) -> None:
    d, _ = own_claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    before = next(w for w in c.call("host.status")["workers"] if w["provider"] == "claude-code")
    c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "once:kill"}})
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    _, op = fork(c, sid, turns[1]["turnId"], request_id=rid, target=target)
    op = until_terminal(c, op)
    assert op["status"] == "unknown", op
    after = next(w for w in c.call("host.status")["workers"] if w["provider"] == "claude-code")
    assert after["pid"] != before["pid"] or after["restarts"] > before["restarts"]
    # Killed right after fork_session returned: exactly the one child it wrote, still in
    # the source's home (the move into the target home never ran).
    assert len(child_transcripts(d.home)) == 1
    # Never redispatched: a new identity on the same boundary gets the unknown operation back.
    _, again = fork(c, sid, turns[1]["turnId"])
    assert again["operationId"] == op["operationId"]
    assert len(child_transcripts(d.home)) == 1
    # The source is usable again (fence released, worker restarted).
    assert run_turn(c, sid, "after the crash")["outcome"] == "completed"


def test_claude_child_damaged_after_its_move_is_unknown_and_never_committed(
    own_claude_daemon: tuple[DaemonProcess, MessagesServer], tmp_path: Path
) -> None:
    """`worker.bind.after_copy=tamper` cuts the child transcript, moved into the child's home,
    back to its first line (as a lost or damaged move would leave it): the driver's proof,
    which reads the child from its own home, refuses it, so the fork ends `unknown` with its
    one child and no canonical child Session is ever made."""
    d, _ = own_claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    c.call("debug.failpoints", {"points": {"worker.bind.after_copy": "tamper"}})
    op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
    c.call("debug.failpoints", {"points": {"worker.bind.after_copy": "off"}})
    assert op["status"] == "unknown", op
    assert op["session"] is None and op["error"]
    children = child_transcripts(d.home)
    assert len(children) == 1
    # The damage really happened, in the child's own home: one line left of the two Turns.
    assert len(children[0].read_bytes().splitlines()) == 1
    assert f"/{op['targetAgentSessionId']}/" in str(children[0])
    with pytest.raises(ApiError):
        c.call("session.get", {"workspaceId": WS, "agentSessionId": op["targetAgentSessionId"]})
    # The source forks on once the point is off.
    assert until_terminal(c, fork(c, sid, turns[0]["turnId"])[1])["status"] == "committed"


def test_claude_child_whose_source_transcript_vanished_is_refused_adoption_typed(
    own_claude_daemon: tuple[DaemonProcess, MessagesServer], tmp_path: Path
) -> None:
    """An `unknown` fork's child, next to a source whose transcript then vanished (removed by
    hand): its boundary cannot be planned again, so `adopt` is refused in words, typed (not the
    worker's internal-error path), the operation stays `unknown`, and `abandon` still
    quarantines the child."""
    d, _ = own_claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    provider_id = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"][
        "providerSessionId"
    ]
    (source,) = d.home.glob(f"runtimes/*/{sid}/claude-config/projects/*/{provider_id}.jsonl")
    source.unlink()
    with pytest.raises(ApiError) as err:
        resolve(c, op["operationId"], "adopt")
    assert "internal error" not in str(err.value), err.value
    assert "cannot be adopted" in str(err.value) and "no transcript" in str(err.value)
    got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
    assert got["operation"]["status"] == "unknown"
    assert resolve(c, op["operationId"], "abandon")["operation"]["status"] == "abandoned"
    assert child_transcripts(d.home) == []  # quarantined, not left next to the source


def test_claude_tool_call_input_holding_typed_keys_forks_and_is_copied_byte_identical(
    claude_daemon: tuple[DaemonProcess, MessagesServer], model_reply: SwitchedReply, tmp_path: Path
) -> None:
    """Seed 000 §5: a model's `tool_use.input` is model content. One holding `messageId` and a
    canonical `turnId` neither blocks the fork (`unknown_typed_reference`) nor is rewritten in
    the child: the child's tool-call payload is the source's, byte for byte."""
    tool_input: dict[str, object] = {}

    def reply(body: dict) -> str | ToolUse:
        if tool_result(body) is not None:
            return "done with the tool"
        if last_user_text(body) == "call the tool":
            return ToolUse("lookup_reference", dict(tool_input))
        return f"echo: {last_user_text(body)}"

    model_reply.reply = reply
    d, _ = claude_daemon
    c = d.client()
    sid = create_session(c, provider="claude-code", title="t", cwd=str(tmp_path / "cwd"))[
        "agentSessionId"
    ]
    first = run_turn(c, sid, "one")
    tool_input.update({"messageId": "abc", "turnId": first["turnId"], "nested": {"turnId": "x"}})
    second = run_turn(c, sid, "call the tool")
    assert second["outcome"] == "completed", second
    source_calls = [m for m in timeline(c, sid)[1]["messages"] if m["kind"] == "tool_call"]
    assert [m["payload"]["input"] for m in source_calls] == [tool_input]
    _, op = fork(c, sid, second["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    child_calls = [
        m
        for m in timeline(c, op["session"]["agentSessionId"])[1]["messages"]
        if m["kind"] == "tool_call"
    ]
    assert [json.dumps(m["payload"], sort_keys=True) for m in child_calls] == [
        json.dumps(m["payload"], sort_keys=True) for m in source_calls
    ]
    assert [m["text"] for m in child_calls] == [m["text"] for m in source_calls]


def test_claude_turn_shown_recovery_required_is_refused_by_fork_create(
    claude_daemon: tuple[DaemonProcess, MessagesServer], tmp_path: Path
) -> None:
    """Seed 000 §3.2: one per-Turn hook decides the projected providerForkBindingState and
    what prepare accepts. A Claude binding whose schemaVersion the driver does not know is
    `recovery_required` (the driver's own decoder), and fork.create refuses that Turn."""
    d, _ = claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    store = Store.open(d.home / "store.sqlite3")
    try:
        binding = json.loads(
            store.turns.get_turn(WS, sid, turns[1]["turnId"]).provider_turn_binding_json
        )
        binding["schemaVersion"] = 99
        store.db.connection().execute(
            "UPDATE turns SET provider_turn_binding_json = ? WHERE turn_id = ?",
            (json.dumps(binding), turns[1]["turnId"]),
        )
    finally:
        store.close()
    shown = {t["turnId"]: t["providerForkBindingState"] for t in timeline(c, sid)}
    assert shown[turns[1]["turnId"]] == "recovery_required"
    assert shown[turns[0]["turnId"]] == "bound"
    with pytest.raises(ApiError) as err:
        fork(c, sid, turns[1]["turnId"])
    assert err.value.reason == "agent_session_fork_conflict"
    assert err.value.params["forkBoundaryReason"] == "provider_turn_not_bound"
    assert len(child_transcripts(d.home, provider_id_of(d, sid))) == 0


def test_claude_sidechain_in_the_boundary_is_a_descendant_lane(
    claude_daemon: tuple[DaemonProcess, MessagesServer], model_reply: SwitchedReply, tmp_path: Path
) -> None:
    """Seed 000 §4: a Task sub-agent (a Claude sidechain) is a provider-native descendant
    lane. The driver records it in the Turn's messages, so a fork whose boundary holds it is
    refused with `descendant_lane_in_boundary`; a boundary before it still forks."""

    def called_already(body: dict) -> bool:
        return any(
            isinstance(b, dict) and b.get("type") == "tool_use"
            for m in body.get("messages") or []
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"]
        )

    def reply(body: dict) -> str | ToolUse:
        if tool_result(body) is not None or called_already(body):
            return "delegated"
        text = last_user_text(body)
        if text == "delegate":
            names = [t.get("name") for t in body.get("tools") or []]
            task = next(n for n in ("Task", "Agent") if n in names)
            return ToolUse(
                task,
                {
                    "description": "look around",
                    "prompt": "sub-agent: look around",
                    "subagent_type": "general-purpose",
                    "run_in_background": False,  # a foreground sidechain of this Turn
                },
            )
        if text == "sub-agent: look around":
            return "the sub-agent looked around"
        return f"echo: {text}"

    model_reply.reply = reply
    d, server = claude_daemon
    asked = len(server.requests)
    c = d.client()
    sid = create_session(c, provider="claude-code", title="t", cwd=str(tmp_path / "cwd"))[
        "agentSessionId"
    ]
    first = run_turn(c, sid, "one")
    turn_id = submit(c, sid, "delegate")["turnId"]

    def settled_or_approved() -> dict | None:
        turn = turn_of(c, sid, turn_id)
        for i in turn.get("interactions") or []:
            if i["status"] == "pending":  # the CLI may ask before running the tool
                c.call(
                    "interaction.respond",
                    {
                        "workspaceId": WS,
                        "agentSessionId": sid,
                        "turnId": turn_id,
                        "requestId": i["requestId"],
                        "response": {"decision": "approve"},
                    },
                )
        return turn if turn["phase"] == "settled" else None

    try:
        second = wait_for(settled_or_approved, 40)
    except AssertionError:
        for r in server.requests[asked:]:
            if isinstance(r, dict):
                print("REQ", json.dumps(r.get("messages"))[-600:])
            else:
                print("REQ", r)
        print("TURN", json.dumps(turn_of(c, sid, turn_id))[:3000])
        raise
    assert second["outcome"] == "completed", second
    assert any("sub-agent: look around" in json.dumps(r) for r in server.requests[asked:]), (
        "the sub-agent never ran"
    )
    lanes = [m for m in second["messages"] if m["kind"] == "descendant_lane"]
    assert lanes and lanes[0]["payload"]["descendantLane"] is True
    with pytest.raises(ApiError) as err:
        fork(c, sid, turn_id)
    assert err.value.params["forkBoundaryReason"] == "descendant_lane_in_boundary"
    _, op = fork(c, sid, first["turnId"])
    assert until_terminal(c, op)["status"] == "committed"


def test_a_turn_after_the_sessions_transcript_vanished_fails_typed_not_a_fresh_history(
    claude_daemon: tuple[DaemonProcess, MessagesServer], tmp_path: Path
) -> None:
    """A Claude Session with settled, bound Turns whose transcript then vanished (removed by
    hand): its next Turn cannot resume the conversation. It fails typed
    (`provider_history_missing`, naming the transcript), the model is not called, and no new
    transcript is started under the Session's id, rather than a fresh history the model
    answers from without the conversation and nobody is told."""
    d, server = claude_daemon
    c = d.client()
    sid = create_session(c, provider="claude-code", title="c", cwd=str(tmp_path / "cwd"))[
        "agentSessionId"
    ]
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    provider_id = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"][
        "providerSessionId"
    ]
    (source,) = d.home.glob(f"runtimes/*/{sid}/claude-config/projects/*/{provider_id}.jsonl")
    source.unlink()
    asked = len(server.requests)
    second = run_turn(c, sid, "two")
    assert second["outcome"] == "failed", second
    assert second["errorReason"] == "provider_history_missing", second
    assert provider_id in second["error"], second
    assert [last_user_text(b) for b in server.requests[asked:]] == []  # the model never asked
    assert not source.exists()  # no fresh history under the Session's id
