"""The title a fork child is minted with (seed 000 §5): `<source title> (<n>)`, where `n` is
this fork's ordinal among the valid forks of that same source, the first child being `(2)`.

A valid fork is one that is not `failed` or `abandoned` (neither ever became a child), so a
failed or abandoned attempt does not use up a number. A fork of a fork stacks the suffix
(`Trip (2)` forks to `Trip (2) (2)`); a shorter label is a client's to draw from the lineage.
"""

from __future__ import annotations

from typing import Any

from domain.fork_states import NOT_A_FORK_SQL


def child_title(conn: Any, ws: str, source_session_id: str, source_title: str) -> str:
    """`conn` is the prepare transaction's connection; the count reads the source's operations
    inside it, so two forks of one source never mint the same number."""
    row = conn.execute(
        "SELECT COUNT(*) FROM fork_operations WHERE workspace_id = ? AND source_session_id = ?"
        f" AND status NOT IN {NOT_A_FORK_SQL}",
        (ws, source_session_id),
    ).fetchone()
    return f"{source_title} ({(int(row[0]) if row else 0) + 2})"
