"""Every statement the store runs is compiled once per connection, not at each execution: the
connections run with SQLite's query planner stability guarantee (QPSG), so no plan reads a bound
value and a rebinding never expires a cached statement (docs/design/store.md, "Statements
compiled once"). A compilation is what SQLite asks the authorizer about; a cached statement run
again asks nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import apsw

from storage.fork_snapshot import load_boundary
from storage.sqlite import STATEMENT_CACHE_SIZE, open_connection
from storage.store import Store
from tests.storage.store_builders import new_session, settled_turn

WS = "ws-statement-reuse"


@contextmanager
def compilations(conn: apsw.Connection) -> Iterator[list[int]]:
    """The authorizer actions SQLite asks about while `conn` compiles statements (a cached
    statement run again asks nothing). Setting an authorizer expires every prepared statement,
    so the first round after it compiles each statement once more."""
    compiled: list[int] = []

    def authorizer(op: int, *_: object) -> int:
        compiled.append(op)
        return apsw.SQLITE_OK

    conn.authorizer = authorizer
    try:
        yield compiled
    finally:
        conn.authorizer = None


def test_every_connection_runs_with_the_planner_stability_guarantee(tmp_path: Path) -> None:
    conn = open_connection(str(tmp_path / "s.sqlite3"))
    try:
        assert conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, -1) == 1
    finally:
        conn.close()


def _turn(store: Store, sid: str, i: int) -> None:
    turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), f"hello {i}")
    with store.db.write_batch():
        reply = store.history.append_message(
            WS, sid, turn.turn_id, kind="assistant", text="reply", payload={}
        )
        store.turns.record_settlement(
            WS, sid, turn.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id,
            checkpoint_json='{"state":"unavailable"}',
            turn=replace(turn, messages=(*turn.messages, reply)),
        )  # fmt: skip
    store.sessions.update_title(WS, sid, f"title {i}")


def test_a_warm_turns_statements_are_not_compiled_again(tmp_path: Path) -> None:
    """A Turn's claim (its read has a MAX under an equality on bound values: compiled again at
    every execution without QPSG), its reply and settlement, and a rename: after a few Turns,
    the next Turns compile nothing on the writer's connection."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        sid = store.sessions.create_session(
            WS, session_id="s1", provider="tutti-agent", title="t", cwd="/", settings={}
        ).session_id
        for i in range(4):
            _turn(store, sid, i)
        with compilations(store.db._writer_connection()) as compiled:
            _turn(store, sid, 4)  # compiles each statement once more (the authorizer expired it)
            assert compiled  # the counter sees compilations
            compiled.clear()
            for i in range(5, 9):
                _turn(store, sid, i)
        assert compiled == []
    finally:
        store.close()


def test_the_boundary_read_of_a_session_not_read_before_compiles_nothing(tmp_path: Path) -> None:
    """A fork's boundary read (`load_boundary`, its Turns found by the Session's key) is one
    statement text for every Session: the first fork of a Session not forked before compiles
    nothing on a warm connection, and takes no second entry of its statement cache (with the
    key written into the text each new Session compiled one and evicted another)."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        sources = []
        for _ in range(8):
            sid = new_session(store, WS)
            sources.append((sid, settled_turn(store, sid, WS).turn_id))
        conn = store.db.connection()
        try:
            with compilations(conn) as compiled:  # the first read compiles
                for sid, turn_id in sources[:2]:
                    load_boundary(conn, WS, sid, turn_id, messages=False)
                assert compiled
                compiled.clear()
                misses = conn.cache_stats()["misses"]
                for sid, turn_id in sources[2:]:
                    assert load_boundary(conn, WS, sid, turn_id, messages=False).turns
                assert conn.cache_stats()["misses"] == misses
        finally:
            store.db.release_thread_connection()
        assert compiled == []
    finally:
        store.close()


def _bind(store: Store, sid: str, provider_session_id: str) -> None:
    store.sessions.update_runtime(
        WS,
        sid,
        provider_session_id=provider_session_id,
        runtime_context={"driverKind": "tutti-agent", "driverVersion": "0.0.10"},
    )


def test_a_statement_run_again_after_a_few_hundred_executions_is_not_compiled_again(
    tmp_path: Path,
) -> None:
    """apsw's statement cache is a ring each execution re-enters: a statement not run within the
    last `STATEMENT_CACHE_SIZE` executions is compiled again (at apsw's default, 100, a fork
    after three Turns compiled 31 of its statements again). A rename after ten Turns (~230 of
    the writer's executions) compiles nothing."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        sid = store.sessions.create_session(
            WS, session_id="s1", provider="tutti-agent", title="t", cwd="/", settings={}
        ).session_id
        conn = store.db._writer_connection()
        with compilations(conn) as compiled:  # the first round compiles
            _turn(store, sid, 0)
            _bind(store, sid, "warm")
            assert compiled
            compiled.clear()
            hits = conn.cache_stats()["hits"]
            for i in range(1, 13):
                _turn(store, sid, i)
            assert compiled == []
            assert 100 < conn.cache_stats()["hits"] - hits < STATEMENT_CACHE_SIZE
            _bind(store, sid, "after twelve Turns")
        assert compiled == []
    finally:
        store.close()


def _misses(store: Store) -> int:
    """Statement-cache misses over every connection of the store's pool (writer and readers)."""
    return sum(c.cache_stats()["misses"] for c in store.db._connections)


def test_timeline_pages_of_a_few_more_turns_compile_nothing(tmp_path: Path) -> None:
    """A page's Messages and Interactions are read with an IN list of its Turns, padded to the
    next power of two: a Session read at 5, 6, 7 and 8 Turns runs one text of each statement
    (unpadded, a text and a compilation per number of Turns, on every reader)."""
    store = Store.open(tmp_path / "store.sqlite3")
    try:
        sid = new_session(store, WS)
        for _ in range(5):
            settled_turn(store, sid, WS)
        first = store.history.timeline_page(WS, sid)
        assert len(first.turn_rows) == 5
        misses = _misses(store)
        for n in (6, 7, 8):
            turn = settled_turn(store, sid, WS)
            page = store.history.timeline_page(WS, sid)
            assert len(page.turn_rows) == n
            assert [m[0] for m in page.message_rows[turn.turn_id]] == [
                m.message_id for m in turn.messages
            ]
        assert _misses(store) == misses
    finally:
        store.close()
