"""A daemon started on a store from before schema v25 fills the real cwd of its Sessions as it
opens it (the v26 step, before start-up removes any tree): a Session started in a fork's tree
through a symlink under the older build is seen as the tree's user."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import WS
from tests.support.in_process import in_process_daemon
from tests.support.old_store import v24_store

pytestmark = pytest.mark.timeout(60)


def test_a_daemon_started_on_a_v24_store_sees_a_symlinked_session_as_its_trees_user(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "trees" / "fork-1"
    tree.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tree, target_is_directory=True)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    v24_store(home / "store.sqlite3", WS, {"linked": str(link)})
    with in_process_daemon(home) as (daemon, _c):
        assert daemon.store is not None
        assert daemon.store.fork_workspace.tree_users(WS, "owner", str(tree)) == ["linked"]
