"""The host↔worker link's frame check: a msgpack map whose `t` is one of the link's types
is taken, anything else is refused (`LinkProtocolError`) and dropped by the receiver."""

from __future__ import annotations

import msgpack
import pytest

from transport.worker_link import (
    MAX_LINK_FRAME,
    LinkProtocolError,
    MsgType,
    decode,
    encode,
    evt_msg,
)


@pytest.mark.parametrize("kind", list(MsgType))
def test_every_link_type_is_taken(kind: MsgType) -> None:
    assert decode(encode({"t": kind.value, "x": 1})) == {"t": kind.value, "x": 1}


def test_an_event_frame_round_trips() -> None:
    msg = evt_msg("ws/s", {"type": "message.delta", "delta": "d00 "})
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize(
    "frame",
    [
        msgpack.packb({"t": "bogus"}),
        msgpack.packb({"t": None}),
        msgpack.packb({"x": "evt"}),
        msgpack.packb(["evt"]),
        msgpack.packb("evt"),
        b"\xc1 not msgpack",
        b"\x81" + msgpack.packb("t") + msgpack.packb("evt") + b"x" * (MAX_LINK_FRAME + 1),
    ],
)
def test_anything_else_is_refused(frame: bytes) -> None:
    with pytest.raises(LinkProtocolError):
        decode(frame)
