"""The boundary digest hashed inside SQLite (`storage/line_digest.py`, `native/line_digest.c`):
`sha256_lines(x)` is byte for byte the SHA-256 of `group_concat(x, char(10))` (NULL rows, empty
and multi-byte values, numbers, blobs with a NUL, values past its 64 KiB buffer, no row); the
store's digest pass gives the digest the `group_concat` string hashed in Python gives, through
every Turn of a Session with awkward texts; and the pass holds no string of the boundary's lines
in Python."""

from __future__ import annotations

import hashlib
import shutil
import tracemalloc
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn

from storage import history_links, line_digest
from storage.store import Store

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
    ),
]


def _native(conn: apsw.Connection) -> apsw.Connection:
    assert line_digest.hashes_in_sqlite(conn), line_digest._state["unavailable"]
    return conn


def _joined_digest(conn: apsw.Connection, values_sql: str) -> str:
    joined = conn.execute(f"SELECT CAST(group_concat(x, char(10)) AS BLOB) FROM ({values_sql})")
    row = joined.fetchone()
    assert row is not None
    return hashlib.sha256(b"" if row[0] is None else bytes(row[0])).hexdigest()


@pytest.mark.parametrize(
    "values_sql",
    [
        "SELECT 'a' AS x",
        "SELECT NULL AS x WHERE 0",  # no row
        "SELECT NULL AS x",  # only NULL: group_concat's NULL, hashed as no bytes
        "SELECT column1 AS x FROM (VALUES (NULL), ('a'), (NULL), (''), ('b'), (''), (NULL))",
        "SELECT column1 AS x FROM (VALUES ('é,中:😀'), ('line\nbreak'), (', : ,'), ('-1:'))",
        "SELECT column1 AS x FROM (VALUES (1), (-7), (2.5), (1e300), (0), (x'00ff41'))",
        "SELECT CAST(x'610062' AS TEXT) AS x",  # a text with a NUL inside
        "SELECT 'y' || zeroblob(0) AS x UNION ALL SELECT printf('%.*c', 70000, 'z')"
        " UNION ALL SELECT printf('%.*c', 65535, 'w') UNION ALL SELECT 'tail'",
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5000)"
        " SELECT printf('%d,%s', x, hex(x)) AS x FROM n",
    ],
)
def test_sha256_lines_is_the_digest_of_group_concat_with_newlines(
    store: Store, values_sql: str
) -> None:
    conn = _native(store.db.connection())
    row = conn.execute(f"SELECT sha256_lines(x) FROM ({values_sql})").fetchone()
    assert row is not None
    assert row[0] == _joined_digest(conn, values_sql)


def _awkward_session(store: Store) -> tuple[str, list[int]]:
    """A Session whose Messages' texts are NULL, empty, multi-byte, full of the line's own
    separators, or longer than the extension's buffer; some payloads not empty; a Message of no
    Turn between them. Returns the Session and its Turns' sequences."""
    sid = new_session(store, title="awkward")
    texts: list[Any] = ["", "é中😀", "a,b:c\nd", "-1:", "12:x,y", "x" * 70_000, "tail"]
    sequences = []
    for i, text in enumerate(texts):
        turn = settled_turn(
            store,
            sid,
            text=f"t{i}",
            extra=[("reasoning", text, {"k": i} if i % 2 else {}), ("note", "n", {})],
        )
        sequences.append(turn.sequence)
        if i == 2:
            store.history.append_message(WS, sid, None, kind="notice", text="session-level")
    conn = store.db.connection()
    # A NULL text, as an older build or raw SQL may have left one (the store writes text).
    conn.execute(
        "UPDATE messages SET text = NULL WHERE workspace_id = ? AND session_id = ?"
        " AND kind = 'note' AND rowid = (SELECT min(rowid) FROM messages WHERE workspace_id = ?"
        " AND session_id = ? AND kind = 'note')",
        (WS, sid, WS, sid),
    )
    return sid, sequences


def test_the_pass_hashed_in_sqlite_freezes_the_digest_python_hashed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, sequences = _awkward_session(store)
    conn = _native(store.db.connection())
    in_sqlite = {t: history_links.digest_pass(conn, WS, sid, t) for t in sequences}
    with monkeypatch.context() as m:
        m.setattr(line_digest, "hashes_in_sqlite", lambda _conn: False)
        in_python = {t: history_links.digest_pass(conn, WS, sid, t) for t in sequences}
    assert in_sqlite == in_python
    # ... and both are the lines as the digest's law spells them.
    rows = conn.execute(
        "SELECT m.position, m.version, m.turn_id, m.message_id, m.kind, m.text, m.payload_json,"
        " t.sequence FROM messages m JOIN turns t ON t.workspace_id = m.workspace_id"
        " AND t.session_id = m.session_id AND t.turn_id = m.turn_id"
        " WHERE m.workspace_id = ? AND m.session_id = ? ORDER BY m.position",
        (WS, sid),
    ).fetchall()
    assert any(r[5] is None for r in rows)
    for through in sequences:
        lines = []
        for position, version, turn, mid, kind, text, payload, sequence in rows:
            if sequence > through:
                continue
            body = "-1:" if text is None else f"{len(text.encode())}:{text}"
            lines.append(
                f"{position},{version},{turn},{mid},{kind},{body},{len(payload.encode())}:{payload}"
            )
        expected = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        assert in_sqlite[through][:2] == (len(lines), expected)


def test_the_digest_pass_holds_no_string_of_the_boundarys_lines(store: Store) -> None:
    """The lines are hashed as SQLite makes them: the pass's Python peak stays far below the
    boundary's joined size (the `group_concat` string was copied into Python whole)."""
    sid = new_session(store, title="big")
    last = 0
    for i in range(8):
        last = settled_turn(
            store, sid, text=f"t{i}", extra=[("reasoning", "r" * 500_000, {})]
        ).sequence
    conn = _native(store.db.connection())
    tracemalloc.start()
    try:
        count, _, _, _ = history_links.digest_pass(conn, WS, sid, last)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 24
    assert peak < 1_000_000, f"the digest pass peaked at {peak:,} bytes of Python memory"


def test_turned_off_the_pass_hashes_in_python_to_the_same_digest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`AGENTHOST_NO_LINE_DIGEST=1` (as where no compiler or OpenSSL headers build it): no
    extension loaded, the `group_concat` statement and Python's hash, the same value."""
    sid, sequences = _awkward_session(store)
    expected = history_links.digest_pass(_native(store.db.connection()), WS, sid, sequences[-1])
    monkeypatch.setenv(line_digest.OPT_OUT, "1")
    monkeypatch.setattr(line_digest, "_state", {"library": None, "unavailable": None})
    monkeypatch.setattr(line_digest, "_loaded", type(line_digest._loaded)())
    conn = store.db.connection()
    seen: list[str] = []
    conn.trace_v2(apsw.SQLITE_TRACE_STMT, lambda event: seen.append(str(event["sql"])))
    try:
        assert history_links.digest_pass(conn, WS, sid, sequences[-1]) == expected
    finally:
        conn.trace_v2(0, None)
    assert not line_digest.hashes_in_sqlite(conn)
    assert line_digest._state["unavailable"] == f"turned off ({line_digest.OPT_OUT}=1)"
    assert any("group_concat(r, char(10))" in sql for sql in seen)
    assert not any("sha256_lines(" in sql for sql in seen)
