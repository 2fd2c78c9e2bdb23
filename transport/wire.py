"""The client wire envelope of PROTOCOL.md (version 1): request decoding, reply encoding and
the typed errors of bad frames, with no sockets in sight.

It also owns the parameter-validation helpers handlers use, so every bad parameter becomes
the same 400 `invalid_request`/`invalid_argument` reply naming `params.field`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgpack

from domain.errors import HostError, InvalidArgument, InvalidRequest, PayloadTooLarge

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20
"""Largest request frame (bytes) the daemon decodes; larger ones get 413."""
MAX_ID_LEN = 128
MAX_METHOD_LEN = 128
MAX_DEPTH = 64
"""Deepest container nesting accepted in `params`; deeper is malformed (handlers recurse)."""

_UUID_RE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE
)
_SCALARS = (str, int, float, bool, type(None), bytes)
_SCALAR_TYPES = frozenset(_SCALARS)
# Only this prefix of an unreadable frame is examined to echo its id; clients put `id` early.
_ID_PEEK_BYTES = 4096
_ID_PEEK_KEYS = 8


class WireReason(StrEnum):
    """Reasons the transport itself puts on error replies (PROTOCOL.md, Errors)."""

    MALFORMED_REQUEST = "malformed_request"
    """Not msgpack, not a map, missing/wrong-typed envelope keys, `v != 1`, bad id length."""
    UNKNOWN_METHOD = "unknown_method"
    """The dispatcher has no handler for `method`."""
    INVALID_ARGUMENT = "invalid_argument"
    """A parameter is missing or has the wrong type/shape; `params.field` names it."""
    PAYLOAD_TOO_LARGE = "payload_too_large"
    """The frame is larger than `MAX_FRAME`; it is never decoded."""
    SHUTTING_DOWN = "shutting_down"
    """The server is closing; requests still in flight are answered with this."""
    OVERLOADED = "overloaded"
    """More requests are in flight than the server accepts; retryable."""
    INTERNAL_ERROR = "internal_error"
    """A handler failed with something that is not a typed error."""


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded API request: `id` is echoed in the reply; `params` is a plain msgpack map."""

    id: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)


def malformed(message: str) -> InvalidRequest:
    return InvalidRequest(message, reason=WireReason.MALFORMED_REQUEST)


def unknown_method(method: str) -> InvalidRequest:
    """The error a dispatcher raises for a method it does not serve."""
    return InvalidRequest(
        f"unknown method: {method!r}", reason=WireReason.UNKNOWN_METHOD, params={"method": method}
    )


def decode_request(frame: bytes) -> Request:
    """Decode one request frame, or raise the typed error its reply must carry.

    Raises `PayloadTooLarge` (413) for frames over `MAX_FRAME` and `InvalidRequest`
    (`malformed_request`) for everything else that is not a version-1 request envelope.
    """
    if len(frame) > MAX_FRAME:
        raise PayloadTooLarge(
            f"request frame of {len(frame)} bytes exceeds {MAX_FRAME} bytes",
            params={"maxBytes": MAX_FRAME, "bytes": len(frame)},
        )
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises ValueError subclasses, UnicodeDecodeError, …
        raise malformed(f"frame is not valid msgpack: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise malformed(f"request must be a msgpack map, not {_type_name(obj)}")
    v = obj.get("v")
    if "v" not in obj or type(v) is not int:
        raise malformed("request needs integer 'v'")
    if v != PROTOCOL_VERSION:
        raise malformed(f"unsupported protocol version {v}; this daemon speaks {PROTOCOL_VERSION}")
    request_id = obj.get("id")
    if not isinstance(request_id, str):
        raise malformed("request needs string 'id'")
    if not 1 <= len(request_id) <= MAX_ID_LEN:
        raise malformed(f"'id' must be 1..{MAX_ID_LEN} characters")
    method = obj.get("method")
    if not isinstance(method, str) or not 1 <= len(method) <= MAX_METHOD_LEN:
        raise malformed(f"request needs string 'method' of 1..{MAX_METHOD_LEN} characters")
    params = obj.get("params")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise malformed(f"'params' must be a map, not {_type_name(params)}")
    # Most requests' params are flat maps of scalars: one pass, no traversal stack.
    for value in params.values():
        if type(value) not in _SCALAR_TYPES:
            problem = _check_plain(params)
            if problem:
                raise malformed(f"'params' {problem}")
            break
    return Request(id=request_id, method=method, params=params)


def peek_id(frame: bytes) -> str | None:
    """The envelope's `id` if it can be read cheaply from the frame's head, else None.

    Used to echo the id on malformed and oversize frames (PROTOCOL.md: "id null if
    unreadable"); only a bounded prefix is looked at so a huge frame costs nothing.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=_ID_PEEK_BYTES * 2)
    try:
        unpacker.feed(frame[:_ID_PEEK_BYTES])
        entries = unpacker.read_map_header()
        for _ in range(min(entries, _ID_PEEK_KEYS)):
            key = unpacker.unpack()
            if key == "id":
                value = unpacker.unpack()
                if isinstance(value, str) and 1 <= len(value) <= MAX_ID_LEN:
                    return value
                return None
            unpacker.skip()
    except Exception:  # truncated, not a map, not msgpack: the id is unreadable
        return None
    return None


def _pack(obj: Mapping[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _pack_value(value: str | int) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def encode_result(request_id: str, status: int, result: Mapping[str, Any]) -> bytes:
    """A success reply (status 200 or 202). Raises TypeError if `result` is not msgpack-able."""
    if not 200 <= status < 300:
        raise ValueError(f"success status must be 2xx, not {status}")
    return _pack(
        {"v": PROTOCOL_VERSION, "id": request_id, "status": status, "result": dict(result)},
    )


_RESULT_HEAD = b"\x84" + _pack_value("v") + _pack_value(PROTOCOL_VERSION) + _pack_value("id")
_STATUS_KEY = _pack_value("status")
_RESULT_KEY = _pack_value("result")


def pack_result(result: Mapping[str, Any]) -> bytes:
    """The msgpack bytes of a success reply's `result` map, for `encode_result_packed` (a
    reply that is sent again, e.g. from a cache, is encoded once). Raises TypeError like
    `encode_result`."""
    return _pack(dict(result))


def encode_result_packed(request_id: str, status: int, packed_result: bytes) -> bytes:
    """`encode_result` of a result already packed by `pack_result`: the same bytes, without
    encoding the result map again."""
    if not 200 <= status < 300:
        raise ValueError(f"success status must be 2xx, not {status}")
    return b"".join(
        (
            _RESULT_HEAD,
            _pack_value(request_id),
            _STATUS_KEY,
            _pack_value(status),
            _RESULT_KEY,
            packed_result,
        )
    )


def encode_error(request_id: str | None, error: HostError) -> bytes:
    """An error reply; `id` is None when the request's id could not be read."""
    body = {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "status": error.status,
        "error": error.to_wire(),
    }
    try:
        return _pack(body)
    except (TypeError, ValueError, OverflowError):
        # An error whose params cannot be encoded must still produce a reply.
        wire = error.to_wire()
        wire["params"] = {}
        body["error"] = wire
        return _pack(body)


def _type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


def _check_plain(root: dict[str, Any]) -> str | None:
    """Why `root` is not plain msgpack data (ext types, nesting over MAX_DEPTH), or None.

    Iterative, so hostile nesting cannot exhaust the Python stack.
    """
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nests deeper than {MAX_DEPTH} levels"
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if type(child) in _SCALARS:
                continue
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            else:
                return f"contains an unsupported msgpack type ({type(child).__name__})"
    return None


# ---------------------------------------------------------------------------------------------
# Parameter validation, for handlers. Each helper returns the typed value or raises
# InvalidArgument(field, message), which the server turns into 400 invalid_argument.


def require_str(
    params: Mapping[str, Any], name: str, *, max_len: int = 4096, min_len: int = 1
) -> str:
    value = params.get(name)
    if value is None:
        raise InvalidArgument(name, f"'{name}' is required")
    return _check_str(name, value, min_len, max_len)


def optional_str(
    params: Mapping[str, Any],
    name: str,
    *,
    default: str | None = None,
    max_len: int = 4096,
    min_len: int = 0,
) -> str | None:
    value = params.get(name)
    if value is None:
        return default
    return _check_str(name, value, min_len, max_len)


def require_int(
    params: Mapping[str, Any],
    name: str,
    *,
    min_value: int | None = None,
    max_value: int | None = None,
) -> int:
    value = params.get(name)
    if value is None:
        raise InvalidArgument(name, f"'{name}' is required")
    return _check_int(name, value, min_value, max_value)


def optional_int(
    params: Mapping[str, Any],
    name: str,
    *,
    default: int | None = None,
    min_value: int | None = None,
    max_value: int | None = None,
) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    return _check_int(name, value, min_value, max_value)


def require_bool(params: Mapping[str, Any], name: str) -> bool:
    value = params.get(name)
    if not isinstance(value, bool):
        raise InvalidArgument(name, f"'{name}' must be a boolean")
    return value


def optional_bool(
    params: Mapping[str, Any], name: str, *, default: bool | None = None
) -> bool | None:
    if params.get(name) is None:
        return default
    return require_bool(params, name)


def require_map(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = params.get(name)
    if not isinstance(value, dict):
        raise InvalidArgument(name, f"'{name}' must be a map")
    if not all(isinstance(k, str) for k in value):
        raise InvalidArgument(name, f"'{name}' keys must be strings")
    return value


def optional_map(
    params: Mapping[str, Any], name: str, *, default: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    if params.get(name) is None:
        return default
    return require_map(params, name)


def require_list(params: Mapping[str, Any], name: str, *, max_len: int = 10_000) -> list[Any]:
    value = params.get(name)
    if not isinstance(value, list):
        raise InvalidArgument(name, f"'{name}' must be a list")
    if len(value) > max_len:
        raise InvalidArgument(name, f"'{name}' has more than {max_len} entries")
    return value


def require_uuid(params: Mapping[str, Any], name: str) -> str:
    """A hyphenated UUID string (any case), returned lowercase so ids compare canonically."""
    value = params.get(name)
    if value is None:
        raise InvalidArgument(name, f"'{name}' is required")
    return _check_uuid(name, value)


def optional_uuid(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    return _check_uuid(name, value)


def require_enum(params: Mapping[str, Any], name: str, choices: Collection[str]) -> str:
    value = params.get(name)
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(sorted(choices))
        raise InvalidArgument(name, f"'{name}' must be one of: {allowed}")
    return value


def optional_enum(
    params: Mapping[str, Any], name: str, choices: Collection[str], *, default: str | None = None
) -> str | None:
    if params.get(name) is None:
        return default
    return require_enum(params, name, choices)


def _check_str(name: str, value: Any, min_len: int, max_len: int) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(name, f"'{name}' must be a string")
    if not min_len <= len(value) <= max_len:
        raise InvalidArgument(name, f"'{name}' must be {min_len}..{max_len} characters")
    return value


def _check_int(name: str, value: Any, min_value: int | None, max_value: int | None) -> int:
    # bool is an int subclass in Python but not an integer on the wire.
    if type(value) is not int:
        raise InvalidArgument(name, f"'{name}' must be an integer")
    if min_value is not None and value < min_value:
        raise InvalidArgument(name, f"'{name}' must be >= {min_value}")
    if max_value is not None and value > max_value:
        raise InvalidArgument(name, f"'{name}' must be <= {max_value}")
    return value


def _check_uuid(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _UUID_RE.fullmatch(value):
        raise InvalidArgument(name, f"'{name}' must be a UUID (8-4-4-4-12 hex digits)")
    return value.lower()
