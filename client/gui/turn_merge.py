"""How the GUI merges copies of a Turn: which of two copies is staler (a late submit reply
must not undo a settled event), and the replies streaming in (`message.delta`) shown as
provisional assistant messages until the settled message of that provider item arrives, and the
provider's retry note while it retries. Pure functions over wire dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from client.gui.turn_text import PROGRESS_KEY


def with_streams(
    turns: Sequence[Mapping[str, Any]],
    streams: dict[tuple[str, str], str],
    progress: dict[str, str] | None = None,
) -> Sequence[Mapping[str, Any]]:
    """The loaded Turns, each active one with its replies streamed so far appended as
    provisional assistant messages (until a message of that provider item exists) and the
    provider's latest retry note (`progress`, by Turn id) under `PROGRESS_KEY`. The streams and
    notes of a Turn that has settled are dropped from `streams` and `progress`."""
    if not streams and not progress:
        return turns
    notes = progress if progress is not None else {}
    out: list[Mapping[str, Any]] = []
    for turn in turns:
        turn_id = str(turn["turnId"])
        mine = [(i, t) for (tid, i), t in streams.items() if tid == turn_id]
        note = notes.get(turn_id)
        if not mine and note is None:
            out.append(turn)
            continue
        if turn.get("phase") == "settled":
            for item, _ in mine:
                streams.pop((turn_id, item), None)
            notes.pop(turn_id, None)
            out.append(turn)
            continue
        have = {
            str((m.get("payload") or {}).get("providerItemId")) for m in turn.get("messages") or []
        }
        extra = [
            {
                "messageId": f"stream-{item}",
                "turnId": turn["turnId"],
                "kind": "assistant",
                "text": text,
                "payload": {"providerItemId": item, "streaming": True},
                "version": 0,
            }
            for item, text in mine
            if item not in have
        ]
        shown = {**turn, "messages": [*(turn.get("messages") or []), *extra]}
        if note is not None:
            shown[PROGRESS_KEY] = note
        out.append(shown)
    return out


def staler(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether `new` is an older copy of the Turn than `old` (it must not replace it)."""
    if old.get("phase") == "settled":
        return new.get("phase") != "settled"
    if new.get("phase") == "settled":
        return False
    return message_count(new) < message_count(old)


def message_count(turn: Mapping[str, Any]) -> int:
    """The Turn's message count (an event that carries some of them says how many there are)."""
    count = turn.get("messageCount")
    return count if isinstance(count, int) else len(turn.get("messages") or [])
