"""`session.lineage`'s store read: a tree is read one query per level through the
`fork_lineage_by_source` index (schema v8), never a query per node, and never by recursion."""

from __future__ import annotations

import sys
from typing import Any

import apsw
from store_builders import WS, new_session, settled_turn

from bench.fork_trees import committed_fork, replicate
from storage.lineage_tree import _LEVEL, lineage_tree
from storage.sqlite import open_connection
from storage.store import Store


def test_a_tree_is_read_one_query_per_level_through_the_source_index(store: Store) -> None:
    root = new_session(store)
    turn = settled_turn(store, root, provider_turn_id="p1").turn_id
    first, _ = committed_fork(store, WS, root, turn)
    op_id = store.lineage.lineage_tree(WS, first).session.lineage.operation_id  # type: ignore[union-attr]
    fan = [first, *replicate(store, WS, op_id, [root] * 299)]  # 300 forks of the root
    chain = replicate(store, WS, op_id, [fan[-1]] + [None] * 49)  # 50 levels below the last

    conn = open_connection(store.path)
    plan = " ".join(str(r) for r in conn.execute("EXPLAIN QUERY PLAN " + _LEVEL, (WS, "[]")))
    assert "fork_lineage_by_source" in plan, plan
    statements: list[str] = []

    def trace(event: dict[str, Any]) -> None:
        if event.get("code") == apsw.SQLITE_TRACE_STMT:
            statements.append(str(event["sql"]))

    conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # far below the tree's depth plus the test's own frames
    try:
        tree = lineage_tree(conn, WS, root)
    finally:
        sys.setrecursionlimit(limit)
        conn.trace_v2(0, None)
    assert [n.session_id for n in tree.descendants] == fan
    node, below = tree.descendants[-1], []
    while node.children:
        (node,) = node.children
        below.append(node.session_id)
    assert below == chain and tree.truncated is None
    levels = [s for s in statements if "json_each" in s]
    assert len(levels) == 52  # 51 levels with nodes, and the empty one below the last
    assert len(statements) < 60  # 350 nodes: never a query per node
