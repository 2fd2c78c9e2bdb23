"""Turn boundaries and checkpoints read from a Claude transcript (the legacy-checkpoint path):
tool results, task notifications and CLI-synthesised users never start a Turn."""

from __future__ import annotations

import json
from typing import Any

from drivers.claude_transcript import (
    decode_binding,
    encode_binding,
    legacy_checkpoint,
    parse_entries,
    split_turns,
)


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
