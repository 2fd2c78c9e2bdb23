"""The fork tree of a Session: its ancestors up to the root and its descendants
from committed fork operations, read from durable rows only.

Ancestors follow `fork_lineage` upwards; a soft-deleted ancestor keeps its lineage row, so it
appears with `session=None` and the chain goes on through it. Descendants are the committed
lineage rows whose source is a node of the tree; each carries its ordinal among its source's
committed forks (1 = the first fork ever committed from that source, by operation order), so
ordinals never shift when a sibling is deleted.

Both are built without recursion, whatever the depth: the chain upwards one row at a time,
the tree downwards one query per level (every child of the level's nodes at once, through the
`fork_lineage_by_source` index, with its title and ordinal). A read is bounded: at most
`max_depth` levels and `max_nodes` descendants; where it stops, the node whose children are
not listed carries a `Truncation` (continue with a read rooted there), and the tree says why it
stopped. The Session's own forks can be paged with `after_ordinal`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import apsw

from storage.base import Database
from storage.models import Lineage, Session
from storage.rows import SESSION_SELECT, load_session, require_session, session_from_row
from storage.sqlite import Row

MAX_ANCESTORS = 10_000
"""A chain upwards longer than this is listed to here (`truncated.ancestors`); a cycle cannot
be written by commit_fork, but the bound keeps a damaged file from looping the reader."""
DEFAULT_MAX_DEPTH = 100
MAX_DEPTH_LIMIT = 300
"""Levels of descendants one read may list: the reply nests two containers per level, and
msgpack packs and unpacks at most 1,024 nested ones."""
DEFAULT_MAX_NODES = 10_000
MAX_NODES_LIMIT = 10_000

DEPTH = "depth"
NODES = "nodes"


@dataclass(frozen=True, slots=True)
class LineageAncestor:
    """One ancestor: `session` is None when it was deleted; `lineage` is its own forkedFrom.
    `settings_omitted`: its settings were not read (the `settings_chars` bound of the read):
    `session.settings` is empty, not the Session's."""

    session_id: str
    session: Session | None
    lineage: Lineage | None
    settings_omitted: bool = False


@dataclass(frozen=True, slots=True)
class Truncation:
    """Children of a node not listed: `reason` is the bound that stopped the read (`depth` or
    `nodes`); `omitted_children` how many direct children were left out."""

    reason: str
    omitted_children: int


@dataclass(slots=True)
class LineageNode:
    session_id: str
    title: str
    deleted: bool
    lineage: Lineage
    ordinal: int
    children: list[LineageNode] = field(default_factory=list)
    truncated: Truncation | None = None


@dataclass(frozen=True, slots=True)
class TreeTruncation:
    """Why a read did not list the whole tree: `reason` (`depth`, `nodes`, or `ancestors`
    alone), the bounds it ran with, how many of the Session's own forks were left out (page
    on with `after_ordinal` = the last ordinal listed) and whether the ancestors were cut."""

    reason: str
    max_depth: int
    max_nodes: int
    omitted_children: int
    ancestors: bool


@dataclass(frozen=True, slots=True)
class LineageTree:
    session: Session
    ancestors: list[LineageAncestor]
    descendants: list[LineageNode]
    truncated: TreeTruncation | None = None


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


# Every committed fork child of a level's nodes, with its ordinal among its own source's forks
# (by operation order) and the columns a node shows; the source ids come as one JSON array.
_LEVEL = (
    "SELECT l.source_session_id, l.source_turn_id, l.target_session_id, l.target_turn_id,"
    " l.operation_id, l.forked_at_ms, s.title, s.deleted,"
    " ROW_NUMBER() OVER (PARTITION BY l.source_session_id ORDER BY o.op_seq)"
    " FROM fork_lineage l JOIN fork_operations o"
    " ON o.workspace_id = l.workspace_id AND o.operation_id = l.operation_id"
    " LEFT JOIN sessions s ON s.workspace_id = l.workspace_id"
    " AND s.session_id = l.target_session_id"
    " WHERE l.workspace_id = ? AND l.source_session_id IN (SELECT value FROM json_each(?))"
)
_COUNTS = (
    "SELECT source_session_id, count(*) FROM fork_lineage WHERE workspace_id = ?"
    " AND source_session_id IN (SELECT value FROM json_each(?)) GROUP BY source_session_id"
)


_WITHOUT_SETTINGS = SESSION_SELECT.replace("s.settings_json", "'{}'", 1)
"""A Session's row read with empty settings (its settings not read at all)."""
assert _WITHOUT_SETTINGS != SESSION_SELECT


def _ancestors(
    conn: apsw.Connection, ws: str, session: Session, seen: set[str], settings_chars: int | None
) -> tuple[list[LineageAncestor], bool]:
    """The chain upwards, nearest first. With `settings_chars`, an ancestor's settings are read
    only while the settings read so far (nearest first, their stored JSON's length) stay
    within it; past it the ancestor is read without them (`settings_omitted`), so the chain's
    settings — a fork child's are its source's — are not read, nor answered, once per
    ancestor."""
    ancestors: list[LineageAncestor] = []
    used = 0
    current = session.lineage
    while current is not None:
        up = current.source_session_id
        if up in seen:
            break
        if len(ancestors) >= MAX_ANCESTORS:
            return ancestors, True
        seen.add(up)
        omitted = False
        if settings_chars is None:
            ancestor = load_session(conn, ws, up, include_deleted=True)
        else:
            size = conn.execute(
                "SELECT length(settings_json) FROM sessions"
                " WHERE workspace_id = ? AND session_id = ?",
                (ws, up),
            ).fetchone()
            used += int(size[0] or 0) if size is not None else 0
            omitted = used > settings_chars
            if omitted:
                row = conn.execute(
                    _WITHOUT_SETTINGS + " WHERE s.workspace_id = ? AND s.session_id = ?",
                    (ws, up),
                ).fetchone()
                ancestor = None if row is None else session_from_row(row)
            else:
                ancestor = load_session(conn, ws, up, include_deleted=True)
        own = _lineage_row(conn, ws, up)
        visible = None if ancestor is None or ancestor.deleted else ancestor
        ancestors.append(LineageAncestor(up, visible, own, omitted and visible is not None))
        current = own
    return ancestors, False


def _descendants(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    seen: set[str],
    max_depth: int,
    max_nodes: int,
    after_ordinal: int,
) -> tuple[list[LineageNode], str | None, int]:
    """(the Session's listed children, the bound that stopped the read or None, how many of
    the Session's own children were left out)."""
    top: list[LineageNode] = []
    # The nodes whose children the next level lists: (id, its node (None: the Session), the
    # list its children go into).
    frontier: list[tuple[str, LineageNode | None, list[LineageNode]]] = [(sid, None, top)]
    listed = 0
    depth = 0
    stopped: str | None = None
    omitted_top = 0
    while frontier:
        if depth >= max_depth:
            stopped = DEPTH
            break
        by_source: dict[str, list[Row]] = {}
        ids = json.dumps([node_id for node_id, _, _ in frontier])
        for row in conn.execute(_LEVEL, (ws, ids)):
            if row[0] == sid and int(row[8]) <= after_ordinal:
                continue  # an earlier page of the Session's own forks
            by_source.setdefault(str(row[0]), []).append(row)
        following: list[tuple[str, LineageNode | None, list[LineageNode]]] = []
        for node_id, node, children in frontier:
            rows = sorted(by_source.get(node_id, ()), key=lambda r: int(r[8]))
            for i, row in enumerate(rows):
                child_id = str(row[2])
                if child_id in seen:
                    continue
                if listed >= max_nodes:
                    left = len(rows) - i
                    stopped = NODES
                    if node is None:
                        omitted_top = left
                    else:
                        node.truncated = Truncation(NODES, left)
                    break
                seen.add(child_id)
                listed += 1
                child = LineageNode(
                    session_id=child_id,
                    title="" if row[6] is None else str(row[6]),
                    deleted=row[7] is None or bool(row[7]),
                    lineage=_lineage(row),
                    ordinal=int(row[8]),
                )
                children.append(child)
                following.append((child_id, child, child.children))
        frontier = following
        depth += 1
        if stopped is not None:
            break
    if stopped is not None and frontier:
        # The last level listed: its nodes' children were not read; say how many each has.
        ids = json.dumps([node_id for node_id, _, _ in frontier])
        counts = {str(r[0]): int(r[1]) for r in conn.execute(_COUNTS, (ws, ids))}
        for node_id, node, _ in frontier:
            if node is not None and counts.get(node_id):
                node.truncated = Truncation(stopped, counts[node_id])
        if stopped == DEPTH and not counts:
            stopped = None  # the last level listed has no children: nothing was cut
    return top, stopped, omitted_top


def lineage_tree(
    conn: apsw.Connection,
    ws: str,
    sid: str,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_nodes: int = DEFAULT_MAX_NODES,
    after_ordinal: int = 0,
    settings_chars: int | None = None,
) -> LineageTree:
    """`settings_chars`: the most characters of settings the ancestors carry together
    (`_ancestors`); None: every ancestor's."""
    session = require_session(conn, ws, sid)
    seen = {sid}
    ancestors, ancestors_cut = _ancestors(conn, ws, session, seen, settings_chars)
    descendants, stopped, omitted = _descendants(
        conn, ws, sid, seen, max_depth, max_nodes, after_ordinal
    )
    truncated = None
    if stopped is not None or ancestors_cut:
        truncated = TreeTruncation(
            reason=stopped or "ancestors",
            max_depth=max_depth,
            max_nodes=max_nodes,
            omitted_children=omitted,
            ancestors=ancestors_cut,
        )
    return LineageTree(session, ancestors, descendants, truncated)


class LineageStore:
    """`Store.lineage_tree`: one consistent read snapshot; mixed into `storage.Store`."""

    def __init__(self, db: Database) -> None:
        # The owner's operations this part uses, bound once (the part holds them, never
        # inherits them).
        self._read = db.read

    def lineage_tree(
        self,
        ws: str,
        sid: str,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_nodes: int = DEFAULT_MAX_NODES,
        after_ordinal: int = 0,
        settings_chars: int | None = None,
    ) -> LineageTree:
        with self._read() as conn:
            return lineage_tree(
                conn,
                ws,
                sid,
                settings_chars=settings_chars,
                max_depth=max_depth,
                max_nodes=max_nodes,
                after_ordinal=after_ordinal,
            )


__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_NODES",
    "MAX_DEPTH_LIMIT",
    "MAX_NODES_LIMIT",
    "LineageAncestor",
    "LineageNode",
    "LineageStore",
    "LineageTree",
    "TreeTruncation",
    "Truncation",
    "lineage_tree",
]
