"""Identifier helpers: UUIDv7 generation and the Codex-compatible thread id validation.

Thread and turn ids are UUIDv7 strings (time-ordered); a malformed thread id is rejected
with the same `invalid session id: ...` class of message Codex uses."""

from __future__ import annotations

import os
import threading
import time
import uuid

from tutti_agent.errors import InvalidSessionId

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def uuid7() -> str:
    """Return a new UUIDv7; ids minted in the same millisecond stay ordered (12-bit counter)."""
    global _last_ms, _seq
    with _lock:
        ms = int(time.time() * 1000)
        if ms <= _last_ms:
            _seq += 1
            if _seq >= 0x1000:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _seq = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _seq = 0
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76
    value |= (seq & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


_HEX = set("0123456789abcdefABCDEF-")


def parse_thread_id(raw: object) -> str:
    """Validate a thread id the way Codex does and return its canonical lowercase form."""
    if not isinstance(raw, str):
        raise InvalidSessionId("invalid type: expected a string")
    text = raw[9:] if raw.startswith("urn:uuid:") else raw
    for pos, ch in enumerate(text):
        if ch not in _HEX:
            raise InvalidSessionId(
                "invalid character: expected an optional prefix of `urn:uuid:` followed by "
                f"[0-9a-fA-F-], found `{ch}` at {pos + 1}"
            )
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise InvalidSessionId(
            f"invalid length: expected length 32 for simple format, found {len(text)}"
        ) from None
