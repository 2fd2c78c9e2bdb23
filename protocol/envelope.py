"""The wire envelope (docs/protocol.md, version 1), encoded and decoded here for both
directions: a request as the client packs it and the daemon reads it, a reply as the daemon
packs it and the client reads it, an event's body on the PUB socket. msgpack only; no
sockets and none of our errors: a bad request frame raises `EnvelopeError`, which the
daemon's transport turns into its typed 400/413 reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Union, cast, get_args, get_origin, get_type_hints, is_typeddict

import msgpack

from protocol.events import EVENT_SHAPES, ClientEvent, Event, UnknownEvent
from protocol.objects import Error, JsonObject

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20
"""Largest request frame (bytes) the daemon decodes; larger ones get 413."""
MAX_ID_LEN = 128
MAX_METHOD_LEN = 128
MAX_DEPTH = 64
"""Deepest container nesting accepted in `params`; deeper is malformed (handlers recurse)."""

_SCALARS = (str, int, float, bool, type(None), bytes)
_SCALAR_TYPES = frozenset(_SCALARS)
# Only this prefix of an unreadable frame is examined to echo its id; clients put `id` early.
_ID_PEEK_BYTES = 4096
_ID_PEEK_KEYS = 8


class EnvelopeError(Exception):
    """A request frame that is not a version-1 request: too large (`too_large`, with the
    sizes in `params`) or malformed (`message` says how)."""

    def __init__(
        self, message: str, *, too_large: bool = False, params: JsonObject | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.too_large = too_large
        self.params = params or {}


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded API request: `id` is echoed in the reply; `params` is a plain msgpack map,
    not yet checked against its method's params type (each handler checks what it reads)."""

    id: str
    method: str
    params: dict[str, object] = field(default_factory=dict)


# -- requests ---------------------------------------------------------------------------------


def encode_request(request_id: str, method: str, params: Mapping[str, object] | None) -> bytes:
    """A request frame, as a client sends it."""
    frame: bytes = msgpack.packb(
        {"v": PROTOCOL_VERSION, "id": request_id, "method": method, "params": dict(params or {})},
        use_bin_type=True,
    )
    return frame


def decode_request(frame: bytes) -> Request:
    """Decode one request frame, or raise `EnvelopeError` saying why it is not one: over
    `MAX_FRAME` (never decoded), not msgpack, not a map, missing or wrong-typed envelope keys,
    `v != 1`, a bad id length, params that are not plain data."""
    if len(frame) > MAX_FRAME:
        raise EnvelopeError(
            f"request frame of {len(frame)} bytes exceeds {MAX_FRAME} bytes",
            too_large=True,
            params={"maxBytes": MAX_FRAME, "bytes": len(frame)},
        )
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises ValueError subclasses, UnicodeDecodeError, …
        raise EnvelopeError(f"frame is not valid msgpack: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise EnvelopeError(f"request must be a msgpack map, not {_type_name(obj)}")
    v = obj.get("v")
    if "v" not in obj or type(v) is not int:
        raise EnvelopeError("request needs integer 'v'")
    if v != PROTOCOL_VERSION:
        raise EnvelopeError(
            f"unsupported protocol version {v}; this daemon speaks {PROTOCOL_VERSION}"
        )
    request_id = obj.get("id")
    if not isinstance(request_id, str):
        raise EnvelopeError("request needs string 'id'")
    if not 1 <= len(request_id) <= MAX_ID_LEN:
        raise EnvelopeError(f"'id' must be 1..{MAX_ID_LEN} characters")
    method = obj.get("method")
    if not isinstance(method, str) or not 1 <= len(method) <= MAX_METHOD_LEN:
        raise EnvelopeError(f"request needs string 'method' of 1..{MAX_METHOD_LEN} characters")
    params = obj.get("params")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise EnvelopeError(f"'params' must be a map, not {_type_name(params)}")
    # Most requests' params are flat maps of scalars: one pass, no traversal stack.
    for value in params.values():
        if type(value) not in _SCALAR_TYPES:
            problem = _check_plain(params)
            if problem:
                raise EnvelopeError(f"'params' {problem}")
            break
    return Request(id=request_id, method=method, params=params)


def peek_id(frame: bytes) -> str | None:
    """The envelope's `id` if it can be read cheaply from the frame's head, else None.

    Used to echo the id on malformed and oversize frames ("id null if unreadable"); only a
    bounded prefix is looked at so a huge frame costs nothing.
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


# -- replies ----------------------------------------------------------------------------------


def _pack(obj: Mapping[str, object]) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _pack_value(value: str | int) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def encode_result(request_id: str, status: int, result: Mapping[str, object]) -> bytes:
    """A success reply (status 200 or 202). Raises TypeError if `result` is not msgpack-able."""
    if not 200 <= status < 300:
        raise ValueError(f"success status must be 2xx, not {status}")
    return _pack(
        {"v": PROTOCOL_VERSION, "id": request_id, "status": status, "result": dict(result)},
    )


_RESULT_HEAD = b"\x84" + _pack_value("v") + _pack_value(PROTOCOL_VERSION) + _pack_value("id")
_STATUS_KEY = _pack_value("status")
_RESULT_KEY = _pack_value("result")


def pack_result(result: Mapping[str, object]) -> bytes:
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


def encode_error(request_id: str | None, status: int, error: Error) -> bytes:
    """An error reply of `error` (the `{code, reason, message, retryable, params}` body);
    `id` is None when the request's id could not be read. An error whose params cannot be
    encoded is still a reply: the same error with empty params."""
    body = {"v": PROTOCOL_VERSION, "id": request_id, "status": status, "error": error}
    try:
        return _pack(body)
    except (TypeError, ValueError, OverflowError):
        body["error"] = {**error, "params": {}}
        return _pack(body)


def decode_reply(frame: bytes) -> dict[str, object]:
    """A reply frame as its map, as a client reads it: `{"undecodable": frame}` when it is
    not a msgpack map."""
    try:
        reply = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception:
        return {"undecodable": frame}
    return reply if isinstance(reply, dict) else {"undecodable": frame}


def reply_outcome(reply: Mapping[str, object]) -> tuple[int, dict[str, object]]:
    """`(status, body)` of a decoded reply: its `result` below 400, else its `error` (an
    empty map if missing); a reply without an integer status reads as 500."""
    status = reply.get("status")
    if not isinstance(status, int):
        status = 500
    body = reply.get("result") if status < 400 else reply.get("error")
    return status, body if isinstance(body, dict) else {}


# -- events -----------------------------------------------------------------------------------


def encode_event(event: Event) -> bytes:
    """An event's body frame (its topic frame is the workspace id). Raises TypeError if the
    event cannot be encoded."""
    frame: bytes = msgpack.packb(dict(event), use_bin_type=True)
    return frame


def decode_event(frame: bytes) -> ClientEvent:
    """An event's body decoded once into its `protocol.events` type, or an `UnknownEvent`
    (a type this table lacks, a required key missing or of the wrong kind, a frame that is
    not a msgpack map) that says why. Never raises: a newer daemon's event is kept, not lost."""
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises ValueError subclasses, UnicodeDecodeError, …
        return UnknownEvent("", {}, f"not msgpack: {type(exc).__name__}")
    if not isinstance(body, dict):
        return UnknownEvent("", {"value": body}, f"not a map but {_type_name(body)}")
    kind = body.get("type")
    if not isinstance(kind, str):
        return UnknownEvent("", body, "no string 'type'")
    shape = _EVENT_KEYS.get(kind)
    if shape is None:
        return UnknownEvent(kind, body, "unknown type")
    for key, expected in shape:
        if not isinstance(body.get(key), expected):
            return UnknownEvent(kind, body, f"'{key}' is not a {expected.__name__}")
    # The checked keys are the type's required ones, each of the right kind: the body is one.
    return cast(Event, body)


def _event_keys(event_type: type) -> tuple[tuple[str, type], ...]:
    """The required keys of an event's TypedDict with the Python type each holds on the wire
    (a nested object is a map, a name a string), `type` itself left out."""
    hints = get_type_hints(event_type)
    keys: list[tuple[str, type]] = []
    for key in sorted(getattr(event_type, "__required_keys__", ())):
        if key == "type":
            continue
        hint = hints[key]
        parts = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
        if all(is_typeddict(p) for p in parts):
            keys.append((key, dict))
        elif hint is str:
            keys.append((key, str))
        elif hint is int:
            keys.append((key, int))
        elif hint is bool:
            keys.append((key, bool))
        else:
            keys.append((key, object))
    return tuple(keys)


_EVENT_KEYS = {name: _event_keys(t) for name, t in EVENT_SHAPES.items()}


def _type_name(value: object) -> str:
    return "nil" if value is None else type(value).__name__


def _check_plain(root: dict[str, object]) -> str | None:
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
