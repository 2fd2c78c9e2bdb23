"""A `thread/resume` that leaves the turns out answers from the rollout's head: the same thread
object the whole history projects (settings, preview, ids), the history loaded right after the
answer, and a history that cannot be loaded still refused — by the next request about it."""

from __future__ import annotations

import json
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
from tests.tutti_agent.items import assistant_msg, env_context, explicit_turn, user_msg
from tests.tutti_agent.storeutil import write_root
from tutti_agent.fork import ForkOptions, ForkPersistence, ForkService, Latest, ThroughTurn
from tutti_agent.rollout import LineType, RolloutItem, iter_rollout_paths
from tutti_agent.store import HEAD_PREVIEW_LINES, ThreadStore
from tutti_agent.wire import (
    LeanTurns,
    encode_message,
    head_to_wire,
    lean_turns_to_wire,
    thread_to_wire,
)

pytestmark = pytest.mark.timeout(60)


def _settings(**ts: Any) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG,
        {"type": "thread_settings_applied", "thread_id": "x", "thread_settings": ts},
    )


def _same_as_whole(store: ThreadStore, thread_id: str) -> dict[str, Any]:
    """The head's thread object, checked equal to the whole history's (no turns)."""
    head = store.head(thread_id)
    assert head is not None
    whole = store.load(thread_id)
    assert head.settings == whole.effective_settings()
    expected = thread_to_wire(whole, status="idle", include_turns=False)
    assert head_to_wire(head, status="idle") == expected
    return expected


def test_the_head_answers_what_the_whole_history_does(tmp_path: Path) -> None:
    """Settings from the last line that names each (a later line with only `model` leaves an
    earlier `cwd` in force), the bytes `thread_settings_applied` inside a message or as a
    nested item's type passed over, the preview past contextual fragments, a torn tail unread."""
    store = ThreadStore(tmp_path / "home")
    quoted = 'look: {"type":"thread_settings_applied","thread_settings":{"cwd":"/evil"}}'
    tid = write_root(
        store,
        [
            _settings(cwd="/a", model="m1"),
            env_context(),
            user_msg("first real question"),
            *explicit_turn("t1", "q", "a"),
            _settings(model="m2"),
            assistant_msg(quoted),
            RolloutItem(
                LineType.EVENT_MSG,
                {
                    "type": "item_completed",
                    "item": {"type": "thread_settings_applied", "thread_settings": {"cwd": "/x"}},
                },
            ),
            user_msg(quoted),
        ],
    )
    path = store.path_of(tid)
    with open(path, "ab") as f:  # a write cut by a crash, naming the settings event
        f.write(b'{"timestamp":"x","ordinal":99,"type":"event_msg","payload":{"type":"thread_se')
        f.write(b'ttings_applied","thread_settings":{"cwd":"/torn"')
    thread = _same_as_whole(ThreadStore(store.home), tid)
    seen = (thread["cwd"], thread["model"], thread["preview"])
    assert seen == ("/a", "m2", "first real question")


def test_the_head_of_a_thread_without_settings_lines_or_user_messages(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path / "home")
    empty = write_root(store, [])
    assert _same_as_whole(store, empty)["preview"] == ""
    quiet = write_root(store, [assistant_msg("x")] * (HEAD_PREVIEW_LINES + 5))
    assert store.head(quiet) is None  # no user message near the head: read whole
    late = write_root(store, [assistant_msg("x")] * 3 + [user_msg("late")])
    assert _same_as_whole(store, late)["preview"] == "late"


def test_a_referenced_child_and_a_foreign_first_line_are_read_whole(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path / "home")
    src = write_root(store, [user_msg("q"), *explicit_turn("t1", "q", "a")])
    forks = ForkService(store)
    referenced = ForkOptions(boundary=Latest(), persistence=ForkPersistence.REFERENCED)
    child = forks.fork(src, referenced).child
    assert store.head(child.thread_id) is None  # its preview lies in the source
    copied = forks.fork(src, ForkOptions(boundary=Latest(), cwd="/child")).child
    assert _same_as_whole(store, copied.thread_id)["cwd"] == "/child"
    path = store.path_of(src)
    lines = path.read_bytes().split(b"\n")
    first = json.loads(lines[0])
    first["payload"]["id"] = copied.thread_id
    path.write_bytes(b"\n".join([json.dumps(first).encode(), *lines[1:]]))
    assert store.head(src) is None  # `load` names what is wrong with it


def test_resume_answers_from_the_head_then_loads_the_thread(tmp_path: Path) -> None:
    """Over the real app-server: the lean resume's thread equals the full resume's but for its
    turns; the thread is loaded (a turn runs on it) and its turns read as before."""
    first = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    first.initialize()
    tid = first.start_thread(str(tmp_path))
    first.run_turn(tid, "one")
    first.run_turn(tid, "two")
    assert first.close() == 0
    second = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    try:
        second.initialize()
        lean = second.call("thread/resume", {"threadId": tid, "excludeTurns": True})
        assert lean["thread"]["turns"] == []
        assert tid in second.call("thread/loaded/list", {})["data"]
        full = second.call("thread/resume", {"threadId": tid})
        assert {**full, "thread": {**full["thread"], "turns": []}} == lean
        assert [t["status"] for t in full["thread"]["turns"]] == ["completed", "completed"]
        assert agent_texts(second.run_turn(tid, "three")) == ["echo: three"]
    finally:
        second.close()


def test_a_history_that_cannot_load_is_refused_after_a_lean_resume(tmp_path: Path) -> None:
    """A corrupt line in the middle: the lean resume answers from the head, the deferred load
    fails, and the thread stays unloaded — `turn/start` answers the corruption (not `thread not
    found`), and the next resume reads it whole and answers it too."""
    first = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    first.initialize()
    tid = first.start_thread(str(tmp_path))
    first.run_turn(tid, "one")
    first.run_turn(tid, "two")
    assert first.close() == 0
    [path] = list(iter_rollout_paths(tmp_path / "tutti-home"))
    lines = path.read_bytes().split(b"\n")
    lines[-3] = b"{not json"
    path.write_bytes(b"\n".join(lines))
    second = AppServerProcess(TUTTI_AGENT, tutti_env(tmp_path))
    try:
        second.initialize()
        assert second.call("thread/resume", {"threadId": tid, "excludeTurns": True})
        assert tid not in second.call("thread/loaded/list", {})["data"]
        with pytest.raises(RpcError, match="corrupt rollout line"):
            second.start_turn(tid, "three")
        with pytest.raises(RpcError, match="corrupt rollout line"):
            second.call("thread/resume", {"threadId": tid, "excludeTurns": True})
    finally:
        second.close()


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        'quo"te \\ back',
        "ctl \x00\x01\x1f\x7f \n\r\t\b\f",
        "ünï ☃ 𝄞 \u2028\u2029",
        "\ud800",
    ],
)
def test_lean_turns_encode_as_the_standard_library_does(text: str) -> None:
    """orjson's text of a lean turn list is the standard library's, escapes included; a value
    orjson refuses (a lone surrogate, an integer beyond 64 bits) is left to the standard
    library; a message without lean turns is the standard library's alone."""
    turns = LeanTurns(
        [
            {"id": text, "items": [], "status": "completed", "error": {"message": text}},
            {"id": "t2", "startedAt": 2**70 if text == "plain" else 1, "error": None},
        ]
    )
    thread = {"id": text, "model": 1.5, "cwd": float("nan"), "turns": turns}
    message = {"id": 7, "result": {"thread": thread, "model": text}}
    standard = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    assert encode_message(message) == standard
    plain = {"id": 7, "result": {"thread": {**thread, "turns": list(turns)}}}
    assert encode_message(plain) == json.dumps(plain, separators=(",", ":"), ensure_ascii=False)


def test_an_unopened_fork_is_answered_as_its_child_reads(
    tutti_server: Callable[..., AppServerProcess], tmp_path: Path
) -> None:
    """`loaded: false` through a settled turn (its prefix copied as bytes, none of its lines
    built): the answer's thread is the one `thread/read` then projects of the child, turns
    (lean and full) included."""
    server = tutti_server()
    src = server.start_thread(str(tmp_path))
    server.run_turn(src, "one")
    server.run_turn(src, "two")
    last = server.call("thread/turns/list", {"threadId": src})["data"][0]["id"]
    for items in (False, True):
        params = {"threadId": src, "lastTurnId": last, "loaded": False, "turnItems": items}
        child = server.call("thread/fork", params)["thread"]
        read = server.call(
            "thread/read", {"threadId": child["id"], "includeTurns": True, "turnItems": items}
        )["thread"]
        assert child == read and child["preview"] == "one" and len(child["turns"]) == 2


def test_the_same_reduction_is_projected_and_encoded_once(tmp_path: Path) -> None:
    """A source's read and its fork through the last turn answer the very reduction the store
    keeps: projected without items once, its text encoded once, the answers the standard
    library's text each time; another reduction is projected anew."""
    store = ThreadStore(tmp_path / "home")
    src = write_root(store, [*explicit_turn("t1", "q", "a"), *explicit_turn("t2", "r", "b")])
    reduced = store.turns(store.load(src), with_items=False)
    wire = lean_turns_to_wire(reduced)
    assert lean_turns_to_wire(reduced) is wire
    fork = ForkService(store).fork(
        src, ForkOptions(boundary=ThroughTurn("t2"), keep_child_parse=False, turn_items=False)
    )
    assert fork.turns is reduced
    first = ForkService(store).fork(
        src, ForkOptions(boundary=ThroughTurn("t1"), keep_child_parse=False, turn_items=False)
    )
    assert first.turns is not None and [t.id for t in first.turns] == ["t1"]
    assert lean_turns_to_wire(first.turns) is not wire
    again = lean_turns_to_wire(reduced)  # projected anew: the last one was another's
    assert again is not wire and again == wire
    message = {"id": 1, "result": {"thread": {"id": src, "turns": again}}}
    standard = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    assert encode_message(message) == standard and again.encoded is not None
    assert encode_message(message) == standard
