"""A thread's outline (one pass that decodes every line and keeps none) answers what its whole
history does: the turns without items, the settings, the preview, where each settled turn ends;
a resumed source is read and forked from it without its whole parse, into the same child; any
rollout the outline does not read exactly is read whole, as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tutti_agent.store as store_module
from tests.tutti_agent.items import (
    assistant_msg,
    env_context,
    error_event,
    explicit_turn,
    session_meta,
    task_complete,
    task_started,
    turn_aborted,
    user_msg,
)
from tests.tutti_agent.storeutil import write_root
from tutti_agent.history import build_turns, is_env_context
from tutti_agent.model import BuiltinModel
from tutti_agent.outline import outline_span, read_outline
from tutti_agent.rollout import LineType, RolloutItem
from tutti_agent.server import AppServer
from tutti_agent.store import ThreadStore
from tutti_agent.wire import preview

pytestmark = pytest.mark.timeout(60)


def _settings(**ts: object) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG,
        {"type": "thread_settings_applied", "thread_id": "x", "thread_settings": ts},
    )


def _item_completed(turn_id: str | None) -> RolloutItem:
    item = {"type": "agentMessage", "id": "m", "text": "x"}
    return RolloutItem(
        LineType.EVENT_MSG, {"type": "item_completed", "turn_id": turn_id, "item": item}
    )


MIXED = [
    _settings(cwd="/a"),
    user_msg("legacy before any turn"),  # opens an implicit turn
    assistant_msg("legacy reply"),
    _item_completed(None),
    *explicit_turn("t1", "q1", "a1"),
    env_context(),
    _item_completed(None),  # outside a turn: a legacy turn of its own
    task_started("t2", 5),
    user_msg("q2"),
    error_event("boom"),
    task_complete("t2"),
    task_started("t3", 7),
    user_msg("q3"),
    task_started("t4", 9),  # t3 never ended: interrupted where t4 starts
    user_msg('{"type":"task_complete","turn_id":"t4"}'),  # only quotes an event
    turn_aborted("t4"),
    RolloutItem(LineType.EVENT_MSG, {"turn_id": "no type"}),
    _settings(model="m2"),
    *explicit_turn("t5", "q5", "a5"),
    task_started("t6", 11),  # still open at the end
    user_msg("q6"),
]


def test_the_outline_is_what_the_whole_history_reduces_to(tmp_path: Path) -> None:
    """Legacy turns, a failed turn, a turn closed by the next start, an aborted one, an open
    one, a quoted event, settings in two lines: the outline's turns are `build_turns`' without
    items, its settings, preview and environment context the whole history's, and each
    terminal event's end the byte offset the parse gives it."""
    store = ThreadStore(tmp_path / "home")
    src = write_root(store, MIXED)
    whole = store.load(src)
    outline = read_outline(whole.path, src)
    assert outline is not None
    assert outline.turns == tuple(build_turns(whole.items, with_items=False))
    assert [t.status for t in outline.turns][-4:] == [
        "interrupted",
        "interrupted",
        "completed",
        "inProgress",
    ]
    assert outline.head.settings == whole.effective_settings() == {
        "cwd": "/a",
        "model": "m2",
        "model_provider": "tutti",
    }
    assert outline.head.preview == preview(whole) == "legacy before any turn"
    assert outline.has_env_context == any(map(is_env_context, whole.items))
    assert outline.line_count == whole.next_ordinal
    assert outline.first_end == whole.lines[0].end_byte_offset
    terminal = {
        i + 1: line.end_byte_offset
        for i, line in enumerate(whole.lines)
        if line.item.event_type in ("task_complete", "turn_aborted")
    }
    assert dict(outline.settled_ends) == terminal


def test_a_rollout_the_outline_does_not_read_exactly_is_left_to_the_whole_read(
    tmp_path: Path,
) -> None:
    """A corrupt line, an ordinal out of order, a payload that is no object, a malformed
    settings line, another thread's `session_meta` first: no outline (the whole read names
    what is wrong); a torn last line is left out, as the whole read leaves it."""
    store = ThreadStore(tmp_path / "home")
    src = write_root(store, [*explicit_turn("t1", "q", "a"), *explicit_turn("t2", "r", "b")])
    path = store.path_of(src)
    good = path.read_bytes()
    lines = good.split(b"\n")[:-1]

    def with_line(at: int, raw: bytes) -> bytes:
        return b"\n".join([*lines[:at], raw, *lines[at + 1 :]]) + b"\n"

    def edited(at: int, **change: object) -> bytes:
        obj = json.loads(lines[at])
        obj.update(change)
        return with_line(at, json.dumps(obj).encode())

    for bad in (
        with_line(3, b"{not json"),
        edited(3, ordinal=7),
        edited(3, payload=[1]),
        edited(
            3,
            type="event_msg",
            payload={"type": "thread_settings_applied", "thread_settings": [1]},
        ),
        edited(0, payload={"id": "another"}),
    ):
        path.write_bytes(bad)
        assert read_outline(path, src) is None
    path.write_bytes(good + b'{"torn')
    torn = read_outline(path, src)
    assert torn is not None and torn.line_count == len(lines)
    assert [t.id for t in torn.turns] == ["t1", "t2"]


def test_an_inner_session_meta_is_never_copied_from_an_outline(tmp_path: Path) -> None:
    """A `session_meta` after the first line inside the prefix: the outline copies no span
    (the whole history's fork encodes the prefix again, as before)."""
    store = ThreadStore(tmp_path / "home")
    src = write_root(store, [*explicit_turn("t1", "q", "a"), session_meta("x")])
    src2 = write_root(store, [session_meta("x"), *explicit_turn("t1", "q", "a")])
    first = read_outline(store.path_of(src), src)
    second = read_outline(store.path_of(src2), src2)
    assert first is not None and second is not None
    assert outline_span(first, max(first.settled_ends)) is not None  # the meta lies after it
    assert outline_span(second, max(second.settled_ends)) is None


def _serve(home: Path) -> tuple[AppServer, list[dict[str, object]]]:
    import io

    class Out(io.StringIO):
        answers: list[dict[str, object]] = []

        def write(self, text: str) -> int:
            for line in text.splitlines():
                self.answers.append(json.loads(line))
            return len(text)

    out = Out()
    out.answers = []
    server = AppServer(ThreadStore(home), BuiltinModel(), out)
    server.handle_line(json.dumps({"id": 0, "method": "initialize", "params": {}}))
    return server, out.answers


def _ask(
    server: AppServer, answers: list[dict[str, object]], method: str, params: object
) -> object:
    server.handle_line(json.dumps({"id": len(answers) + 1, "method": method, "params": params}))
    answer = answers[-1]
    assert "result" in answer, answer
    return answer["result"]


def test_a_resumed_source_is_read_and_forked_without_its_whole_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a host asks of a source it forks — the lean resume, `thread/read` without items,
    `thread/fork` of an unopened child through its last turn — parses none of its history
    whole (`read_rollout`): the answers and the child are those of a server that reads it
    whole; the child then reads as the source's prefix."""
    store = ThreadStore(tmp_path / "home")
    src = write_root(store, [*explicit_turn("t1", "q1", "a1"), *explicit_turn("t2", "q2", "a2")])
    whole_reads: list[Path] = []
    real = store_module.read_rollout

    def counted(path: Path) -> object:
        whole_reads.append(path)
        return real(path)

    def ask_all(server: AppServer, answers: list[dict[str, object]]) -> list[object]:
        got = [_ask(server, answers, "thread/resume", {"threadId": src, "excludeTurns": True})]
        for t in list(__import__("threading").enumerate()):
            if t.name.startswith("prewarm"):
                t.join()
        lean = {"includeTurns": True, "turnItems": False}
        got.append(_ask(server, answers, "thread/read", {"threadId": src, **lean}))
        fork = {"threadId": src, "lastTurnId": "t2", "loaded": False, "turnItems": False}
        got.append(_ask(server, answers, "thread/fork", fork))
        return got

    monkeypatch.setattr(store_module, "read_rollout", counted)
    server, answers = _serve(tmp_path / "home")
    outlined = ask_all(server, answers)
    assert whole_reads == []  # the source was read from its outline only
    assert [t["id"] for t in outlined[1]["thread"]["turns"]] == ["t1", "t2"]  # type: ignore[index]
    child = outlined[2]["thread"]  # type: ignore[index]
    server.shutdown()

    # The whole history's answers (the outline refused): the same but for the child's identity.
    monkeypatch.setattr(store_module, "read_outline", lambda path, thread_id: None)
    server, answers = _serve(tmp_path / "home")
    whole = ask_all(server, answers)
    assert whole_reads  # read whole this time
    assert outlined[:2] == whole[:2]
    other = whole[2]["thread"]  # type: ignore[index]
    same = ("id", "sessionId", "path", "createdAt", "updatedAt")
    assert {k: v for k, v in child.items() if k not in same} == {
        k: v for k, v in other.items() if k not in same
    }
    server.shutdown()
    reader = ThreadStore(tmp_path / "home")
    a, b = reader.load(child["id"]), reader.load(other["id"])
    # The copied prefix, then the child's own settings line (naming its own id).
    assert [line.item for line in a.lines[1:-1]] == [line.item for line in b.lines[1:-1]]
    assert a.lines[-1].item.payload["thread_id"] == child["id"]
    assert len(a.lines) == len(b.lines) == 10
    assert [t.id for t in reader.turns(a)] == ["t1", "t2"]
    read = _ask(
        *_serve(tmp_path / "home"),
        "thread/read",
        {"threadId": child["id"], "includeTurns": True, "turnItems": False},
    )
    assert read["thread"] == child  # type: ignore[index]
