"""The boundary digest hashed as its rows stream (storage/history_links.py `_digest_pass`) on real
SQLite files: byte for byte the digest SQLite's one `group_concat` of every line gave — what the
snapshots frozen by earlier builds hold and their commits re-prove — whatever the chunk's edge,
the cut, the texts and payloads; and the pass never holds the boundary's whole text."""

from __future__ import annotations

import hashlib
import tracemalloc
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn

from storage import history_links
from storage.history_links import digest_pass, history_digest
from storage.store import Store

pytestmark = pytest.mark.timeout(60)

# The digest statement of the builds before the stream, verbatim: every line joined by SQLite's
# `group_concat` into one value, hashed whole. `{cut}` as in storage/history_links.py.
_GROUP_CONCAT_DIGEST = (
    "SELECT count(*), CAST(group_concat(r, char(10)) AS BLOB), max(p),"
    " group_concat(p) FILTER (WHERE s) FROM (SELECT"
    " concat(m.position, ',', m.version, ',', m.turn_id, ',', m.message_id, ',', m.kind, ',',"
    " ifnull(octet_length(m.text), -1), ':', m.text, ',', octet_length(m.payload_json), ':',"
    " m.payload_json) AS r, m.position AS p,"
    " (m.payload_json != '{{}}' OR m.kind = 'descendant_lane') AS s"
    " FROM messages m WHERE m.session_key = (SELECT session_key FROM session_keys"
    " WHERE workspace_id = ?1 AND session_id = ?2) AND {cut} ORDER BY m.position)"
)
_THROUGH = (
    "+m.turn_id IN (SELECT turn_id FROM turns WHERE workspace_id = ?1 AND session_id = ?2"
    " AND sequence <= ?3)"
)
_WHOLE = "+m.turn_id IS NOT NULL"


def _group_concat_pass(
    conn: apsw.Connection, sid: str, through: int, *, whole: bool
) -> tuple[int, str, int, list[int]]:
    sql = _GROUP_CONCAT_DIGEST.format(cut=_WHOLE if whole else _THROUGH)
    row = conn.execute(sql, (WS, sid) if whole else (WS, sid, through)).fetchone()
    joined = b"" if row[1] is None else bytes(row[1])
    special = [int(p) for p in str(row[3]).split(",")] if row[3] is not None else []
    return int(row[0]), hashlib.sha256(joined).hexdigest(), int(row[2] or 0), special


_ODD_TEXTS: list[str | None] = [
    "",
    None,
    "é\nx",
    "línea,con:comas:y\ndos\nsaltos",
    "日本語のテキスト 🧪🚀 e\u0301 \u202eRTL\u202c",
    "\\n not a newline, \"quoted\", 'single'",
    "1:2,3:4",
    "x" * 5000,
    "\t\r\n",
]
_ODD_PAYLOADS: list[dict[str, Any]] = [
    {},
    {"k": 1},
    {"nested": {"ünï": ["ç", 2.5, None, True]}, "emoji": "🎉"},
    {"text": "a,b:c\nd", "n": -7},
    {"toolCallMessageId": None},
]


@pytest.fixture
def odd_source(store: Store) -> tuple[str, int]:
    """A Session of many Turns whose Messages have every kind of text and payload the digest
    prints (empty, NULL, multi-byte, separators inside), a Session-level Message between two
    Turns (in no boundary) and a streamed update (version 2). Returns (Session, Turn count)."""
    sid = new_session(store)
    turns = 0
    for i in range(40):
        extra = [
            (
                "reasoning" if n % 2 else "tool_call",
                _ODD_TEXTS[(i + n) % len(_ODD_TEXTS)] or "",
                _ODD_PAYLOADS[(i * 3 + n) % len(_ODD_PAYLOADS)],
            )
            for n in range(i % 4)
        ]
        turn = settled_turn(store, sid, text=f"turn {i} ✓", extra=extra)
        turns += 1
        if i == 7:
            store.history.append_message(WS, sid, None, kind="notice", text="session-level")
        if i == 11:
            msg = store.history.append_message(WS, sid, turn.turn_id, kind="note", text="v1")
            store.history.append_message(
                WS, sid, turn.turn_id, kind="note", text="v2 ⏎", message_id=msg.message_id
            )
    # A NULL text and an empty one, which the store's paths write as given.
    conn = store.db.connection()
    with store.db.write(WS) as tx:
        tx.execute(
            "UPDATE messages SET text = NULL WHERE session_id = ? AND kind = 'reasoning'"
            " AND position % 3 = 0",
            (sid,),
        )
        tx.execute(
            "UPDATE messages SET text = '' WHERE session_id = ? AND kind = 'tool_call'"
            " AND position % 5 = 0",
            (sid,),
        )
    assert conn.execute(
        "SELECT count(*) FROM messages WHERE session_id = ? AND text IS NULL", (sid,)
    ).fetchone()[0]
    return sid, turns


@pytest.mark.parametrize("chunk", [1, 7, 50, history_links.DIGEST_CHUNK])
def test_the_streamed_digest_is_byte_for_byte_the_group_concat_digest(
    store: Store, odd_source: tuple[str, int], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Count, digest, highest position and the positions prepare looks at, through the last Turn
    (every Message of a Turn) and through earlier ones (the Turn list's cut), with chunks that
    split the lines anywhere: each equal to what the whole `group_concat` gave. A byte added,
    lost or moved at a chunk's edge changes the SHA-256."""
    monkeypatch.setattr(history_links, "DIGEST_CHUNK", chunk)
    sid, turns = odd_source
    conn = store.db.connection()
    for through in (1, 2, 13, turns - 1, turns):
        whole = through == turns
        expected = _group_concat_pass(conn, sid, through, whole=whole)
        assert expected[0] > 0
        assert digest_pass(conn, WS, sid, through) == expected
        assert history_digest(conn, WS, sid, through) == expected[:2]
    assert len(_group_concat_pass(conn, sid, turns, whole=True)[3]) > 10


def test_an_empty_boundary_digests_no_bytes(store: Store) -> None:
    """A boundary with no Message (a Session without a key has none): count 0, the SHA-256 of
    nothing, as the `group_concat` of no row (NULL) gave."""
    sid = new_session(store)
    conn = store.db.connection()
    assert digest_pass(conn, WS, sid, 1) == (0, hashlib.sha256(b"").hexdigest(), 0, [])


def test_the_digest_pass_never_holds_the_boundarys_whole_text(store: Store) -> None:
    """A boundary of ~8 MB of lines (32,768 Messages): the pass's Python allocations peak at a
    few chunks' worth, not at the whole text (which a single `group_concat` value copied into
    Python was, and SQLite's own buffer of it before that)."""
    sid = new_session(store)
    turn = settled_turn(store, sid, text="big").turn_id
    with store.db.write(WS) as tx:
        tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 32768)"
            " INSERT INTO messages (workspace_id, session_id, message_id, turn_id, kind, text,"
            " payload_json, version, position, created_at_ms, session_key)"
            " SELECT ?1, ?2, printf('bulk-%08d', i), ?3, 'reasoning', printf('%0160d', i), '{}',"
            " 1, 1000 + i, 0, (SELECT session_key FROM session_keys WHERE workspace_id = ?1"
            " AND session_id = ?2) FROM n",
            (WS, sid, turn),
        )
    conn = store.db.connection()
    expected = _group_concat_pass(conn, sid, 1, whole=True)
    text_bytes = 32768 * 240  # each line: ~160 bytes of text, two ids, the lengths, `{}`
    tracemalloc.start()
    try:
        found = digest_pass(conn, WS, sid, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == expected
    assert peak < text_bytes / 4, f"peak {peak:,} bytes for ~{text_bytes:,} of lines"
