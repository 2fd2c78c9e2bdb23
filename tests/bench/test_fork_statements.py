"""`bench.fork_statements` writes a statement's bound values into its text as SQL literals (what
its bound / literal comparison runs): numbered and plain parameters, quotes, NULLs, blobs."""

from __future__ import annotations

import apsw

from bench.fork_statements import with_literals


def test_numbered_and_plain_parameters_become_the_literals_sqlite_reads_back() -> None:
    numbered = with_literals("SELECT ?2, ?1, ?2", ("a", 7))
    plain = with_literals("SELECT ?, ?, ?, ?", ("it's", None, 2.5, b"\x00\xff"))
    assert numbered == "SELECT 7, 'a', 7"
    assert plain is not None
    conn = apsw.Connection(":memory:")
    assert conn.execute(plain).fetchall() == [("it's", None, 2.5, b"\x00\xff")]
    assert with_literals("SELECT :name", {"name": 1}) is None  # named bindings: not rewritten
