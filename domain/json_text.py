"""JSON text decoded as the standard library's decoder reads it, by orjson where the two agree:
the store's JSON columns (a timeline page decodes a payload or a workspace record per Turn,
and the standard library's decoder was the page's largest Python cost) and the Claude
driver's transcript lines. For every text orjson accepts, the
standard library returns the same value, but for integers beyond 64 bits (orjson returns a
float): a text with a run of `LONG_DIGITS` digits anywhere goes to the standard library
alone. What orjson refuses (NaN, Infinity, `1e400`, a lone surrogate, nesting past 1,024)
goes to the standard library too, which accepts or refuses it as before, with its own error.
Nesting between the two limits (the standard library's is the interpreter's recursion limit,
~1,000, less the caller's stack) orjson reads: the store's encoder, the standard library's,
refuses such nesting at the same limit, so no column the store wrote holds it.

(tutti_agent/rollout.py keeps its own copy of the guard: that program imports nothing of
ours.)"""

from __future__ import annotations

import json
from typing import Any

import orjson

_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
LONG_DIGITS = 19
"""The shortest run of digits that may be an integer orjson reads as a float: `-(2**63) - 1`."""
_LONG_RUN = b"0" * LONG_DIGITS


def loads_as_stdlib(text: str) -> Any:
    """`json.loads(text)`, by orjson where it agrees (see the module's docstring)."""
    try:
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: orjson refuses it, the standard library not
        return json.loads(text)
    value = _by_orjson(data)
    return json.loads(text) if value is _REFUSED else value


def loads_bytes_as_stdlib(data: bytes) -> Any:
    """`json.loads(data)` for UTF-8 bytes (a provider's stdout line), by orjson where it agrees
    (see the module's docstring). The standard library reads bytes a little more widely than
    the text they encode (a leading byte-order mark): as `json.loads(data)` does."""
    value = _by_orjson(data)
    return json.loads(data) if value is _REFUSED else value


_REFUSED = object()


def _by_orjson(data: bytes) -> Any:
    """orjson's reading of `data`, or `_REFUSED` where it may differ from the standard library's
    (a run of `LONG_DIGITS` digits) or orjson refuses the text."""
    if data.translate(_DIGITS).find(_LONG_RUN) < 0:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return _REFUSED
