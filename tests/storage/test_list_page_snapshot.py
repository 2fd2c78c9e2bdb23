"""A `session.list` page is read from one snapshot: its byte bound is measured on the rows the
page then holds. The sizes and the Sessions were once two statements with a snapshot each, so
a Session deleted between them let an unmeasured one into the page, past its byte bound (the
`list_pages` law of the soaks' readers, docs/reliability.md)."""

from __future__ import annotations

from typing import Any

import apsw

from storage.store import Store

WS = "ws"
BIG = {"blob": "x" * 30_000}


def test_a_delete_between_the_sizes_and_the_rows_cannot_push_a_page_past_its_bound(
    store: Store,
) -> None:
    for sid, settings in (("a", {}), ("b", BIG), ("c", BIG)):
        store.sessions.create_session(
            WS, session_id=sid, provider="p", title=sid, cwd="/", settings=settings
        )
    # Another writer deletes `a` once the sizes were read, just before the statement that
    # reads the page's Sessions whole runs (its own connection to the same file, as another
    # client's request would).
    other = apsw.Connection(str(store.path))
    sized: list[str] = []

    def trace(_cursor: Any, sql: str, _bindings: Any) -> bool:
        if "length(s.settings_json)" in sql:
            sized.append(sql)
        elif sized and sql.lstrip().upper().startswith("SELECT") and len(sized) == 1:
            sized.append(sql)
            other.execute("UPDATE sessions SET deleted = 1 WHERE session_id = 'a'")
        return True

    conn = store.db.connection()  # the store's calls on this thread lease this connection
    conn.exec_trace = trace
    try:
        page, cursor = store.sessions.list_sessions(WS, limit=200, max_bytes=50_000)
    finally:
        conn.exec_trace = None
        store.db.release_thread_connection()
        other.close()
    assert len(sized) == 2  # the delete ran between the sizes and the page
    # `a` and `b` fit (30 KB), `c` would not: the page is what the snapshot held, `a` and `b`,
    # never `b` and `c` (60 KB, over the bound).
    assert [s.session_id for s in page] == ["a", "b"], [s.session_id for s in page]
    assert cursor is not None
