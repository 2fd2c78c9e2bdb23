"""Rule v2's child ids: the id Python computes (`ordinal_id`, `ordinal_ids`, `ordinal_identity`)
is, character for character, the id SQLite's copy statement writes (`ordinal_id_sql`) and the
rule's definition (the prefix's first 8 hex digits scrambled by the ordinal, then the ordinal as
12 hex digits, a negative one as its 64-bit two's complement) — at the edges of 32 and 64 bits."""

from __future__ import annotations

import apsw
import pytest

from storage.fork_child import (
    OrdinalPrefixes,
    ordinal_id,
    ordinal_id_sql,
    ordinal_ids,
    ordinal_seed,
)

EDGES = (
    0,
    1,
    7,
    255,
    10_000,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**32 + 5,
    2**48 - 1,
    2**48,
    2**63 - 1,
    -1,
    -(2**31),
    -(2**32),
    -(2**63),
)
PREFIXES = (
    "00000000-0000-5000-8000-",
    "ffffffff-ffff-5fff-bfff-",
    OrdinalPrefixes.of("op", "ws", "source", "target").turn,
    OrdinalPrefixes.of("op", "ws", "source", "target").message,
)


def _defined(prefix: str, n: int) -> str:
    """The rule as written (fork_child's docstring), independently of its implementation."""
    head = (int(prefix[:8], 16) + ((n % 2**32) * 0x5BD1E995) % 2**32) % 2**32
    return format(head, "08x") + prefix[8:] + format(n % 2**64, "012x")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_python_and_sqlite_write_the_same_ordinal_ids(prefix: str) -> None:
    conn = apsw.Connection(":memory:")
    sql = f"SELECT {ordinal_id_sql('?1', '?2', '?3')}"
    of = ordinal_ids(prefix)
    for n in EDGES:
        want = _defined(prefix, n)
        assert ordinal_id(prefix, n) == want, n
        assert of(n) == want, n
        row = conn.execute(sql, (ordinal_seed(prefix), prefix[8:], n)).fetchone()
        assert row is not None
        assert row[0] == want, n
        if 0 <= n < 2**48:
            assert len(want) == 36 and want[8:24] == prefix[8:]
