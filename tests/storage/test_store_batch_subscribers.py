"""`Database.subscribe_batches`: one call per delivery with all its events, in commit order —
a COMMIT's events together, an `events_after` block's together at its end, the lazy writes'
held events ahead of the fsync'd COMMIT that covered them — beside the per-event
subscribers, which hear the same events one by one."""

from __future__ import annotations

from pathlib import Path

from storage.models import ChangeEvent, SessionChanged
from storage.store import Store
from tests.storage.test_store_group_commit import WS, _sessions


def _ids(events: list[ChangeEvent]) -> list[str]:
    return [e.session_id for e in events if isinstance(e, SessionChanged)]


def test_a_delivery_is_one_call_in_commit_order(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    batches: list[list[str]] = []
    each: list[str] = []
    try:
        _sessions(store, 3)
        store.db.subscribe_batches(lambda events: batches.append(_ids(events)))
        store.db.subscribe(lambda e: each.extend(_ids([e])))
        store.sessions.update_title(WS, "s0", "one write")
        assert batches == [["s0"]]
        with store.db.events_after():
            with store.db.write(WS, durable=False) as tx:
                tx.emit(SessionChanged(WS, "s1"))
            store.sessions.update_title(WS, "s2", "fsync'd")
            assert batches == [["s0"]]
        assert batches == [["s0"], ["s1", "s2"]]
        assert each == ["s0", "s1", "s2"]
        unsubscribe = store.db.subscribe_batches(lambda events: batches.append(["second"]))
        unsubscribe()
        store.sessions.update_title(WS, "s0", "again")
        assert batches[-1] == ["s0"] and ["second"] not in batches
    finally:
        store.close()


def test_a_failing_batch_subscriber_breaks_no_write_and_no_other_subscriber(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "store.sqlite3")
    each: list[str] = []
    try:
        _sessions(store, 1)

        def broken(events: list[ChangeEvent]) -> None:
            raise RuntimeError("listener bug")

        store.db.subscribe_batches(broken)
        store.db.subscribe(lambda e: each.extend(_ids([e])))
        store.sessions.update_title(WS, "s0", "kept")
        assert store.sessions.get_session(WS, "s0").title == "kept"
        assert each == ["s0"]
    finally:
        store.close()
