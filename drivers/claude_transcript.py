"""Reading Claude Code transcripts: root user messages (provider Turn identity), per-turn
checkpoints, and the `{schemaVersion: 1, checkpointMessageId}` binding JSON of a Claude Turn.

Pure functions over JSONL text, so the fork path and the legacy-checkpoint path share one
definition of "a turn boundary" (seed 000 §7, Claude 1–3).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from domain.json_text import loads_as_stdlib

BINDING_SCHEMA_VERSION = 1

# Entry types that fork_session copies (and cuts at); `progress` is UI-only and never a cut.
CHAIN_TYPES = frozenset({"user", "assistant", "attachment", "system"})
# Entries a checkpoint may point at: main-chain user/assistant/system messages. Attachments
# are chain links too (a streamed system notice is persisted as one), so they count as well.
CHECKPOINT_TYPES = frozenset({"user", "assistant", "system", "attachment"})

# User entries the CLI writes itself: they continue a turn, they never start one.
_SYNTHETIC_USER_PREFIXES = (
    "<task-notification>",
    "[Request interrupted by user",
    "<local-command-",
    "<command-name>",
    "Caveat: The messages below were generated",
)


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    uuid: str
    type: str
    forked_from_uuid: str | None
    is_root_user: bool


@dataclass(frozen=True, slots=True)
class TranscriptTurn:
    """One provider Turn of a transcript: its root user uuid and its last checkpoint entry."""

    root_uuid: str
    checkpoint_uuid: str
    root_forked_from: str | None
    checkpoint_forked_from: str | None


def transcript_path(config_dir: str | Path, cwd: str, session_id: str) -> Path:
    """Where the CLI keeps `session_id`'s transcript for `cwd` under `CLAUDE_CONFIG_DIR`.

    The project directory name comes from the SDK (realpath, NFC, the CLI's hashed
    sanitisation), so it matches what the CLI writes for any cwd.
    """
    from claude_agent_sdk import project_key_for_directory

    return Path(config_dir) / "projects" / project_key_for_directory(cwd) / f"{session_id}.jsonl"


def _content_texts(content: Any) -> tuple[list[str], bool]:
    """(text parts, has tool_result) of a message `content`."""
    if isinstance(content, str):
        return [content], False
    texts: list[str] = []
    tool_result = False
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            tool_result = True
    return texts, tool_result


def is_root_user(entry: Mapping[str, Any]) -> bool:
    """A user prompt that starts a Turn: not meta, sidechain, compact summary, tool result,
    task notification or other CLI-synthesised user message."""
    if entry.get("type") != "user":
        return False
    if entry.get("isMeta") or entry.get("isSidechain") or entry.get("isCompactSummary"):
        return False
    if entry.get("isVisibleInTranscriptOnly") or entry.get("toolUseResult") is not None:
        return False
    message = entry.get("message")
    if not isinstance(message, dict) or message.get("role", "user") != "user":
        return False
    texts, tool_result = _content_texts(message.get("content"))
    if tool_result or not texts:
        return False
    first = texts[0].lstrip()
    return not first.startswith(_SYNTHETIC_USER_PREFIXES)


def parse_entries(text: str) -> list[TranscriptEntry]:
    """Main-chain entries in file order (the order fork_session cuts in); bad lines skipped."""
    out: list[TranscriptEntry] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            raw = loads_as_stdlib(line)
        except ValueError:
            continue  # a torn tail line is the CLI's problem, not a turn boundary
        entry = _entry(raw)
        if entry is not None:
            out.append(entry)
    return out


def parse_entry_bytes(data: bytes) -> list[TranscriptEntry]:
    """`parse_entries` over a transcript's bytes, as the CLI writes them: one JSON object a
    `\n`-ended line, each parsed from its bytes by orjson (no decode of the whole file, no
    re-encode of each line, no digit-run guard: an entry's fields read here are strings,
    booleans and objects, never a number), the standard library for what orjson refuses; a
    line neither parses (torn, not UTF-8) is skipped."""
    out: list[TranscriptEntry] = []
    for line in data.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError:
            try:
                raw = json.loads(line)
            except ValueError:
                continue
        entry = _entry(raw)
        if entry is not None:
            out.append(entry)
    return out


def _entry(raw: Any) -> TranscriptEntry | None:
    if not isinstance(raw, dict) or raw.get("isSidechain"):
        return None
    uuid = raw.get("uuid")
    if raw.get("type") not in CHAIN_TYPES or not isinstance(uuid, str):
        return None
    forked = raw.get("forkedFrom")
    forked_uuid = forked.get("messageUuid") if isinstance(forked, dict) else None
    return TranscriptEntry(
        uuid=uuid,
        type=str(raw["type"]),
        forked_from_uuid=forked_uuid if isinstance(forked_uuid, str) else None,
        is_root_user=is_root_user(raw),
    )


def split_turns(entries: Iterable[TranscriptEntry]) -> list[TranscriptTurn]:
    """The transcript's Turns in order: each root user message up to the next one.

    A Turn's checkpoint is its last checkpoint-type entry before the next root user (entries
    before the first root user belong to no Turn).
    """
    turns: list[TranscriptTurn] = []
    root: TranscriptEntry | None = None
    last: TranscriptEntry | None = None
    for entry in entries:
        if entry.is_root_user:
            if root is not None and last is not None:
                turns.append(_turn(root, last))
            root, last = entry, entry
        elif root is not None and entry.type in CHECKPOINT_TYPES:
            last = entry
    if root is not None and last is not None:
        turns.append(_turn(root, last))
    return turns


def _turn(root: TranscriptEntry, last: TranscriptEntry) -> TranscriptTurn:
    return TranscriptTurn(
        root_uuid=root.uuid,
        checkpoint_uuid=last.uuid,
        root_forked_from=root.forked_from_uuid,
        checkpoint_forked_from=last.forked_from_uuid,
    )


def history_turns(text: str) -> list[dict[str, Any]]:
    """The transcript's Turns in order as `{providerTurnId, userText, bindingJson}`: the
    provider's own history a Turn whose binding the host never recorded is re-bound from
    (the host matches by order and content and fails closed)."""
    prompts: dict[str, str] = {}
    for line in text.splitlines():
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict) and isinstance(raw.get("uuid"), str) and is_root_user(raw):
            texts, _ = _content_texts(raw["message"].get("content"))
            prompts[raw["uuid"]] = "\n".join(texts)
    return [
        {
            "providerTurnId": t.root_uuid,
            "userText": prompts.get(t.root_uuid),
            "bindingJson": encode_binding(t.checkpoint_uuid),
        }
        for t in split_turns(parse_entries(text))
    ]


def legacy_checkpoint(text: str, root_uuid: str) -> str | None:
    """The checkpoint of the Turn rooted at `root_uuid`: the last message before the next
    root user message, or None if `root_uuid` is not a root user of this transcript."""
    for turn in split_turns(parse_entries(text)):
        if turn.root_uuid == root_uuid:
            return turn.checkpoint_uuid
    return None


def contains_uuid(text: str, uuid: str) -> bool:
    return any(e.uuid == uuid for e in parse_entries(text))


def encode_binding(checkpoint_message_id: str) -> str:
    """The Claude binding JSON stored opaquely on a Turn."""
    return json.dumps(
        {"schemaVersion": BINDING_SCHEMA_VERSION, "checkpointMessageId": checkpoint_message_id},
        separators=(",", ":"),
        sort_keys=True,
    )


def decode_binding(binding_json: str | None) -> str | None:
    """The checkpoint of a binding JSON, or None when it is empty, legacy or malformed."""
    if not binding_json:
        return None
    try:
        raw = json.loads(binding_json)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("schemaVersion") != BINDING_SCHEMA_VERSION:
        return None
    checkpoint = raw.get("checkpointMessageId")
    return checkpoint if isinstance(checkpoint, str) and checkpoint else None
