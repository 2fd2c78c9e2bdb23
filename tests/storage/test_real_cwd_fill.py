"""Sessions created before schema v25 kept no real cwd (a migration reads no file system):
`SessionStore.fill_real_cwds`, run by the daemon at start, gives each live one whose cwd is
spelled otherwise than its real path (a symlink, `..`) its real path, so who works in a tree
is asked by real path for them too. A cwd that no longer exists keeps NULL (compared as
given), a cwd that is its own real path stays NULL, and a second fill changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_builders import WS

from storage.sqlite import open_connection
from storage.store import Store
from tests.support.old_store import v24_store

pytestmark = pytest.mark.timeout(30)


def real_cwds(store: Store) -> dict[str, str | None]:
    rows = store.db.rows("SELECT session_id, real_cwd FROM sessions WHERE workspace_id = ?", (WS,))
    return {str(sid): real for sid, real in rows}


def test_a_v24_sessions_symlinked_cwd_is_filled_and_seen_as_a_user_of_its_tree(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "trees" / "fork-1"
    (tree / "src").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tree, target_is_directory=True)
    gone = tmp_path / "gone"
    gone.mkdir()
    cwds = {
        "linked": f"{link}/src",  # in the tree through a symlink
        "dotted": f"{tree}/src/..",  # the tree itself, spelled with `..`
        "plain": str(tree / "src"),  # its own real path
        "gone": str(gone),  # removed below: keeps NULL
    }
    path = tmp_path / "store.sqlite3"
    v24_store(path, WS, cwds)
    gone.rmdir()
    store = Store.open(path)
    try:
        users = store.fork_workspace.tree_users(WS, "owner", str(tree))
        assert "linked" not in users  # compared as given: not in the tree
        assert store.sessions.fill_real_cwds(batch=2) == 2  # pages smaller than the rows
        assert real_cwds(store) == {
            "linked": str(tree / "src"),
            "dotted": str(tree),
            "plain": None,
            "gone": None,
        }
        users = store.fork_workspace.tree_users(WS, "owner", str(tree))
        assert {"linked", "dotted", "plain"} <= set(users), users
        assert "gone" not in users
        assert store.sessions.fill_real_cwds() == 0  # idempotent
    finally:
        store.close()


def test_a_deleted_session_is_not_filled(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    link = tmp_path / "link"
    link.symlink_to(tree, target_is_directory=True)
    path = tmp_path / "store.sqlite3"
    v24_store(path, WS, {"old": str(link)})
    conn = open_connection(str(path))
    conn.execute("UPDATE sessions SET deleted = 1")
    conn.close()
    store = Store.open(path)
    try:
        assert store.sessions.fill_real_cwds() == 0
        assert real_cwds(store) == {"old": None}
    finally:
        store.close()
