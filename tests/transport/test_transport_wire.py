"""The envelope spec without sockets: decoding, the typed error of each bad frame, reply
encoding and the handler parameter validators."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import (
    ForkBoundaryError,
    ForkBoundaryReason,
    HostError,
    InvalidArgument,
    InvalidRequest,
    PayloadTooLarge,
)
from protocol.envelope import (
    MAX_DEPTH,
    MAX_FRAME,
    Request,
    encode_result,
    encode_result_packed,
    pack_result,
    peek_id,
)
from transport.wire import (
    decode_request,
    encode_error,
    optional_bool,
    optional_enum,
    optional_int,
    optional_map,
    optional_str,
    optional_uuid,
    require_bool,
    require_enum,
    require_int,
    require_list,
    require_map,
    require_str,
    require_uuid,
    unknown_method,
)

pytestmark = pytest.mark.timeout(60)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# Each bad frame of PROTOCOL.md's envelope rules, with the id the reply must echo.
BAD_FRAMES: dict[str, tuple[bytes, str | None]] = {
    "empty_frame": (b"", None),
    "not_msgpack": (b"\xc1", None),
    "json_text": (b'{"v": 1, "id": "a", "method": "m"}', None),
    "truncated_map": (pack({"v": 1, "id": "t1", "method": "echo"})[:-3], "t1"),
    "trailing_bytes": (pack({"v": 1, "id": "t2", "method": "echo"}) + b"\x00", "t2"),
    "array": (pack([1, "a", "echo", {}]), None),
    "string": (pack("hello"), None),
    "integer": (pack(7), None),
    "nil": (pack(None), None),
    "missing_v": (pack({"id": "m1", "method": "echo"}), "m1"),
    "missing_id": (pack({"v": 1, "method": "echo"}), None),
    "missing_method": (pack({"v": 1, "id": "m3"}), "m3"),
    "v_is_string": (pack({"v": "1", "id": "w1", "method": "echo"}), "w1"),
    "v_is_bool": (pack({"v": True, "id": "w2", "method": "echo"}), "w2"),
    "v_is_float": (pack({"v": 1.0, "id": "w3", "method": "echo"}), "w3"),
    "v_is_2": (pack({"v": 2, "id": "w4", "method": "echo"}), "w4"),
    "id_is_int": (pack({"v": 1, "id": 5, "method": "echo"}), None),
    "id_is_bytes": (pack({"v": 1, "id": b"abc", "method": "echo"}), None),
    "id_empty": (pack({"v": 1, "id": "", "method": "echo"}), None),
    "id_129_chars": (pack({"v": 1, "id": "x" * 129, "method": "echo"}), None),
    "method_is_int": (pack({"v": 1, "id": "w5", "method": 3}), "w5"),
    "method_empty": (pack({"v": 1, "id": "w6", "method": ""}), "w6"),
    "params_is_list": (pack({"v": 1, "id": "w7", "method": "echo", "params": [1]}), "w7"),
    "params_is_string": (pack({"v": 1, "id": "w8", "method": "echo", "params": "x"}), "w8"),
    "int_map_key": (pack({"v": 1, "id": "w9", "method": "echo", "params": {1: 2}}), "w9"),
    "bad_utf8": (
        b"\x84\xa1v\x01\xa2id\xa2u1\xa6method\xa4echo\xa6params\x81\xa1k\xa2\xff\xfe",
        "u1",
    ),
    "ext_type": (
        pack({"v": 1, "id": "x1", "method": "echo", "params": {"k": msgpack.ExtType(5, b"\x00")}}),
        "x1",
    ),
    "timestamp_ext": (
        pack({"v": 1, "id": "x2", "method": "echo", "params": {"k": msgpack.Timestamp(1)}}),
        "x2",
    ),
    "too_deep": (
        pack({"v": 1, "id": "d1", "method": "echo", "params": {"k": nested(MAX_DEPTH + 1)}}),
        "d1",
    ),
    "deeper_than_msgpack_allows": (
        b"\x84\xa1v\x01\xa2id\xa2d2\xa6method\xa4echo\xa6params\x81\xa1k"
        + b"\x91" * 5000
        + b"\xc0",
        "d2",
    ),
    "huge_declared_array": (b"\xdd\xff\xff\xff\xff", None),
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_bad_frame_is_malformed_request_and_id_is_echoed_when_readable(name: str) -> None:
    frame, expected_id = BAD_FRAMES[name]
    with pytest.raises(InvalidRequest) as caught:
        decode_request(frame)
    assert caught.value.status == 400
    assert caught.value.code == "invalid_request"
    assert caught.value.reason == "malformed_request"
    assert peek_id(frame) == expected_id


def test_valid_request_decodes_with_params_defaulting_to_empty_map() -> None:
    assert decode_request(pack({"v": 1, "id": "a", "method": "host.status"})) == Request(
        "a", "host.status", {}
    )
    assert decode_request(pack({"v": 1, "id": "a", "method": "m", "params": None})).params == {}
    frame = pack(
        {
            "method": "m",
            "params": {"x": [1, {"y": b"z"}]},
            "id": "i" * 128,
            "v": 1,
            "extra": "ignored",
        }
    )
    assert decode_request(frame) == Request("i" * 128, "m", {"x": [1, {"y": b"z"}]})


def test_params_nested_exactly_max_depth_are_accepted() -> None:
    params = {"k": nested(MAX_DEPTH - 2)}
    assert decode_request(pack({"v": 1, "id": "a", "method": "m", "params": params})).params == (
        params
    )


def test_frame_over_one_mebibyte_is_413_without_decoding() -> None:
    body = pack({"v": 1, "id": "big", "method": "echo", "params": {"blob": b"x" * MAX_FRAME}})
    with pytest.raises(PayloadTooLarge) as caught:
        decode_request(body)
    assert (caught.value.status, caught.value.code, caught.value.reason) == (
        413,
        "payload_too_large",
        "payload_too_large",
    )
    assert peek_id(body) == "big"
    # Garbage over the limit is 413 too (size is checked first), with an unreadable id.
    with pytest.raises(PayloadTooLarge):
        decode_request(b"\xc1" * (MAX_FRAME + 1))


def test_frame_of_exactly_one_mebibyte_is_decoded() -> None:
    head = {"v": 1, "id": "edge", "method": "echo", "params": {"blob": b""}}
    overhead = len(pack(head))
    # bin32 header is 5 bytes, the empty bin8 it replaces is 2.
    blob = b"x" * (MAX_FRAME - overhead - 3)
    frame = pack({**head, "params": {"blob": blob}})
    assert len(frame) == MAX_FRAME
    assert decode_request(frame).params["blob"] == blob


def test_encode_result_and_error_follow_the_reply_shapes() -> None:
    assert msgpack.unpackb(encode_result("a", 202, {"turn": {"id": "t"}})) == {
        "v": 1,
        "id": "a",
        "status": 202,
        "result": {"turn": {"id": "t"}},
    }
    err = ForkBoundaryError(ForkBoundaryReason.SOURCE_TURN_ACTIVE)
    assert msgpack.unpackb(encode_error(None, err)) == {
        "v": 1,
        "id": None,
        "status": 409,
        "error": {
            "code": "conflict",
            "reason": "agent_session_fork_conflict",
            "message": err.message,
            "retryable": False,
            "params": {"forkBoundaryReason": "source_turn_active"},
        },
    }
    with pytest.raises(ValueError):
        encode_result("a", 404, {})


def test_error_with_unencodable_params_still_encodes_a_reply() -> None:
    err = HostError("boom", params={"obj": object()})
    reply = msgpack.unpackb(encode_error("a", err))
    assert reply["status"] == 500 and reply["error"]["params"] == {}


def test_unknown_method_error_has_its_reason() -> None:
    err = unknown_method("nope.nothing")
    assert (err.status, err.code, err.reason) == (400, "invalid_request", "unknown_method")


def field_of(call: Any) -> str:
    with pytest.raises(InvalidArgument) as caught:
        call()
    assert (caught.value.status, caught.value.code, caught.value.reason) == (
        400,
        "invalid_request",
        "invalid_argument",
    )
    return str(caught.value.params["field"])


def test_validators_return_typed_values() -> None:
    params = {
        "ws": "w",
        "n": 3,
        "b": False,
        "m": {"a": 1},
        "l": [1],
        "u": "6F9619FF-8B86-D011-B42D-00C04FC964FF",
        "e": "codex",
    }
    assert require_str(params, "ws", max_len=128) == "w"
    assert optional_str(params, "missing", default="d") == "d"
    assert require_int(params, "n", min_value=0) == 3
    assert optional_int(params, "missing", default=50) == 50
    assert require_bool(params, "b") is False
    assert optional_bool(params, "missing") is None
    assert require_map(params, "m") == {"a": 1}
    assert optional_map(params, "missing", default={}) == {}
    assert require_list(params, "l") == [1]
    assert require_uuid(params, "u") == "6f9619ff-8b86-d011-b42d-00c04fc964ff"
    assert optional_uuid(params, "missing") is None
    assert require_enum(params, "e", {"codex", "tutti-agent"}) == "codex"
    assert optional_enum(params, "missing", {"codex"}, default="codex") == "codex"


@pytest.mark.parametrize(
    ("call", "expected_field"),
    [
        (lambda: require_str({}, "workspaceId"), "workspaceId"),
        (lambda: require_str({"workspaceId": ""}, "workspaceId"), "workspaceId"),
        (
            lambda: require_str({"workspaceId": "x" * 129}, "workspaceId", max_len=128),
            "workspaceId",
        ),
        (lambda: require_str({"workspaceId": 5}, "workspaceId"), "workspaceId"),
        (lambda: optional_str({"title": []}, "title"), "title"),
        (lambda: require_int({"n": True}, "n"), "n"),
        (lambda: require_int({"n": 1.5}, "n"), "n"),
        (lambda: optional_int({"limit": 201}, "limit", max_value=200), "limit"),
        (lambda: optional_int({"limit": 0}, "limit", min_value=1), "limit"),
        (lambda: require_bool({"pinned": 1}, "pinned"), "pinned"),
        (lambda: require_map({"settings": [1]}, "settings"), "settings"),
        (lambda: require_map({"settings": {b"k": 1}}, "settings"), "settings"),
        (lambda: require_list({"input": {}}, "input"), "input"),
        (lambda: require_list({"input": [0] * 3}, "input", max_len=2), "input"),
        (lambda: require_uuid({}, "agentSessionId"), "agentSessionId"),
        (
            lambda: require_uuid({"agentSessionId": "not-a-uuid"}, "agentSessionId"),
            "agentSessionId",
        ),
        (
            lambda: require_uuid(
                {"agentSessionId": "6f9619ff8b86d011b42d00c04fc964ff"}, "agentSessionId"
            ),
            "agentSessionId",
        ),
        (lambda: optional_uuid({"target": 7}, "target"), "target"),
        (lambda: require_enum({"provider": "gpt"}, "provider", {"codex"}), "provider"),
    ],
)
def test_validator_rejects_bad_value_naming_the_field(call: Any, expected_field: str) -> None:
    assert field_of(call) == expected_field


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=256))
def test_decode_of_arbitrary_bytes_raises_only_typed_errors(frame: bytes) -> None:
    try:
        request = decode_request(frame)
    except HostError as exc:
        assert exc.status in (400, 413)
        return
    assert isinstance(request, Request)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.text(min_size=1, max_size=128),
    st.text(min_size=1, max_size=40),
    st.dictionaries(st.text(max_size=10), msgpack_values, max_size=5),
)
def test_valid_requests_round_trip(request_id: str, method: str, params: dict[str, Any]) -> None:
    frame = pack({"v": 1, "id": request_id, "method": method, "params": params})
    assert decode_request(frame) == Request(request_id, method, params)
    assert peek_id(frame) == request_id


@settings(max_examples=200, deadline=None)
@given(
    request_id=st.text(min_size=1, max_size=128),
    status=st.sampled_from([200, 202]),
    result=st.dictionaries(
        st.text(max_size=20),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=50),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=8), inner, max_size=4)
            ),
            max_leaves=12,
        ),
        max_size=6,
    ),
)
def test_a_reply_from_a_packed_result_is_byte_identical_to_encode_result(
    request_id: str, status: int, result: dict[str, Any]
) -> None:
    """The reply cache sends `encode_result_packed` of a kept result: the very bytes
    `encode_result` gives, so a cached reply cannot differ on the wire."""
    packed = pack_result(result)
    assert encode_result_packed(request_id, status, packed) == encode_result(
        request_id, status, result
    )
    with pytest.raises(ValueError):
        encode_result_packed(request_id, 404, packed)
