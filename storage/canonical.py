"""Canonical Session history, one concern per module behind this one class: `sessions`,
`session_controls` (goal control, runtime operations), `turns` (submit claims, bindings,
settle), `history` (Messages, Interactions, the timeline), over the row helpers of
`session_rows`.

Fenced writes call `_write(ws, fence=sid)` (or `tx.check_fence` after an idempotent replay
check), so an active fork operation on the Session rejects them inside the same transaction.
"""

from __future__ import annotations

from domain.errors import InteractionNotFound, SessionIdTaken
from storage.history import HistoryStore
from storage.session_controls import SessionControls
from storage.session_rows import load_session, load_turn, require_session, require_turn
from storage.sessions import SessionStore
from storage.turns import TurnStore


class CanonicalStore(SessionStore, SessionControls, TurnStore, HistoryStore):
    """Sessions and their history; mixed into `storage.Store`."""


__all__ = [
    "CanonicalStore",
    "InteractionNotFound",
    "SessionIdTaken",
    "load_session",
    "load_turn",
    "require_session",
    "require_turn",
]
