"""Rollout lines decoded by orjson read exactly as the standard library's decoder reads them:
the tutti-agent reader, the worker's binder and its Codex reader accept, refuse and return
what they did with the standard library alone, at every edge where the two decoders differ."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivers.binder import parse_rollout
from drivers.codex.lineage import LineageBroken, read_rollout_lineage
from tutti_agent.errors import RolloutCorrupt
from tutti_agent.rollout import REFUSED, fast_loads, orjson_agrees, read_rollout

pytestmark = pytest.mark.timeout(120)

THREAD = "01a2371b-bc67-7000-9f76-604ff3c48163"
META = (
    b'{"timestamp":"2026-12-02T00:00:00.000Z","ordinal":0,"type":"session_meta",'
    b'"payload":{"id":"' + THREAD.encode() + b'"}}'
)


def _record(value: bytes, ordinal: int = 1) -> bytes:
    """A rollout line whose payload's `v` is the JSON text `value`, spelled as given."""
    return (
        b'{"timestamp":"2026-12-02T00:00:01.000Z","ordinal":%d,"type":"event_msg",'
        b'"payload":{"type":"x","v":%s}}' % (ordinal, value)
    )


def _rollout(*lines: bytes) -> bytes:
    return b"".join(line + b"\n" for line in (META, *lines))


def _standard_reader(data: bytes) -> list[Any]:
    """What the readers decoded with the standard library alone: an all-ASCII file through
    the decoder's text path, any other through `json.loads` of each line's bytes."""
    raws = data[: data.rfind(b"\n")].split(b"\n")
    if data.isascii():
        return [json.JSONDecoder().decode(raw.decode("ascii")) for raw in raws]
    return [json.loads(raw) for raw in raws]


def _standard_binder(data: bytes) -> list[Any]:
    """What the binder decoded with the standard library alone: the file as UTF-8 text, each
    line's text through the decoder (whitespace around the value allowed)."""
    text = data.decode("utf-8")
    return [json.JSONDecoder().decode(line) for line in text[:-1].split("\n")]


def _outcome(decode: Any, data: bytes) -> str:
    """`repr` of the decoded values (telling an int from a float, -0.0 from 0, NaN from
    anything) or the kind of refusal."""
    try:
        return repr(decode(data))
    except (ValueError, RecursionError) as exc:
        return f"refused: {type(exc).__name__}"


def _written(tmp_path: Path, data: bytes) -> Path:
    path = (
        tmp_path / "sessions" / "2026" / "12" / "02" / f"rollout-2026-12-02T00-00-00-{THREAD}.jsonl"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _tutti_reads(tmp_path: Path, data: bytes) -> str:
    path = _written(tmp_path, data)
    try:
        lines = read_rollout(path)
    except RolloutCorrupt:
        return "refused"
    return repr(
        [(line.ordinal, line.timestamp, line.item.type, line.item.payload) for line in lines]
    )


def _tutti_expected(data: bytes) -> str:
    try:
        objs = _standard_reader(data)
    except ValueError:
        return "refused"
    return repr([(o["ordinal"], o["timestamp"], o["type"], o["payload"]) for o in objs])


def _binds(data: bytes) -> str:
    try:
        return repr(list(parse_rollout(data, THREAD).records))
    except ValueError:
        return "refused"


def _binder_expected(data: bytes) -> str:
    try:
        return repr(_standard_binder(data))
    except (ValueError, UnicodeDecodeError):
        return "refused"


# Where orjson and the standard library differ (orjson refuses, or reads another value), and
# where they agree on a refusal: each is read by the readers as the standard library read it.
EDGES = {
    "nan": _record(b"NaN"),
    "infinity": _record(b"Infinity"),
    "minus infinity": _record(b"-Infinity"),
    "a double's overflow": _record(b"1e400"),
    "2**64": _record(str(2**64).encode()),
    "2**64 - 1": _record(str(2**64 - 1).encode()),
    "-(2**63) - 1": _record(str(-(2**63) - 1).encode()),
    "2**100": _record(str(2**100).encode()),
    "a long mantissa": _record(b"0.1234567890123456789012345"),
    "an escaped lone high surrogate": _record(b'"\\ud800"'),
    "an escaped lone low surrogate": _record(b'"x\\udc00"'),
    "an escaped pair": _record(b'"\\ud83d\\ude00"'),
    "a raw surrogate (not UTF-8)": _record(b'"\xed\xa0\x80"'),
    "not UTF-8": _record(b'"\xff"'),
    "duplicate keys": _record(b'{"a":1,"b":2,"a":3}'),
    "a BOM": b"\xef\xbb\xbf" + _record(b"1"),
    "trailing spaces": _record(b"1") + b"  ",
    "a trailing tab": _record(b"1") + b"\t",
    "a trailing CR": _record(b"1") + b"\r",
    "leading spaces": b"  " + _record(b"1"),
    "a trailing form feed": _record(b"1") + b"\x0c",
    "a trailing no-break space": _record(b"1") + b"\xc2\xa0",
    "a raw tab in a string": _record(b'"a\tb"'),
    "a raw NUL in a string": _record(b'"a\x00b"'),
    "a trailing comma": _record(b"[1,]"),
    "a leading zero": _record(b"01"),
    "two values on the line": _record(b"1") + b'{"a":1}',
    "negative zero": _record(b"-0"),
    "negative zero float": _record(b"-0.0"),
    "an empty line": b"",
    "non-ASCII text": _record('"é 😀 \u2028"'.encode()),
}


@pytest.mark.parametrize("edge", list(EDGES))
def test_the_tutti_reader_reads_each_edge_as_the_standard_library(
    tmp_path: Path, edge: str
) -> None:
    data = _rollout(EDGES[edge])
    assert _tutti_reads(tmp_path, data) == _tutti_expected(data)


@pytest.mark.parametrize("edge", list(EDGES))
def test_the_binder_binds_each_edge_iff_the_standard_library_accepts_it(edge: str) -> None:
    data = _rollout(EDGES[edge])
    assert _binds(data) == _binder_expected(data)


@pytest.mark.parametrize("edge", list(EDGES))
def test_the_codex_reader_reads_each_edge_as_the_standard_library(
    tmp_path: Path, edge: str
) -> None:
    data = _rollout(EDGES[edge])
    _written(tmp_path, data)
    try:
        lineage = read_rollout_lineage(tmp_path, THREAD)
        got = repr([(r.ordinal, r.type, r.payload) for r in lineage.records])
    except LineageBroken:
        got = "refused"
    try:
        expected = repr([(o["ordinal"], o["type"], o["payload"]) for o in _standard_reader(data)])
    except ValueError:
        expected = "refused"
    assert got == expected


def test_the_edges_that_orjson_refuses_or_misreads_are_the_ones_pinned() -> None:
    """The table above holds lines each decoder treats differently (else it pins nothing)."""
    refused = {"nan", "infinity", "an escaped lone high surrogate", "a BOM", "a double's overflow"}
    for edge in refused:
        with pytest.raises(REFUSED):
            orjson.loads(EDGES[edge])
    assert type(orjson.loads(EDGES["2**64"])["payload"]["v"]) is float  # what the guard is for
    assert not orjson_agrees(_rollout(EDGES["2**64"]))
    assert not orjson_agrees(_rollout(_record(b'"1234567890123456789"')))  # in a string too
    assert orjson_agrees(_rollout(_record(b"123456789012345678")))


def test_a_nan_line_binds_and_reads_as_before(tmp_path: Path) -> None:
    data = _rollout(_record(b"NaN"), _record(b"[1,2]", 2))
    records = parse_rollout(data, THREAD).records
    assert math.isnan(records[1]["payload"]["v"]) and records[2]["payload"]["v"] == [1, 2]
    assert [line.ordinal for line in read_rollout(_written(tmp_path, data))] == [0, 1, 2]


def test_a_line_no_decoder_accepts_fails_the_bind_and_the_read_naming_it(tmp_path: Path) -> None:
    data = _rollout(_record(b"1"), _record(b"[1,]", 2), _record(b"3", 3))
    with pytest.raises(ValueError, match=r"^line 3: "):
        parse_rollout(data, THREAD)
    with pytest.raises(RolloutCorrupt, match="corrupt rollout line at byte"):
        read_rollout(_written(tmp_path, data))


def test_nesting_orjson_reads_binds_and_reads_alike(tmp_path: Path) -> None:
    """orjson reads 1,024 levels where the standard library stops near the recursion limit:
    every reader decodes through the same function, so the binder and the readers agree."""
    deep = b"[" * 1_010 + b"]" * 1_010
    data = _rollout(_record(deep))
    assert len(parse_rollout(data, THREAD).records) == 2
    assert len(read_rollout(_written(tmp_path, data))) == 2


# JSON-ish text, valid or not: every line orjson accepts in a file it is trusted with reads
# as the standard library reads it.
_JSONISH = st.text(alphabet='{}[]",:0123456789.eE+-truefalsnNIiy \t\\u', max_size=40)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


def _agrees(raw: bytes) -> None:
    standard = json.loads
    loads = fast_loads(raw + b"\n", standard)
    try:
        got: str = repr(loads(raw))
    except REFUSED:
        got = _outcome(standard, raw)
    except (ValueError, RecursionError) as exc:
        got = f"refused: {type(exc).__name__}"
    assert got == _outcome(standard, raw)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_JSONISH)
def test_jsonish_text_reads_as_the_standard_library(text: str) -> None:
    _agrees(text.encode())


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_VALUES, st.booleans())
def test_encoded_values_read_as_the_standard_library(value: Any, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    _agrees(raw)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(-30, 30))
def test_decimal_spellings_of_floats_read_as_the_standard_library(x: float, exp: int) -> None:
    _agrees(f"{x!r}".encode())
    _agrees(f"{x:.17e}".encode())
    _agrees(f"{x:.12g}e{exp}".replace("ee", "e").encode())
