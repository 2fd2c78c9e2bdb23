"""The title a fork child is minted with (seed 000: `<source title> (<n>)`).

- **First level** (the source is not itself a fork child, or its title does not end in
  ` (<k>)`): `<source title> (<n>)` with `n = 2 + (non-failed operations of that source)` —
  the first child is `(2)`, a failed attempt does not consume a number (seed 000, unchanged).
- **Deeper** (the source is a fork child whose title is `<base> (<k>)`): the suffix is not
  stacked (no `Trip (2) (2)`); the child is `<base> (<m>)` where `m` is one more than the
  highest `<k>` of any Session (deleted ones included) or non-failed operation target of the
  workspace titled `<base> (<k>)`. A fork of `Trip (2)` is `Trip (3)` when `Trip (3)` is free.
"""

from __future__ import annotations

import re
from typing import Any

_SUFFIX = re.compile(r"^(?P<base>.*) \((?P<n>\d+)\)$", re.DOTALL)


def child_title(conn: Any, ws: str, source_title: str, source_is_fork: bool, ordinal: int) -> str:
    """`conn` is the prepare transaction's connection; `ordinal` the first-level number."""
    match = _SUFFIX.match(source_title) if source_is_fork else None
    if match is None:
        return f"{source_title} ({ordinal})"
    base = match.group("base")
    prefix = f"{base} ("
    titles = [
        str(row[0])
        for row in conn.execute(
            "SELECT title FROM sessions WHERE workspace_id = ? AND substr(title, 1, ?) = ?"
            " UNION ALL SELECT target_title FROM fork_operations WHERE workspace_id = ?"
            " AND status != 'failed' AND substr(target_title, 1, ?) = ?",
            (ws, len(prefix), prefix, ws, len(prefix), prefix),
        )
    ]
    highest = int(match.group("n"))
    for title in titles:
        found = _SUFFIX.match(title)
        if found is not None and found.group("base") == base:
            highest = max(highest, int(found.group("n")))
    return f"{base} ({highest + 1})"
