"""A deleted fork child's tree on real SQLite files (schema v25): `session.create` finds the tree
a cwd is in through `fork_operations_deleted_trees`, one equality probe for each ancestor of
the cwd, however many deleted trees the store keeps; the migration fills the tree's path of
every row already `removing`/`removed` and, failing mid-way, leaves the store as it was."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import apsw
import pytest
from store_builders import WS, bare_operation, new_session, operations_only, settled_turn
from test_store_fork import request, run_to_commit

from domain.errors import WorkspaceWorktreeDeleted
from storage.fork_workspace import ancestors
from storage.schema import SCHEMA_VERSION, user_version
from storage.store import Store

pytestmark = pytest.mark.timeout(60)


def _worktree_child(store: Store, tree: Path) -> tuple[str, str]:
    """A committed fork whose row records a worktree at `tree` (`made`), its child working in
    it: the operation and the child."""
    sid = new_session(store)
    last = settled_turn(store, sid, text="one", provider_turn_id="p1").turn_id
    op = run_to_commit(store, store.fork_prepare.prepare_fork(WS, request(sid, last))[0])
    plan = {"path": str(tree), "childCwd": str(tree), "branch": f"agenthost/{tree.name}"}
    conn = store.db.connection()
    conn.execute(
        "UPDATE fork_operations SET workspace_mode = 'worktree', workspace_json = ?,"
        " workspace_state = 'made' WHERE operation_id = ?",
        (json.dumps(plan), op.operation_id),
    )
    conn.execute(
        "UPDATE sessions SET cwd = ? WHERE session_id = ?", (str(tree), op.target_session_id)
    )
    return op.operation_id, str(op.target_session_id)


def _deleted_trees(store: Store, trees: Path, n: int) -> list[tuple[str, Path]]:
    """`n` children deleted with their trees (`removing`, every other one then `removed`)."""
    made = []
    for i in range(n):
        tree = trees / f"tree-{i}"
        op_id, child = _worktree_child(store, tree)
        assert store.sessions.delete_session(WS, child, removing_tree=op_id) == []
        if i % 2:
            assert store.fork_workspace.mark_child_worktree_removed(WS, op_id)
        made.append((op_id, tree))
    return made


def _create(store: Store, cwd: str) -> str:
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        WS, session_id=sid, provider="tutti-agent", title="t", cwd=cwd, settings={}
    )
    return sid


def test_ancestors_are_the_paths_a_cwd_is_or_lies_in() -> None:
    assert ancestors("/a/b/c") == ["/a", "/a/b", "/a/b/c"]
    assert ancestors("/a//b/") == ["/a", "/a/", "/a//b", "/a//b/"]
    assert ancestors("/") == ["/"] and ancestors("") == []
    for cwd in ("/t/tree", "/t/tree/src", "/t/tree/", "/t/tree//x"):
        assert "/t/tree" in ancestors(cwd)
    assert "/t/tree" not in ancestors("/t/tree-2") + ancestors("/t/treex/src")


def test_session_create_finds_a_deleted_tree_by_an_index_probe_of_each_ancestor(
    store: Store, tmp_path: Path
) -> None:
    """Before v25 the creating transaction read every `removing`/`removed` tree's plan and
    decoded its JSON (planned through `fork_operations_worktrees`, all of them): the read grew
    with every deleted child for ever, under the write lock."""
    trees = tmp_path / "trees"
    made = _deleted_trees(store, trees, 12)
    rows = store.db.connection().execute(
        "SELECT operation_id, deleted_tree_path, workspace_state FROM fork_operations"
        " WHERE deleted_tree_path IS NOT NULL ORDER BY op_seq"
    )
    assert [(r[0], r[1]) for r in rows] == [(op, str(tree)) for op, tree in made]
    for (op_id, tree), state in ((made[4], "removing"), (made[7], "removed")):
        for cwd in (str(tree), f"{tree}/src", f"{tree}/", f"{tree}/src/.."):
            with pytest.raises(WorkspaceWorktreeDeleted) as refused:
                _create(store, cwd)
            assert refused.value.params == {"path": str(tree), "operationId": op_id, "state": state}
    # A sibling whose name begins with a tree's is not in it.
    _create(store, f"{made[1][1]}x")
    _create(store, str(trees))
    seen: list[tuple[str, tuple[object, ...]]] = []

    def trace(_cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        seen.append((sql, tuple(bindings or ())))  # type: ignore[call-overload]
        return True

    writer = store.db._writer_connection()
    writer.exec_trace = trace
    try:
        _create(store, f"{made[0][1]}-not/src")
    finally:
        writer.exec_trace = None
    reads = [(sql, args) for sql, args in seen if "fork_operations" in sql]
    assert len(reads) == 1, seen
    sql, args = reads[0]
    plan = " | ".join(
        str(r[-1]) for r in store.db.connection().execute("EXPLAIN QUERY PLAN " + sql, args)
    )
    assert "USING INDEX fork_operations_deleted_trees (deleted_tree_path=?)" in plan, plan
    assert "workspace_json" not in sql


def test_a_tree_kept_for_a_user_records_no_deleted_path(store: Store, tmp_path: Path) -> None:
    tree = tmp_path / "trees" / "kept"
    op_id, child = _worktree_child(store, tree)
    user = _create(store, str(tree / "src"))
    assert store.sessions.delete_session(WS, child, removing_tree=op_id) == [user]
    row = store.db.connection().execute(
        "SELECT workspace_state, deleted_tree_path FROM fork_operations WHERE operation_id = ?",
        (op_id,),
    )
    assert row.fetchall() == [("made", None)]
    _create(store, str(tree))  # still made: allowed


def test_a_session_keeps_its_real_cwd_only_when_spelled_otherwise(
    store: Store, tmp_path: Path
) -> None:
    real = tmp_path / "real"
    (real / "src").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    spelled = {
        str(real.resolve()): None,
        str(link): str(real.resolve()),
        f"{real}/src/..": str(real.resolve()),
        f"{real.resolve()}//src": str(real.resolve() / "src"),
    }
    for cwd, kept in spelled.items():
        sid = _create(store, cwd)
        row = store.db.connection().execute(
            "SELECT cwd, real_cwd FROM sessions WHERE session_id = ?", (sid,)
        )
        assert row.fetchall() == [(cwd, kept)]
        assert store.sessions.get_session(WS, sid).cwd == cwd  # the wire's cwd: as given
    assert os.path.realpath(str(real)) == str(real.resolve())


def _v24_with_trees(path: Path) -> list[tuple[str, str | None]]:
    """A v24 store with a fork row in every tree state that matters (written as v24 wrote
    them): each operation and the path v25 must fill (None: none)."""
    conn = operations_only(path, 24)
    conn.execute("INSERT INTO workspaces VALUES (?, 1)", (WS,))
    rows: list[tuple[str, str | None, str | None]] = [
        ("committed", "removing", "/t/removing"),
        ("committed", "removed", "/t/removed"),
        ("committed", "made", None),
        ("failed", "removed", None),
        ("committed", None, None),
    ]
    want: list[tuple[str, str | None]] = []
    for n, (status, state, fill) in enumerate(rows):
        op_id = f"op-{n}"
        bare_operation(conn, n, status, 5, ws=WS, source="src")
        if state is not None:
            conn.execute(
                "UPDATE fork_operations SET workspace_mode = 'worktree', workspace_json = ?,"
                " workspace_state = ? WHERE operation_id = ?",
                (json.dumps({"path": fill or f"/t/other-{n}"}), state, op_id),
            )
        want.append((op_id, fill))
    conn.close()
    return want


def test_v25_fills_the_path_of_every_tree_already_deleted(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    want = _v24_with_trees(path)
    store = Store.open(path)
    try:
        conn = store.db.connection()
        assert user_version(conn) == SCHEMA_VERSION
        got = conn.execute(
            "SELECT operation_id, deleted_tree_path FROM fork_operations ORDER BY op_seq"
        ).fetchall()
        assert [tuple(r) for r in got] == want
        with pytest.raises(WorkspaceWorktreeDeleted):
            _create(store, "/t/removed/src")
        _create(store, "/t/other-2/src")  # `made`: allowed
    finally:
        store.close()


def test_v25_failing_mid_way_leaves_the_v24_store_whole(tmp_path: Path) -> None:
    """The back-fill refused by SQLite (a trigger's ABORT, as a crash mid-way would leave the
    transaction unfinished): the open fails, the store is v24 as it was — no column added —
    and the next open (the trigger gone) migrates it all."""
    path = tmp_path / "store.sqlite3"
    want = _v24_with_trees(path)
    conn = apsw.Connection(str(path))
    conn.execute(
        "CREATE TRIGGER boom BEFORE UPDATE ON fork_operations"
        " BEGIN SELECT RAISE(ABORT, 'refused mid-way'); END"
    )
    conn.close()
    with pytest.raises(apsw.ConstraintError, match="refused mid-way"):
        Store.open(path)
    conn = apsw.Connection(str(path))
    assert user_version(conn) == 24
    assert "deleted_tree_path" not in {
        str(r[1]) for r in conn.execute("PRAGMA table_info(fork_operations)")
    }
    assert "real_cwd" not in {str(r[1]) for r in conn.execute("PRAGMA table_info(sessions)")}
    conn.execute("DROP TRIGGER boom")
    conn.close()
    store = Store.open(path)
    try:
        got = store.db.connection().execute(
            "SELECT operation_id, deleted_tree_path FROM fork_operations ORDER BY op_seq"
        )
        assert [tuple(r) for r in got] == want
    finally:
        store.close()


def test_tree_users_are_found_by_real_path_and_by_a_spelling_a_fork_child_carries(
    store: Store, tmp_path: Path
) -> None:
    """A Session started in a tree through a symlink keeps its real cwd; its shared fork's
    child carries its cwd as spelled and no real cwd: both are the tree's users, and the
    child is found through `sessions_real_cwd` (the Sessions that have one), not by a second
    pass over every Session."""
    tree = tmp_path / "trees" / "owned"
    (tree / "src").mkdir(parents=True)
    op_id, owner = _worktree_child(store, tree)
    link = tmp_path / "to-the-tree"
    link.symlink_to(tree, target_is_directory=True)
    user = _create(store, str(link / "src"))
    store.sessions.update_runtime(
        WS,
        user,
        provider_session_id="prov-user",
        runtime_context={"driverKind": "tutti-agent", "driverVersion": "0.0.10"},
    )
    last = settled_turn(store, user, text="one", provider_turn_id="p1").turn_id
    fork = run_to_commit(
        store,
        store.fork_prepare.prepare_fork(
            WS, request(user, last, runtime_identity={"cwd": str(link / "src")})
        )[0],
    )
    child = str(fork.target_session_id)
    row = store.db.connection().execute(
        "SELECT cwd, real_cwd FROM sessions WHERE session_id = ?", (child,)
    )
    assert row.fetchall() == [(str(link / "src"), None)]
    _create(store, str(tmp_path / "trees" / "owned-not"))  # beside it: not a user
    store.sessions.delete_session(WS, user)  # the child is found by its own spelling
    seen: list[tuple[str, tuple[object, ...]]] = []

    def trace(_cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        seen.append((sql, tuple(bindings or ())))  # type: ignore[call-overload]
        return True

    reader = store.db.connection()
    reader.exec_trace = trace
    try:
        assert store.fork_workspace.tree_users(WS, owner, str(tree)) == [child]
    finally:
        reader.exec_trace = None
    sql, args = next((q, a) for q, a in seen if "FROM sessions" in q)
    plan = " | ".join(str(r[-1]) for r in reader.execute("EXPLAIN QUERY PLAN " + sql, args))
    assert "USING INDEX sessions_real_cwd" in plan, plan
    assert store.sessions.delete_session(WS, owner, removing_tree=op_id) == [child]
