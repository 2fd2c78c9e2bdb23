"""The fork tree of a Session (issue 21 §3): its ancestors up to the root and its descendants
from committed fork operations, read from durable rows only.

Ancestors follow `fork_lineage` upwards; a soft-deleted ancestor keeps its lineage row, so it
appears with `session=None` and the chain goes on through it. Descendants are the committed
lineage rows whose source is a node of the tree; each carries its ordinal among its source's
committed forks (1 = the first fork ever committed from that source, by operation order), so
ordinals never shift when a sibling is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import apsw

from storage.base import StoreBase
from storage.models import Lineage, Session
from storage.session_rows import load_session, require_session
from storage.sqlite import Row

# A lineage chain deeper than this is corrupt (a cycle cannot be written by commit_fork,
# but a bound keeps a damaged file from looping the reader forever).
MAX_DEPTH = 10_000


@dataclass(frozen=True, slots=True)
class LineageAncestor:
    """One ancestor: `session` is None when it was deleted; `lineage` is its own forkedFrom."""

    session_id: str
    session: Session | None
    lineage: Lineage | None


@dataclass(frozen=True, slots=True)
class LineageNode:
    session_id: str
    title: str
    deleted: bool
    lineage: Lineage
    ordinal: int
    children: list[LineageNode] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LineageTree:
    session: Session
    ancestors: list[LineageAncestor]
    descendants: list[LineageNode]


def _lineage(r: Row) -> Lineage:
    return Lineage(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]))


def _lineage_row(conn: apsw.Connection, ws: str, sid: str) -> Lineage | None:
    r = conn.execute(
        "SELECT source_session_id, source_turn_id, target_session_id, target_turn_id,"
        " operation_id, forked_at_ms FROM fork_lineage WHERE workspace_id = ?"
        " AND target_session_id = ?",
        (ws, sid),
    ).fetchone()
    return None if r is None else _lineage(r)


def _children(conn: apsw.Connection, ws: str, sid: str) -> list[tuple[Lineage, int]]:
    """Committed fork children of `sid` with their ordinals, by operation order."""
    rows = conn.execute(
        "SELECT l.source_session_id, l.source_turn_id, l.target_session_id, l.target_turn_id,"
        " l.operation_id, l.forked_at_ms FROM fork_lineage l JOIN fork_operations o"
        " ON o.workspace_id = l.workspace_id AND o.operation_id = l.operation_id"
        " WHERE l.workspace_id = ? AND l.source_session_id = ? ORDER BY o.op_seq",
        (ws, sid),
    ).fetchall()
    return [(_lineage(r), i + 1) for i, r in enumerate(rows)]


def lineage_tree(conn: apsw.Connection, ws: str, sid: str) -> LineageTree:
    session = require_session(conn, ws, sid)
    ancestors: list[LineageAncestor] = []
    seen = {sid}
    current = session.lineage
    while current is not None and len(ancestors) < MAX_DEPTH:
        up = current.source_session_id
        if up in seen:
            break
        seen.add(up)
        ancestor = load_session(conn, ws, up, include_deleted=True)
        own = _lineage_row(conn, ws, up)
        visible = None if ancestor is None or ancestor.deleted else ancestor
        ancestors.append(LineageAncestor(up, visible, own))
        current = own

    def build(source: str, depth: int) -> list[LineageNode]:
        nodes = []
        for lin, ordinal in _children(conn, ws, source):
            child_id = lin.target_session_id
            if child_id in seen or depth >= MAX_DEPTH:
                continue
            seen.add(child_id)
            child = load_session(conn, ws, child_id, include_deleted=True)
            nodes.append(
                LineageNode(
                    session_id=child_id,
                    title="" if child is None else child.title,
                    deleted=child is None or child.deleted,
                    lineage=lin,
                    ordinal=ordinal,
                    children=build(child_id, depth + 1),
                )
            )
        return nodes

    return LineageTree(session=session, ancestors=ancestors, descendants=build(sid, 0))


class LineageStore(StoreBase):
    """`Store.lineage_tree`: one consistent read snapshot; mixed into `storage.Store`."""

    def lineage_tree(self, ws: str, sid: str) -> LineageTree:
        with self._read() as conn:
            return lineage_tree(conn, ws, sid)


__all__ = ["LineageAncestor", "LineageNode", "LineageStore", "LineageTree", "lineage_tree"]
