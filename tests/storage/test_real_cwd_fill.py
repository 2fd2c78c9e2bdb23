"""Sessions created before schema v25 kept no real cwd (its migration reads no file system):
the v26 step gives each live one whose cwd is spelled otherwise than its real path (a symlink,
`..`) its real path, once, so who works in a tree is asked by real path for them too. A cwd
that no longer exists keeps NULL (compared as given), a cwd that is its own real path stays
NULL, a deleted Session is left as it is, and a store already at v26 is not read again."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_builders import WS

from storage.schema import SCHEMA_VERSION, migrate, user_version
from storage.sqlite import open_connection
from storage.store import Store
from tests.support.old_store import v24_store

pytestmark = pytest.mark.timeout(30)


def real_cwds(store: Store) -> dict[str, str | None]:
    rows = store.db.rows("SELECT session_id, real_cwd FROM sessions WHERE workspace_id = ?", (WS,))
    return {str(sid): real for sid, real in rows}


@pytest.mark.parametrize("found", [24, 25])
def test_an_older_sessions_symlinked_cwd_is_filled_and_seen_as_a_user_of_its_tree(
    tmp_path: Path, found: int
) -> None:
    """`found`: the version the store is at when this build opens it (a v25 store's older rows
    kept no real cwd either)."""
    tree = tmp_path / "trees" / "fork-1"
    (tree / "src").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tree, target_is_directory=True)
    gone = tmp_path / "gone"
    gone.mkdir()
    cwds = {
        "linked": f"{link}/src",  # in the tree through a symlink
        "linked-too": f"{link}/src",  # the same cwd again
        "dotted": f"{tree}/src/..",  # the tree itself, spelled with `..`
        "plain": str(tree / "src"),  # its own real path
        "gone": str(gone),  # removed below: keeps NULL
        "deleted": str(link),  # deleted below: left as it is
    }
    path = tmp_path / "store.sqlite3"
    v24_store(path, WS, cwds)
    conn = open_connection(str(path))
    conn.execute("UPDATE sessions SET deleted = 1 WHERE session_id = 'deleted'")
    migrate(conn, target=found)
    conn.close()
    gone.rmdir()
    store = Store.open(path)
    try:
        assert user_version(store.db.connection()) == SCHEMA_VERSION
        assert real_cwds(store) == {
            "linked": str(tree / "src"),
            "linked-too": str(tree / "src"),
            "dotted": str(tree),
            "plain": None,
            "gone": None,
            "deleted": None,
        }
        users = store.fork_workspace.tree_users(WS, "owner", str(tree))
        assert set(users) == {"linked", "linked-too", "dotted", "plain"}, users
    finally:
        store.close()


def test_a_store_already_filled_is_not_filled_again(tmp_path: Path) -> None:
    """Once at v26 the step does not run again: a Session whose cwd became a symlink later
    (not one `session.create` made: a row written as an older build would) stays as it is."""
    tree = tmp_path / "tree"
    tree.mkdir()
    path = tmp_path / "store.sqlite3"
    v24_store(path, WS, {"old": str(tmp_path / "later")})
    Store.open(path).close()  # v26: `later` does not exist yet, NULL kept
    (tmp_path / "later").symlink_to(tree, target_is_directory=True)
    store = Store.open(path)
    try:
        assert real_cwds(store) == {"old": None}
    finally:
        store.close()
