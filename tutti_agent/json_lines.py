"""JSONL lines decoded as the standard library's decoder reads them, by orjson where the two agree.

A rollout is read line by line by the app-server, the worker's binder and its readability
proof; the standard library's decoder was most of each one's CPU on a long rollout. orjson
decodes the same line three times faster, and for every line orjson accepts the standard
library returns the same value, with two exceptions, both handled here:

- **integers beyond 64 bits**: orjson reads an integer beyond `[-2**63, 2**64)` as a float,
  the standard library as an `int`. Such an integer needs 19 digits or more in a row, so a
  file that holds no run of 19 digits anywhere (in a string or not) is decoded by orjson;
  one that does is decoded by the standard library alone (`fast_loads`).
- **nesting**: orjson reads arrays and objects nested up to 1,024 deep; the standard library
  raises `RecursionError` from about 1,000 (the interpreter's recursion limit, less the
  caller's stack). Neither encoder writes such a line (the standard library's encoder has
  the same limit); a line between the two is read by every reader that decodes through
  here — the binder, the proof and the app-server alike — so they still agree.

Each line orjson refuses goes to the caller's standard-library decoder, which accepts or
refuses it as before, with its own error: NaN and Infinity, numbers that overflow a double
(`1e400`), lone surrogates (escaped, or raw in a bytes line), a UTF-8 BOM before a bytes
line. Both decoders allow JSON whitespace (space, tab, CR) around a line's value and keep the
last of duplicate keys at the first one's place; both refuse control characters in strings,
trailing commas, leading zeros and a second value on the line
(`tests/tutti_agent/test_json_lines.py` pins each of these)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
LONG_DIGITS = 19
"""A run of digits this long may be an integer orjson reads as a float: the least is
`-(2**63) - 1`, 19 digits (a shorter run is within the 64 bits orjson reads exactly)."""


def orjson_agrees(data: bytes) -> bool:
    """Whether orjson reads every line of `data` it accepts as the standard library does: no
    run of `LONG_DIGITS` ASCII digits anywhere in it (a translate and a find, a few ms for a
    14.7 MB rollout)."""
    return data.translate(_DIGITS).find(b"0" * LONG_DIGITS) < 0


REFUSED = orjson.JSONDecodeError
"""What `fast_loads`' decoder raises for a line it does not read: decode that line with the
standard library (whose own errors are not this type)."""


def fast_loads(data: bytes, standard: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """The decoder for the lines of `data`: `orjson.loads` where it returns what `standard`
    (the caller's standard-library decoder of one line's bytes) returns for every line it
    accepts, else `standard` itself. A line it raises `REFUSED` for goes to `standard`, which
    accepts or refuses it as it always has.

    Decode and use each line in the same pass (not all lines, then a second pass over the
    objects): 60,000 decoded lines do not stay in the CPU's caches, and each pass over them
    costs about what their checks do."""
    return orjson.loads if orjson_agrees(data) else standard
