"""Re-binding a Turn whose provider binding the host never recorded, from
the provider's own history, as seed 000 §10 does for Codex: by order and content, and fail
closed — a Turn is re-bound only when exactly one provider turn can be it.

The canonical Turns that carry a binding are anchors: a Turn missing its binding can only be
one of the provider's unclaimed turns between the provider positions of the anchors around
it, and only one whose user text equals the Turn's. Two candidates, two missing Turns with
the same text in one window, or anchors out of order: nothing is re-bound.

A history the worker calls *final* (no process that may hold the Turn's start is alive:
drivers/history_final.py) can also prove a missing Turn absent (`prove_absent`): the provider
never got it, so it is marked host-only. Only when every provider turn is some canonical Turn's
and every bound Turn's provider turn is there, in order.
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
    unanswered: bool = False
    """Settled, not `completed` (a Turn that ran to its answer had its start delivered)."""


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


def prove_absent(
    canonical: Sequence[CanonicalTurn],
    provider: Sequence[Mapping[str, Any]],
    matches: Mapping[str, str],
) -> list[str]:
    """The missing, unanswered Turns a *final* provider history proves the provider never got,
    given this re-bind's `matches`: every one, when each provider turn is claimed (by a bound
    canonical Turn or a match) exactly once, every bound Turn's provider turn is in the
    history in the canonical order, and at least one is (the history is the Session's own
    thread). Anything else — an unclaimed provider turn (whatever its text: it could be any
    missing Turn), a duplicate, a bound Turn the history lacks, anchors out of order, no
    anchor at all — proves nothing: []."""
    ids = [str(t.get("providerTurnId") or "") for t in provider]
    position = {pid: i for i, pid in enumerate(ids) if pid}
    if len(position) != len(ids):
        return []  # duplicate or empty provider ids: nothing can be trusted
    claims = [t.root_provider_turn_id for t in canonical if t.root_provider_turn_id]
    if not claims:
        return []  # nothing ties the history to the Session's thread
    claims += [matches[t.turn_id] for t in canonical if t.turn_id in matches]
    if len(set(claims)) != len(claims) or set(claims) != set(ids):
        return []  # a provider turn no canonical Turn holds, or a bound one not there
    last = -1
    for turn in canonical:
        pid = turn.root_provider_turn_id or matches.get(turn.turn_id)
        if pid is None:
            continue
        if position[pid] <= last:
            return []  # the provider's order contradicts ours
        last = position[pid]
    return [
        t.turn_id
        for t in canonical
        if t.needs_binding
        and t.unanswered
        and not t.root_provider_turn_id
        and t.turn_id not in matches
    ]
