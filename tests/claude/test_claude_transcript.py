"""Turn boundaries and checkpoints read from a Claude transcript (the legacy-checkpoint path):
tool results, task notifications and CLI-synthesised users never start a Turn; and the turn end
reconciles its checkpoint from the lines the turn appended, the whole transcript only when they
do not hold it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from drivers.claude import checkpoints
from drivers.claude.state import SessionState, TurnState
from drivers.claude_transcript import (
    decode_binding,
    encode_binding,
    legacy_checkpoint,
    parse_entries,
    split_turns,
    transcript_path,
)

SESSION = "5a4c3f8e-1b2d-4e6f-8a9b-0c1d2e3f4a5b"


def line(uuid: str, type_: str, content: Any = "", **extra: Any) -> str:
    entry: dict[str, Any] = {"type": type_, "uuid": uuid, **extra}
    if type_ in ("user", "assistant"):
        entry["message"] = {"role": type_, "content": content}
    return json.dumps(entry)


TRANSCRIPT = "\n".join(
    [
        json.dumps({"type": "queue-operation"}),
        line("u1", "user", "first"),
        line("a1", "attachment"),
        line("r1", "assistant", [{"type": "tool_use", "id": "x", "name": "Bash", "input": {}}]),
        line("t1", "user", [{"type": "tool_result", "tool_use_id": "x", "content": "ok"}]),
        line("r1b", "assistant", [{"type": "text", "text": "done"}]),
        line("n1", "user", "<task-notification>bg task finished</task-notification>"),
        line("i1", "user", "[Request interrupted by user]"),
        line("m1", "user", "meta", isMeta=True),
        line("s1", "system", subtype="stop_hook_summary"),
        line("p1", "progress"),
        line("side", "user", "sidechain prompt", isSidechain=True),
        line("u2", "user", [{"type": "text", "text": "second"}]),
        line("r2", "assistant", [{"type": "text", "text": "two"}]),
        "{torn tail",
    ]
)


def test_only_real_user_prompts_start_turns() -> None:
    turns = split_turns(parse_entries(TRANSCRIPT))
    assert [t.root_uuid for t in turns] == ["u1", "u2"]


def test_checkpoint_is_the_last_message_before_the_next_root_user() -> None:
    assert legacy_checkpoint(TRANSCRIPT, "u1") == "s1"  # a trailing system message counts
    assert legacy_checkpoint(TRANSCRIPT, "u2") == "r2"


def test_unknown_or_non_root_uuid_has_no_checkpoint() -> None:
    assert legacy_checkpoint(TRANSCRIPT, "t1") is None
    assert legacy_checkpoint(TRANSCRIPT, "nope") is None


def test_binding_json_round_trips_and_rejects_other_schemas() -> None:
    assert decode_binding(encode_binding("abc")) == "abc"
    assert decode_binding(None) is None
    assert decode_binding("{}") is None
    assert decode_binding('{"schemaVersion": 2, "checkpointMessageId": "abc"}') is None
    assert decode_binding("not json") is None


def _session_with_turns(tmp_path: Path) -> tuple[SessionState, Path, int]:
    """A session whose transcript holds an earlier turn, then this turn's own lines (from the
    returned offset, the transcript's size when this turn began)."""
    transcript = transcript_path(tmp_path, str(tmp_path / "ws"), SESSION)
    transcript.parent.mkdir(parents=True)
    earlier = "\n".join(line(f"old-{i}", "assistant", "x" * 50) for i in range(200))
    earlier = line("u0", "user", "before") + "\n" + earlier + "\n"
    transcript.write_text(earlier + line("u1", "user", "now") + "\n" + line("a1", "assistant"))
    session = SessionState(
        agent_session_id="s",
        provider_session_id=SESSION,
        config_dir=tmp_path,
        private_home=tmp_path / "home",
        cwd=str(tmp_path / "ws"),
        model=None,
        claude_settings=None,
        env={},
    )
    return session, transcript, len(earlier.encode())


def _turn(offset: int, checkpoint: str, events: list[Any]) -> TurnState:
    turn = TurnState(turn_id="t", emit=lambda _sid, event: events.append(event))
    turn.provider_turn_id, turn.checkpoint, turn.transcript_offset = "u1", checkpoint, offset
    return turn


def test_the_turn_end_reads_only_the_lines_the_turn_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint the stream reported is among the turn's own lines: that is all that is
    parsed (a transcript grows with every turn), and the checkpoint stays."""
    session, transcript, offset = _session_with_turns(tmp_path)
    parsed: list[str] = []
    real = checkpoints.contains_uuid

    def counting(text: str, uuid: str) -> bool:
        parsed.append(text)
        return real(text, uuid)

    monkeypatch.setattr(checkpoints, "contains_uuid", counting)
    events: list[Any] = []
    checkpoints.reconcile_checkpoint(session, _turn(offset, "a1", events))
    own = transcript.read_bytes()[offset:].decode()
    assert parsed == [own]
    assert events == []


def test_a_checkpoint_the_transcript_lacks_is_replaced_from_the_whole_transcript(
    tmp_path: Path,
) -> None:
    session, _, offset = _session_with_turns(tmp_path)
    events: list[Any] = []
    turn = _turn(offset, "never-persisted", events)
    checkpoints.reconcile_checkpoint(session, turn)
    assert turn.checkpoint == "a1"
    assert [type(e).__name__ for e in events] == ["TurnBindingMoved"]
