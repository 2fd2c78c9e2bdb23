"""A JSON column decoded by orjson reads exactly as the standard library's decoder reads it
(`storage.rows.json_column`): the same value, of the same types, for every text the store can
hold, and the same refusal, at every edge where the two decoders differ."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.rows import json_column
from storage.sqlite import dumps

pytestmark = pytest.mark.timeout(120)


def _outcome(decode: Any, text: str | None) -> str:
    """`repr` of the value (an int told from a float, -0.0 from 0, NaN from None), or the
    refusal's type."""
    try:
        value = decode(text)
    except (ValueError, RecursionError) as exc:
        return f"refused: {type(exc).__name__}"
    return repr(value)


def _standard(text: str | None) -> Any:
    return None if text is None else json.loads(text)


EDGES = [
    None,
    "{}",
    "[]",
    "null",
    "0",
    "-0",
    "-0.0",
    "1.0",
    "1e5",
    "1E-400",
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    '{"n": NaN}',
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    '{"n": 123456789012345678901234567890}',
    '{"s": "123456789012345678901234567890"}',
    "0.1000000000000000055511151231257827",
    "2.2250738585072011e-308",
    '"\\ud800"',
    '"\\ud83d\\ude00"',
    '"\ud800"',
    '"é ☃ \U0001f600"',
    '"\\u0000"',
    '"a\tb"',
    " \t\r\n{} \r\n",
    "\ufeff{}",
    '{"a": 1, "a": 2, "b": 3}',
    "[1,]",
    "01",
    "{} {}",
    "",
    "[" * 1100 + "]" * 1100,
    "[" * 500 + "]" * 500,
]


@pytest.mark.parametrize("text", EDGES)
def test_an_edge_reads_as_the_standard_library_reads_it(text: str | None) -> None:
    assert _outcome(json_column, text) == _outcome(_standard, text)


def test_a_refusal_is_the_standard_librarys_own_error() -> None:
    for text in ("NaN]", "[1,]", '"\ud800', ""):
        with pytest.raises(json.JSONDecodeError) as refused:
            json_column(text)
        with pytest.raises(json.JSONDecodeError) as standard:
            json.loads(text)
        assert str(refused.value) == str(standard.value)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_every_value_the_store_writes_reads_back_as_the_standard_library_reads_it(
    value: Any,
) -> None:
    for text in (dumps(value), json.dumps(value), json.dumps(value, indent=1)):
        got, want = _outcome(json_column, text), _outcome(_standard, text)
        assert got == want, text


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_reads_to_the_same_double(value: float) -> None:
    for text in (repr(value), f"{value:.17g}", f"{value:.15e}"):
        got = json_column(text)
        assert type(got) is type(json.loads(text)) and math.copysign(1, got) == math.copysign(
            1, json.loads(text)
        )
        assert got == json.loads(text), text
