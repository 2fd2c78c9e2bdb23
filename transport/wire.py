"""The daemon's side of the wire envelope (`protocol.envelope` encodes and decodes it): a
bad frame's typed error, an error reply of a `HostError`, and the parameter-validation
helpers handlers use, so every bad parameter becomes the same 400
`invalid_request`/`invalid_argument` reply naming `params.field`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any

from domain.errors import HostError, InvalidArgument, InvalidRequest, PayloadTooLarge
from protocol import envelope
from protocol.envelope import EnvelopeError, Request
from protocol.objects import Error

_UUID_RE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE
)


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


def malformed(message: str) -> InvalidRequest:
    return InvalidRequest(message, reason=WireReason.MALFORMED_REQUEST)


def unknown_method(method: str) -> InvalidRequest:
    """The error a dispatcher raises for a method it does not serve."""
    return InvalidRequest(
        f"unknown method: {method!r}", reason=WireReason.UNKNOWN_METHOD, params={"method": method}
    )


def decode_request(frame: bytes) -> Request:
    """Decode one request frame (`protocol.envelope.decode_request`), or raise the typed error
    its reply must carry: `PayloadTooLarge` (413) for frames over `MAX_FRAME`,
    `InvalidRequest` (`malformed_request`) for everything else that is not a version-1
    request envelope.
    """
    try:
        return envelope.decode_request(frame)
    except EnvelopeError as exc:
        if exc.too_large:
            raise PayloadTooLarge(exc.message, params=exc.params) from None
        raise malformed(exc.message) from None


def encode_error(request_id: str | None, error: HostError) -> bytes:
    """An error reply; `id` is None when the request's id could not be read."""
    return envelope.encode_error(request_id, error.status, error_body(error))


def error_body(error: HostError) -> Error:
    """The `error` of a reply (`HostError.to_wire`'s fields, in its order) as the protocol's
    type: `domain` knows no wire types, so the conversion is here."""
    return {
        "code": error.code,
        "reason": error.reason,
        "message": error.message,
        "retryable": error.retryable,
        "params": error.params,
    }


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
    problem = _not_json(value)
    if problem:
        raise InvalidArgument(name, f"'{name}' {problem}")
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


def _not_json(root: dict[str, Any]) -> str | None:
    """Why a map parameter cannot be kept as JSON (a handler stores it so), or None: bytes, or
    a key that is not a string, anywhere inside it. Iterative; the envelope has already bounded
    its depth and refused every other msgpack type."""
    stack: list[Any] = [root]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                if not isinstance(key, str):
                    return "has a key that is not a string"
                stack.append(child)
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, bytes):
            return "holds bytes (a msgpack bin); only strings, numbers, booleans, nil, lists, maps"
    return None


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
