"""Re-binding a Turn whose provider binding the host never recorded, from
the provider's own history, as seed 000 §10 does for Codex: by order and content, and fail
closed — a Turn is re-bound only when exactly one provider turn can be it.

The canonical Turns that carry a binding are anchors: a Turn missing its binding can only be
one of the provider's unclaimed turns between the provider positions of the anchors around
it, and only one whose user text equals the Turn's. Two candidates, two missing Turns with
the same text in one window, or anchors out of order: nothing is re-bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CanonicalTurn:
    turn_id: str
    root_provider_turn_id: str | None
    user_text: str | None
    needs_binding: bool


def match_missing(
    canonical: Sequence[CanonicalTurn], provider: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """`{canonical turn id: provider turn id}` for each missing binding that is unambiguous."""
    ids = [str(t.get("providerTurnId") or "") for t in provider]
    texts = [t.get("userText") for t in provider]
    position = {pid: i for i, pid in enumerate(ids) if pid}
    if len(position) != len(ids):
        return {}  # duplicate or empty provider ids: nothing can be trusted
    claimed = {t.root_provider_turn_id for t in canonical if t.root_provider_turn_id}
    result: dict[str, str] = {}
    pending: list[CanonicalTurn] = []
    low = -1

    def close_window(high: int) -> None:
        window = [(ids[i], texts[i]) for i in range(low + 1, high) if ids[i] not in claimed]
        for turn in pending:
            if turn.user_text is None:
                continue
            twins = [t for t in pending if t.user_text == turn.user_text]
            candidates = [pid for pid, text in window if text == turn.user_text]
            if len(twins) == 1 and len(candidates) == 1:
                result[turn.turn_id] = candidates[0]

    for turn in canonical:
        anchor = turn.root_provider_turn_id
        if anchor and anchor in position:
            if position[anchor] <= low:
                return {}  # the provider's order contradicts ours: fail closed
            close_window(position[anchor])
            pending, low = [], position[anchor]
        elif turn.needs_binding:
            pending.append(turn)
    close_window(len(ids))
    return result
