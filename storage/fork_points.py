"""Fork points beyond `throughTurn` (seed 000 §11): `latestSettled`, the whole
Session as it stands, resolved to a concrete settled Turn inside the prepare transaction and
frozen on the operation (`source_turn_id`), so a replay after new Turns returns the same
original boundary.

The request hash of a `latestSettled` request carries no Turn (the client named none), so a
replay of the same `requestId` matches whatever the Session's newest Turn is by then; the
barrier is `source + latestSettled + the resolved Turn`.
"""

from __future__ import annotations

import apsw

from domain.errors import ForkBoundaryError, ForkBoundaryReason
from storage.fork_boundary import source_blockers
from storage.models import ForkPointKind, Session, TurnPhase

# The turn id a `latestSettled` request carries before resolution (and in its request hash).
UNRESOLVED = ""


def latest_settled_turn_id(conn: apsw.Connection, ws: str, sid: str) -> str | None:
    """The Session's newest Turn if it is settled, else None (an active newest Turn is the
    source's own blocker, `source_turn_active`, reported by the caller)."""
    row = conn.execute(
        "SELECT turn_id, phase FROM turns WHERE workspace_id = ? AND session_id = ?"
        " ORDER BY sequence DESC LIMIT 1",
        (ws, sid),
    ).fetchone()
    if row is None or row[1] != TurnPhase.SETTLED:
        return None
    return str(row[0])


def resolve_point_turn(
    conn: apsw.Connection, ws: str, sid: str, point_kind: str, turn_id: str
) -> str:
    """The concrete boundary Turn of a fork point; `latestSettled` with no settled newest Turn
    raises `turn_not_found` (no Turns) or `turn_not_settled` (the newest one runs)."""
    if point_kind != ForkPointKind.LATEST_SETTLED:
        return turn_id
    resolved = latest_settled_turn_id(conn, ws, sid)
    if resolved is not None:
        return resolved
    any_turn = conn.execute(
        "SELECT 1 FROM turns WHERE workspace_id = ? AND session_id = ? LIMIT 1", (ws, sid)
    ).fetchone()
    reason = ForkBoundaryReason.TURN_NOT_SETTLED if any_turn else ForkBoundaryReason.TURN_NOT_FOUND
    raise ForkBoundaryError(reason)


def resolve_or_block(
    conn: apsw.Connection, ws: str, source: Session, point_kind: str, turn_id: str
) -> str:
    """`resolve_point_turn`, but an unresolvable `latestSettled` reports the source's own
    blocker first (an active Turn refuses as `source_turn_active`, as for `throughTurn`)."""
    try:
        return resolve_point_turn(conn, ws, source.session_id, point_kind, turn_id)
    except ForkBoundaryError:
        blockers = source_blockers(conn, ws, source)
        if blockers:
            raise ForkBoundaryError(blockers[0]) from None
        raise
