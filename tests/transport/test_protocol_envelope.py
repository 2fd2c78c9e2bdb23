"""One envelope for both directions (`protocol.envelope`): what the client packs the daemon
decodes, what the daemon packs the client reads, and the module needs nothing but msgpack."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import pytest

from protocol.envelope import (
    EnvelopeError,
    decode_event,
    decode_reply,
    decode_request,
    encode_error,
    encode_event,
    encode_request,
    encode_result,
    reply_outcome,
)
from protocol.events import UnknownEvent
from protocol.methods import FORK_CREATE

pytestmark = pytest.mark.timeout(60)


def test_a_client_request_is_what_the_daemon_decodes() -> None:
    params = {"workspaceId": "w", "point": {"type": "latestSettled"}}
    frame = encode_request("c-1", FORK_CREATE.name, params)
    assert msgpack.unpackb(frame) == {
        "v": 1,
        "id": "c-1",
        "method": "fork.create",
        "params": params,
    }
    request = decode_request(frame)
    assert (request.id, request.method, request.params) == ("c-1", "fork.create", params)


def test_a_daemon_reply_is_what_the_client_reads() -> None:
    ok = decode_reply(encode_result("c-1", 202, {"operation": {"status": "prepared"}}))
    assert ok["id"] == "c-1"
    assert reply_outcome(ok) == (202, {"operation": {"status": "prepared"}})
    error = {"code": "not_found", "reason": "x", "message": "m", "retryable": False, "params": {}}
    assert reply_outcome(decode_reply(encode_error("c-2", 404, error))) == (404, error)
    assert decode_reply(b"\xc1") == {"undecodable": b"\xc1"}
    assert reply_outcome({"id": "c-3"}) == (500, {})


def test_an_error_whose_params_cannot_be_packed_is_still_a_reply() -> None:
    error = {"code": "internal", "reason": "x", "message": "m", "retryable": False}
    reply = decode_reply(encode_error(None, 500, {**error, "params": {"bad": object()}}))
    assert reply == {"v": 1, "id": None, "status": 500, "error": {**error, "params": {}}}


def test_events_round_trip() -> None:
    event = {"type": "session.removed", "agentSessionId": "s"}
    assert decode_event(encode_event(event)) == event
    assert decode_event(msgpack.packb([1])) == UnknownEvent(
        "", {"value": [1]}, "not a map but list"
    )


def test_a_bad_frame_says_why_without_our_errors() -> None:
    with pytest.raises(EnvelopeError, match="integer 'v'"):
        decode_request(msgpack.packb({"id": "x", "method": "m"}))
    with pytest.raises(EnvelopeError) as big:
        decode_request(b"\x00" * ((1 << 20) + 1))
    assert big.value.too_large


def test_the_envelope_loads_only_msgpack() -> None:
    code = (
        "import sys, json; import protocol.envelope, protocol.methods, protocol.events; "
        "print(json.dumps(sorted(m for m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    tops = {m.split(".")[0] for m in __import__("json").loads(out.stdout)}
    ours = {"domain", "storage", "actors", "transport", "drivers", "agenthost", "client", "zmq"}
    assert not tops & ours, tops & ours
