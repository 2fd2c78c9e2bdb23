"""The SELECTs SQLite runs inside a block, on every connection opened in it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import apsw


@contextmanager
def traced_selects() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Every SELECT a connection opened inside the block runs, with its bindings."""
    seen: list[tuple[str, tuple[Any, ...]]] = []

    def hook(conn: apsw.Connection) -> None:
        def trace(_cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
            if sql.lstrip().upper().startswith("SELECT"):
                seen.append((sql, tuple(bindings or ())))
            return True

        conn.exec_trace = trace

    apsw.connection_hooks.append(hook)
    try:
        yield seen
    finally:
        apsw.connection_hooks.remove(hook)
