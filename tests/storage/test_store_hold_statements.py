"""What a writer runs inside the writer's baton, counted: a member of a group or a write of a
batch that landed runs no `RELEASE` of its savepoint (the group's COMMIT ends every savepoint
still open), and one that fails still rolls back alone — to its own savepoint, the newest of
its name — with the members and writes around it landing. Each SQLite call inside the baton
lets the interpreter go while the queued writers wait (docs/performance.md, baton)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
from store_builders import writer_statements

from domain.errors import SessionNotFound
from storage.store import Store
from tests.storage.test_store_group_commit import WS, _behind_a_held_write, _sessions

pytestmark = pytest.mark.timeout(60)


def _titles(observer: apsw.Connection) -> list[str]:
    return [r[0] for r in observer.execute("SELECT title FROM sessions ORDER BY session_id")]


def test_landed_members_release_nothing_and_a_failing_one_rolls_back_alone(
    tmp_path: Path,
) -> None:
    """Four bodies combined into one group behind a held write: the first, second and fourth
    land, the third fails after its UPDATE; one COMMIT, no `RELEASE` but the failing one's,
    and the failing one's UPDATE alone undone."""
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    observer = apsw.Connection(str(path))
    store.db.group_max_age_s = 60.0  # one group however slow the machine (not the age bound)
    try:
        _sessions(store, 5)

        def rename(sid: str, title: str, fail: bool = False) -> None:
            def body(tx: object) -> None:
                store.db._writer_connection().execute(
                    "UPDATE sessions SET title = ? WHERE session_id = ?", (title, sid)
                )
                if fail:
                    raise SessionNotFound("deliberate failure after a write")

            store.db.submit_write(body, WS)

        before = store.db.write_stats.snapshot()
        with writer_statements(store) as ran:
            errors = _behind_a_held_write(
                store,
                [
                    lambda: rename("s1", "one"),
                    lambda: rename("s2", "two"),
                    lambda: rename("s3", "three", fail=True),
                    lambda: rename("s4", "four"),
                ],
            )
        after = store.db.write_stats.snapshot()
        assert [type(e) for e in errors] == [SessionNotFound]
        assert after["commits"] - before["commits"] == 1, ran
        assert after["combined"] - before["combined"] == 3
        releases = [s for s in ran if s.startswith("RELEASE")]
        assert releases == ["RELEASE agenthost_write"], ran  # the failing member's, alone
        assert sum(1 for s in ran if s.startswith("ROLLBACK TO")) == 1
        assert _titles(observer) == ["held", "one", "two", "s3", "four"]
    finally:
        observer.close()
        store.close()


def test_a_batchs_landed_writes_release_nothing(tmp_path: Path) -> None:
    """A batch of three writes, the second failing: two `SAVEPOINT`s landed and never
    released, the failing one rolled back to and released alone; the first and third land."""
    path = tmp_path / "store.sqlite3"
    store = Store.open(path)
    observer = apsw.Connection(str(path))
    try:
        _sessions(store, 3)
        with writer_statements(store) as ran, store.db.write_batch():
            store.sessions.update_title(WS, "s0", "one")
            with pytest.raises(SessionNotFound), store.db.write(WS) as tx:
                tx.execute("UPDATE sessions SET title = 'half' WHERE session_id = 's1'")
                raise SessionNotFound("deliberate failure after a write")
            store.sessions.update_title(WS, "s2", "three")
        assert [s for s in ran if s.startswith("RELEASE")] == ["RELEASE agenthost_item"], ran
        assert sum(1 for s in ran if s.startswith("SAVEPOINT")) == 3, ran
        assert _titles(observer) == ["one", "s1", "three"]
    finally:
        observer.close()
        store.close()
