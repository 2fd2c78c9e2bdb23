"""The real `tutti-agent app-server` subprocess over stdio: handshake, turns with every
directive, interactions, interrupts, fork through a turn, errors, restart and crashes."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.tutti_agent.appserver import (
    TUTTI_AGENT,
    AppServerProcess,
    RpcError,
    agent_texts,
    tutti_env,
)
from tutti_agent.rollout import iter_rollout_paths, read_rollout

pytestmark = pytest.mark.timeout(60)

Start = Callable[..., AppServerProcess]
HOLD = "/slow 60000 held"  # keeps a turn in progress until it is interrupted


def _answer(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    if method == "item/commandExecution/requestApproval":
        return {"decision": "decline" if "nope" in params["command"] else "accept"}
    if method == "item/tool/requestUserInput":
        return {
            "answers": {"answer": {"answers": [f"answer to {params['questions'][0]['question']}"]}}
        }
    return None


def _turn_ids(server: AppServerProcess, thread_id: str) -> list[str]:
    data = server.call("thread/turns/list", {"threadId": thread_id, "sortDirection": "asc"})
    return [t["id"] for t in data["data"]]


def test_second_initialize_is_rejected(tutti_server: Start) -> None:
    server = tutti_server()  # the fixture already completed the handshake
    with pytest.raises(RpcError, match="Already initialized"):
        server.call("initialize", {"clientInfo": {"name": "x", "version": "1"}})


def test_user_agent_names_tutti_agent_and_version(tmp_path: Path) -> None:
    server = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    try:
        result = server.initialize()
        match = re.fullmatch(
            r"tutti_agent/(\d+)\.(\d+)\.(\d+) \([^;]+; [^)]+\)", result["userAgent"]
        )
        assert match, result["userAgent"]
        assert tuple(int(x) for x in match.groups()) >= (0, 0, 10)
    finally:
        server.close()


def test_request_before_initialize_is_rejected(tmp_path: Path) -> None:
    server = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    try:
        with pytest.raises(RpcError, match="Not initialized"):
            server.call("thread/start", {"cwd": str(tmp_path)})
    finally:
        server.close()


def test_missing_tutti_agent_home_exits_with_usage_error(tmp_path: Path) -> None:
    env = tutti_env(tmp_path)
    del env["TUTTI_AGENT_HOME"]
    server = AppServerProcess(TUTTI_AGENT, env)
    assert server.close() == 2
    assert "TUTTI_AGENT_HOME" in "".join(server.stderr_lines)


def test_thread_start_creates_uuidv7_thread_with_session_meta_rollout(
    tutti_server: Start, tmp_path: Path
) -> None:
    server = tutti_server()
    result = server.call("thread/start", {"cwd": str(tmp_path)})
    thread = result["thread"]
    assert uuid.UUID(thread["id"]).version == 7
    assert thread["forkedFromId"] is None and thread["turns"] == []
    path = Path(thread["path"])
    assert path.is_relative_to(tmp_path / "tutti-home" / "sessions")
    assert re.fullmatch(
        rf"rollout-\d{{4}}-\d\d-\d\dT\d\d-\d\d-\d\d-{thread['id']}\.jsonl", path.name
    )
    first = read_rollout(path)[0]
    assert first.ordinal == 0 and first.item.type == "session_meta"
    assert first.item.payload["id"] == thread["id"]
    assert server.wait_notification("thread/started")["thread"]["id"] == thread["id"]


def test_plain_turn_replies_echo_and_streams_codex_notifications(
    tutti_server: Start, tmp_path: Path
) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    turn_id = server.start_turn(tid, "hello")
    started = server.wait_notification("turn/started")
    assert started["turn"]["id"] == turn_id and started["turn"]["status"] == "inProgress"
    seen: list[tuple[str, str]] = []
    while True:
        msg = server.notifications.get(timeout=30)
        if msg["method"] in ("item/started", "item/completed"):
            assert msg["params"]["turnId"] == turn_id and msg["params"]["threadId"] == tid
            seen.append((msg["method"], msg["params"]["item"]["type"]))
        if msg["method"] == "turn/completed":
            turn = msg["params"]["turn"]
            break
    assert seen == [
        ("item/started", "userMessage"),
        ("item/completed", "userMessage"),
        ("item/started", "agentMessage"),
        ("item/completed", "agentMessage"),
    ]
    assert turn["status"] == "completed" and agent_texts(turn) == ["echo: hello"]


def test_tool_directive_emits_reasoning_tool_call_and_echo_of_tool_name(
    tutti_server: Start, tmp_path: Path
) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    turn = server.run_turn(tid, "/tool grep -n foo")
    kinds = [i["type"] for i in turn["items"]]
    assert kinds == ["userMessage", "reasoning", "dynamicToolCall", "agentMessage"]
    call = turn["items"][2]
    assert (call["tool"], call["arguments"], call["status"]) == ("grep", "-n foo", "completed")
    assert call["contentItems"][0]["text"]
    assert agent_texts(turn) == ["echo: grep"]


def test_approve_directive_approved_and_declined(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server(on_server_request=_answer)
    tid = server.start_thread(str(tmp_path))
    ok = server.run_turn(tid, "/approve make test")
    assert agent_texts(ok) == ["approved: make test"]
    assert [i["status"] for i in ok["items"] if i["type"] == "commandExecution"] == ["completed"]
    no = server.run_turn(tid, "/approve rm nope")
    assert agent_texts(no) == ["declined: rm nope"]
    assert [i["status"] for i in no["items"] if i["type"] == "commandExecution"] == ["declined"]
    req = server.server_requests.get(timeout=5)
    assert req["method"] == "item/commandExecution/requestApproval"
    assert req["params"]["threadId"] == tid and req["params"]["command"] == "make test"


def test_ask_directive_answer_becomes_the_reply(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server(on_server_request=_answer)
    tid = server.start_thread(str(tmp_path))
    turn = server.run_turn(tid, "/ask which color?")
    assert agent_texts(turn) == ["answer to which color?"]
    req = server.server_requests.get(timeout=5)
    assert req["method"] == "item/tool/requestUserInput"
    assert req["params"]["questions"][0]["question"] == "which color?"


def test_fail_directive_ends_turn_failed_with_message(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    turn = server.run_turn(tid, "/fail the disk is on fire")
    assert turn["status"] == "failed"
    assert turn["error"] == {"message": "the disk is on fire"}
    listed = server.call("thread/turns/list", {"threadId": tid})["data"][0]
    assert (listed["status"], listed["error"]) == ("failed", {"message": "the disk is on fire"})


def test_slow_turn_stays_in_progress_until_interrupted(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    turn_id = server.start_turn(tid, HOLD)
    server.wait_notification("turn/started")
    listed = server.call("thread/turns/list", {"threadId": tid})["data"][0]
    assert (listed["id"], listed["status"]) == (turn_id, "inProgress")
    with pytest.raises(RpcError, match="already has an active turn"):
        server.start_turn(tid, "second")
    assert server.call("turn/interrupt", {"threadId": tid, "turnId": turn_id}) == {}
    turn = server.wait_turn_completed(turn_id)
    assert turn["status"] == "interrupted" and agent_texts(turn) == []
    assert server.run_turn(tid, "after")["status"] == "completed"


def test_slow_directive_replies_with_rest_after_delay(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    assert agent_texts(server.run_turn(tid, "/slow 20 the rest")) == ["echo: the rest"]


def test_interrupt_while_waiting_for_approval_resolves_the_request(
    tutti_server: Start, tmp_path: Path
) -> None:
    server = tutti_server()  # never answers server requests
    tid = server.start_thread(str(tmp_path))
    turn_id = server.start_turn(tid, "/approve deploy")
    req = server.server_requests.get(timeout=30)
    server.call("turn/interrupt", {"threadId": tid, "turnId": turn_id})
    resolved = server.wait_notification("serverRequest/resolved")
    assert resolved == {"threadId": tid, "requestId": req["id"]}
    assert server.wait_turn_completed(turn_id)["status"] == "interrupted"


def test_turns_on_different_threads_run_concurrently(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    a = server.start_thread(str(tmp_path))
    b = server.start_thread(str(tmp_path))
    held = server.start_turn(a, "/ask hold on")
    server.server_requests.get(timeout=30)
    assert agent_texts(server.run_turn(b, "meanwhile")) == ["echo: meanwhile"]
    server.call("turn/interrupt", {"threadId": a, "turnId": held})
    assert server.wait_turn_completed(held)["status"] == "interrupted"


def test_fork_through_turn_two_keeps_source_turn_ids(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    for text in ("one", "two", "three"):
        server.run_turn(src, text)
    t1, t2, t3 = _turn_ids(server, src)
    source_bytes = Path(
        server.call("thread/read", {"threadId": src})["thread"]["path"]
    ).read_bytes()
    fork = server.call("thread/fork", {"threadId": src, "lastTurnId": t2})["thread"]
    assert fork["id"] != src and fork["forkedFromId"] == src
    assert [t["id"] for t in fork["turns"]] == [t1, t2]
    assert [t["status"] for t in fork["turns"]] == ["completed", "completed"]
    # Copied by default: one self-contained child rollout in the same home.
    meta = read_rollout(Path(fork["path"]))[0].item.payload
    assert meta["forked_from_id"] == src and meta.get("history_base") is None
    # excludeTurns: no turns in the response; turns/list has them in order.
    lean = server.call("thread/fork", {"threadId": src, "lastTurnId": t2, "excludeTurns": True})
    assert lean["thread"]["turns"] == []
    assert _turn_ids(server, lean["thread"]["id"]) == [t1, t2]
    # The child runs its own turns; the source is unchanged.
    assert agent_texts(server.run_turn(fork["id"], "four")) == ["echo: four"]
    assert _turn_ids(server, fork["id"])[:2] == [t1, t2]
    assert _turn_ids(server, src) == [t1, t2, t3]
    path = Path(server.call("thread/read", {"threadId": src})["thread"]["path"])
    assert path.read_bytes() == source_bytes


def test_fork_left_unloaded_is_answered_written_and_not_opened(
    tutti_server: Start, tmp_path: Path
) -> None:
    """`loaded: false`: the child is durable and answered as by a loaded fork, but this server
    never opens it: status `notLoaded`, no `thread/started`, not in `thread/loaded/list`, and
    `thread/unsubscribe` finds nothing; a `thread/resume` loads it like any thread on disk."""
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    [t1] = _turn_ids(server, src)
    fork = server.call("thread/fork", {"threadId": src, "lastTurnId": t1, "loaded": False})
    child = fork["thread"]
    assert child["forkedFromId"] == src and [t["id"] for t in child["turns"]] == [t1]
    assert child["status"] == {"type": "notLoaded"}
    assert Path(child["path"]).is_file()
    loaded = server.call("thread/loaded/list", {})["data"]
    assert src in loaded and child["id"] not in loaded
    assert server.call("thread/unsubscribe", {"threadId": child["id"]}) == {"status": "notLoaded"}
    # A loaded fork announces its child; the unloaded one above announced nothing before it.
    other = server.call("thread/fork", {"threadId": src, "lastTurnId": t1})["thread"]
    started = server.wait_notification("thread/started", lambda p: p["thread"]["id"] != src)
    assert started["thread"]["id"] == other["id"]
    with pytest.raises(RpcError):
        server.call("thread/fork", {"threadId": src, "lastTurnId": t1, "loaded": "no"})
    resumed = server.call("thread/resume", {"threadId": child["id"]})["thread"]
    assert [t["id"] for t in resumed["turns"]] == [t1]
    assert agent_texts(server.run_turn(child["id"], "two")) == ["echo: two"]


def test_turns_without_items_are_the_same_turns_with_no_items(
    tutti_server: Start, tmp_path: Path
) -> None:
    """`turnItems: false` on `thread/read`, `thread/resume` and `thread/fork`: the very turns
    the full answer lists (ids, statuses, errors, times), each with `items: []` and
    `itemsView: "notLoaded"`; a full read after it still lists every item; anything but a
    boolean is refused."""
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    server.run_turn(src, "/fail broken")
    server.run_turn(src, "three")

    def bare(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in t.items() if k not in ("items", "itemsView")} for t in turns]

    full = server.call("thread/read", {"threadId": src, "includeTurns": True})["thread"]["turns"]
    assert len(full) == 3 and all(t["items"] and t["itemsView"] == "full" for t in full)
    assert [t["status"] for t in full] == ["completed", "failed", "completed"]
    lean = server.call("thread/read", {"threadId": src, "includeTurns": True, "turnItems": False})[
        "thread"
    ]["turns"]
    assert bare(lean) == bare(full)
    assert all(t["items"] == [] and t["itemsView"] == "notLoaded" for t in lean)
    # The reduction kept for the lean read does not stand in for a full one.
    again = server.call("thread/read", {"threadId": src, "includeTurns": True})["thread"]["turns"]
    assert again == full
    resumed = server.call("thread/resume", {"threadId": src, "turnItems": False})["thread"]
    assert bare(resumed["turns"]) == bare(full)
    assert all(t["items"] == [] for t in resumed["turns"])
    last = full[-1]["id"]
    child = server.call(
        "thread/fork", {"threadId": src, "lastTurnId": last, "loaded": False, "turnItems": False}
    )["thread"]
    assert bare(child["turns"]) == bare(full)
    assert all(t["items"] == [] and t["itemsView"] == "notLoaded" for t in child["turns"])
    # The child on disk holds every item: a full read of it lists them.
    read_child = server.call("thread/read", {"threadId": child["id"], "includeTurns": True})
    assert read_child["thread"]["turns"] == full
    for method, params in (
        ("thread/read", {"threadId": src, "includeTurns": True, "turnItems": "no"}),
        ("thread/fork", {"threadId": src, "lastTurnId": last, "turnItems": 0}),
    ):
        with pytest.raises(RpcError):
            server.call(method, params)


def test_a_thread_read_after_an_append_reduces_the_grown_rollout(
    tutti_server: Start, tmp_path: Path
) -> None:
    """The store keeps a thread's reduction with its parse: a Turn appended since the last read
    shows in the next one (lean and full alike)."""
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    for turn_items in (False, True):
        before = server.call(
            "thread/read", {"threadId": src, "includeTurns": True, "turnItems": turn_items}
        )["thread"]["turns"]
        server.run_turn(src, f"more {turn_items}")
        after = server.call(
            "thread/read", {"threadId": src, "includeTurns": True, "turnItems": turn_items}
        )["thread"]["turns"]
        assert [t["id"] for t in after[:-1]] == [t["id"] for t in before]
        assert len(after) == len(before) + 1


def test_referenced_fork_option_writes_codex_like_child(
    tutti_server: Start, tmp_path: Path
) -> None:
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    server.run_turn(src, "two")
    t1, _ = _turn_ids(server, src)
    child = server.call(
        "thread/fork", {"threadId": src, "lastTurnId": t1, "persistence": "referenced"}
    )["thread"]
    first = read_rollout(Path(child["path"]))[0]
    assert first.item.payload["forked_from_id"] == src
    assert first.ordinal == first.item.payload["forked_from_ordinal_exclusive"] > 0
    assert first.item.payload["history_base"]["thread_id"] == src
    assert [t["id"] for t in child["turns"]] == [t1]
    with pytest.raises(RpcError, match="forked history still references it"):
        server.call("thread/delete", {"threadId": src})


def test_fork_before_turn_and_truncation_options(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    for text in ("one", "two", "three"):
        server.run_turn(src, text)
    t1, t2, _ = _turn_ids(server, src)
    before = server.call("thread/fork", {"threadId": src, "beforeTurnId": t2})["thread"]
    assert [t["id"] for t in before["turns"]] == [t1]
    trunc = server.call(
        "thread/fork",
        {"threadId": src, "snapshot": {"type": "truncateBeforeNthUserMessage", "n": 2}},
    )["thread"]
    assert [t["id"] for t in trunc["turns"]] == [t1, t2]
    with pytest.raises(RpcError, match="mutually exclusive"):
        server.call("thread/fork", {"threadId": src, "beforeTurnId": t2, "lastTurnId": t1})


def test_fork_errors_use_codex_messages(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    held = server.start_turn(src, HOLD)
    server.wait_notification("turn/started")
    cases = [
        ({"threadId": src, "lastTurnId": "nope"}, "turn not found: nope"),
        (
            {"threadId": src, "lastTurnId": held},
            f"lastTurnId '{held}' identifies an in-progress turn",
        ),
        (
            {"threadId": "019a0000-0000-7000-8000-000000000000"},
            "no rollout found for thread id 019a0000-0000-7000-8000-000000000000",
        ),
    ]
    for params, message in cases:
        with pytest.raises(RpcError) as err:
            server.call("thread/fork", params)
        assert (err.value.code, err.value.message) == (-32600, message)
    with pytest.raises(RpcError) as err:
        server.call("thread/fork", {"threadId": "nope"})
    assert err.value.code == -32600 and err.value.message.startswith("invalid session id: ")
    # Latest while mid-turn: the child closes the running turn as interrupted.
    child = server.call("thread/fork", {"threadId": src})["thread"]
    assert [t["status"] for t in child["turns"]] == ["completed", "interrupted"]
    assert child["turns"][-1]["id"] == held
    server.call("turn/interrupt", {"threadId": src, "turnId": held})
    server.wait_turn_completed(held)


def test_unknown_threads_and_turns_are_rejected(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    ghost = "019a0000-0000-7000-8000-000000000000"
    for method, message in [
        ("turn/start", f"thread not found: {ghost}"),
        ("thread/read", f"thread not loaded: {ghost}"),
        ("thread/turns/list", f"thread not loaded: {ghost}"),
        ("thread/resume", f"no rollout found for thread id {ghost}"),
    ]:
        params: dict[str, Any] = {"threadId": ghost}
        if method == "turn/start":
            params["input"] = [{"type": "text", "text": "x", "text_elements": []}]
        with pytest.raises(RpcError, match=re.escape(message)):
            server.call(method, params)
    tid = server.start_thread(str(tmp_path))
    with pytest.raises(RpcError, match="no active turn to interrupt"):
        server.call("turn/interrupt", {"threadId": tid, "turnId": "x"})
    with pytest.raises(RpcError) as err:
        server.call("thread/nonsense", {})
    assert err.value.code == -32601


def test_turns_list_pages_in_both_directions(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    for i in range(5):
        server.run_turn(tid, f"m{i}")
    asc = _turn_ids(server, tid)
    pages: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"threadId": tid, "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = server.call("thread/turns/list", params)
        pages += [t["id"] for t in page["data"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert pages == list(reversed(asc))  # default direction is descending, like Codex


def test_cold_resume_after_restart_keeps_thread_and_turns(tmp_path: Path) -> None:
    first = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    first.initialize()
    tid = first.start_thread(str(tmp_path))
    first.run_turn(tid, "one")
    first.run_turn(tid, "two")
    ids = _turn_ids(first, tid)
    assert first.close() == 0
    second = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    try:
        second.initialize()
        # A cold source can be forked without being resumed first.
        fork = second.call("thread/fork", {"threadId": tid, "lastTurnId": ids[0]})["thread"]
        assert [t["id"] for t in fork["turns"]] == ids[:1]
        resumed = second.call("thread/resume", {"threadId": tid})["thread"]
        assert resumed["id"] == tid and [t["id"] for t in resumed["turns"]] == ids
        assert agent_texts(second.run_turn(tid, "three")) == ["echo: three"]
    finally:
        second.close()


def test_killed_server_leaves_valid_prefix_and_fork_closes_the_turn(tmp_path: Path) -> None:
    first = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    first.initialize()
    tid = first.start_thread(str(tmp_path))
    done = first.run_turn(tid, "one")["id"]
    held = first.start_turn(tid, HOLD)
    first.wait_notification("item/completed")  # the user message is durable
    first.kill()
    lines = read_rollout(next(p for p in iter_rollout_paths(tmp_path / "tutti-home")))
    assert [line.ordinal for line in lines] == list(range(len(lines)))
    second = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    try:
        second.initialize()
        listed = second.call("thread/turns/list", {"threadId": tid, "sortDirection": "asc"})
        assert [(t["id"], t["status"]) for t in listed["data"]] == [
            (done, "completed"),
            (held, "inProgress"),
        ]
        child = second.call("thread/fork", {"threadId": tid})["thread"]
        assert [(t["id"], t["status"]) for t in child["turns"]] == [
            (done, "completed"),
            (held, "interrupted"),
        ]
    finally:
        second.close()


def test_torn_last_line_is_ignored_and_repaired_on_resume(tmp_path: Path) -> None:
    first = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    first.initialize()
    tid = first.start_thread(str(tmp_path))
    first.run_turn(tid, "one")
    path = Path(first.call("thread/read", {"threadId": tid})["thread"]["path"])
    first.close()
    with open(path, "ab") as f:
        f.write(b'{"timestamp":"x","ordinal":99,"type":"event_ms')  # a write cut by a crash
    second = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    try:
        second.initialize()
        second.call("thread/resume", {"threadId": tid})
        assert agent_texts(second.run_turn(tid, "two")) == ["echo: two"]
    finally:
        second.close()
    ordinals = [json.loads(line)["ordinal"] for line in path.read_text().splitlines()]
    assert ordinals == list(range(len(ordinals)))


def test_delete_rules_over_the_protocol(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    held = server.start_turn(tid, HOLD)
    server.wait_notification("turn/started")
    with pytest.raises(RpcError, match="a turn is in progress"):
        server.call("thread/delete", {"threadId": tid})
    server.call("turn/interrupt", {"threadId": tid, "turnId": held})
    server.wait_turn_completed(held)
    assert server.call("thread/delete", {"threadId": tid}) == {}
    assert server.wait_notification("thread/deleted") == {"threadId": tid}
    with pytest.raises(RpcError, match=f"no rollout found for thread id {tid}"):
        server.call("thread/resume", {"threadId": tid})


def test_unsubscribe_unloads_thread_until_resumed(tutti_server: Start, tmp_path: Path) -> None:
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    server.run_turn(tid, "one")
    assert server.call("thread/unsubscribe", {"threadId": tid}) == {"status": "unsubscribed"}
    assert server.call("thread/unsubscribe", {"threadId": tid}) == {"status": "notLoaded"}
    with pytest.raises(RpcError, match="thread not found"):
        server.start_turn(tid, "two")
    read = server.call("thread/read", {"threadId": tid, "includeTurns": True})["thread"]
    assert read["status"] == {"type": "notLoaded"} and len(read["turns"]) == 1
    server.call("thread/resume", {"threadId": tid})
    assert server.run_turn(tid, "two")["status"] == "completed"


def test_failpoint_after_child_write_leaves_no_child_rollout(
    tutti_server: Start, tmp_path: Path
) -> None:
    server = tutti_server(env={"TUTTI_AGENT_FAILPOINTS": "fork.after_child_write=error"})
    tid = server.start_thread(str(tmp_path))
    server.run_turn(tid, "one")
    with pytest.raises(RpcError, match="failpoint fork.after_child_write"):
        server.call("thread/fork", {"threadId": tid})
    assert len(list(iter_rollout_paths(tmp_path / "tutti-home"))) == 1
    assert server.run_turn(tid, "still fine")["status"] == "completed"


def test_fork_copies_no_running_state_and_leaves_source_turn_running(
    tutti_server: Start, tmp_path: Path
) -> None:
    server = tutti_server()  # server requests are answered by hand below
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    asking = server.start_turn(src, "/ask still there?")
    question = server.server_requests.get(timeout=30)
    child = server.call("thread/fork", {"threadId": src})["thread"]
    # The child has the turn closed as interrupted, is idle, and owes no answer.
    assert child["status"] == {"type": "idle"}
    assert [t["status"] for t in child["turns"]] == ["completed", "interrupted"]
    assert agent_texts(server.run_turn(child["id"], "child turn")) == ["echo: child turn"]
    assert server.server_requests.empty()
    # The source's waiter was not copied away: answering it completes the source turn.
    server.respond(question["id"], {"answers": {"answer": {"answers": ["yes"]}}})
    turn = server.wait_turn_completed(asking)
    assert (turn["status"], agent_texts(turn)) == ("completed", ["yes"])


def test_turn_columns_are_the_turns_ids_and_statuses_and_nothing_else(
    tutti_server: Start, tmp_path: Path
) -> None:
    """`turnColumns: true` on `thread/read` and `thread/fork` (loaded or not): `thread.turns`
    is empty and `thread.turnIds` / `thread.turnStatuses` are the full answer's ids and
    statuses in order; without `includeTurns` a read answers no columns; anything but a
    boolean is refused."""
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    server.run_turn(src, "/fail broken")
    server.run_turn(src, "three")
    full = server.call("thread/read", {"threadId": src, "includeTurns": True})["thread"]["turns"]
    ids, statuses = [t["id"] for t in full], [t["status"] for t in full]
    assert statuses == ["completed", "failed", "completed"]
    read = server.call(
        "thread/read",
        {"threadId": src, "includeTurns": True, "turnItems": False, "turnColumns": True},
    )["thread"]
    assert (read["turns"], read["turnIds"], read["turnStatuses"]) == ([], ids, statuses)
    bare = server.call("thread/read", {"threadId": src, "turnColumns": True})["thread"]
    assert bare["turns"] == [] and "turnIds" not in bare
    for loaded in (False, True):
        child = server.call(
            "thread/fork",
            {"threadId": src, "lastTurnId": ids[-1], "loaded": loaded, "turnColumns": True},
        )["thread"]
        assert (child["turns"], child["turnIds"], child["turnStatuses"]) == ([], ids, statuses)
        again = server.call("thread/read", {"threadId": child["id"], "includeTurns": True})
        assert [t["id"] for t in again["thread"]["turns"]] == ids
    with pytest.raises(RpcError, match="turnColumns must be a boolean"):
        server.call("thread/read", {"threadId": src, "includeTurns": True, "turnColumns": 1})


def test_a_line_that_is_no_utf8_is_refused_and_the_server_serves_on(
    tutti_server: Start, tmp_path: Path
) -> None:
    """A request line holding a byte that is no UTF-8 is answered `parse error` (id null), as
    any line that is no JSON text is; the lines around it are served (the server never exits
    because of a bad request)."""
    server = tutti_server()
    assert server.proc.stdin is not None
    server.proc.stdin.flush()
    server.proc.stdin.buffer.write(
        b'{"id":900,"method":"thread/loaded/list","params":{"x":"\xff"}}\n'
    )
    server.proc.stdin.buffer.flush()
    tid = server.start_thread(str(tmp_path))
    assert server.call("thread/loaded/list", {}, timeout=10)["data"] == [tid]
    assert server.proc.poll() is None


def test_a_turn_whose_text_holds_a_lone_surrogate_is_refused_not_left_running(
    tutti_server: Start, tmp_path: Path
) -> None:
    """`turn/start` text with a lone surrogate (the JSON escape `\\ud800`), which the rollout's
    UTF-8 cannot hold: refused as invalid params, nothing written; it was accepted, its
    `task_started` written, then its user message failed to encode and the Turn never ended
    (no `turn/completed`, the rollout holding a Turn in progress)."""
    server = tutti_server()
    tid = server.start_thread(str(tmp_path))
    with pytest.raises(RpcError, match="lone surrogate"):
        server.start_turn(tid, "half of a pair: \ud83d")
    assert agent_texts(server.run_turn(tid, "whole: \U0001f600")) == ["echo: whole: \U0001f600"]
    turns = server.call("thread/read", {"threadId": tid, "includeTurns": True})["thread"]["turns"]
    assert [t["status"] for t in turns] == ["completed"]
