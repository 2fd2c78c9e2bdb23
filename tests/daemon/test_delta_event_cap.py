"""`message.delta` events of a model that streams its whole reply as one delta, through the real
daemon and a real Tutti Agent: a delta of 600 KiB was published as one event past the 256 KiB
cap, so a subscriber that does not read could hold 1,000 of them. A delta too big for an event
is now published as several `message.delta` events of the same item, in order, each within the
cap; joined they are the delta (docs/protocol.md, "Streaming")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from agenthost.publisher import DELTA_PIECE_CHARS, StreamDelta, delta_event, delta_pieces
from model_fakes.responses import ResponsesServer
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from transport.server import MAX_EVENT_BYTES

pytestmark = pytest.mark.timeout(180)

REPLY = ("d" * 1000 + "é€😀") * 600
"""A reply of ~600 KiB (with characters of two, three and four UTF-8 bytes), streamed as one
delta."""


def _heard(sub: zmq.Socket[bytes], turn_id: str) -> list[tuple[int, dict[str, Any]]]:
    """`(size, event)` of every event heard until the Turn's settling event and a second of
    quiet after it."""
    got: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + 60
    settled = False
    while time.monotonic() < deadline and (sub.poll(1000) or not settled):
        if not sub.poll(0):
            continue
        body = sub.recv_multipart()[-1]
        event = msgpack.unpackb(body, raw=False)
        got.append((len(body), event))
        turn = event.get("turn") or {}
        if turn.get("turnId") == turn_id and turn.get("phase") == "settled":
            settled = True
    return got


def test_a_delta_past_the_event_cap_is_split_in_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with ResponsesServer(lambda body: REPLY, delta_chars=len(REPLY)) as model:
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{model.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, WS.encode())
        sub.connect(d.events)
        try:
            time.sleep(0.5)  # ZeroMQ's slow joiner: the subscription reaches the PUB side
            c = d.client(timeout=60)
            sid = create_session(c)["agentSessionId"]
            turn = run_turn(c, sid, "one big delta")
            heard = _heard(sub, turn["turnId"])
        finally:
            sub.close()
            ctx.term()
            d.stop()
    assert turn["outcome"] == "completed", turn
    [reply] = [m for m in turn["messages"] if m["kind"] == "assistant"]
    assert reply["text"] == REPLY
    item = reply["payload"]["providerItemId"]
    deltas = [
        (size, e)
        for size, e in heard
        if e["type"] == "message.delta" and e["turnId"] == turn["turnId"]
    ]
    assert {e["itemId"] for _, e in deltas} == {item}
    assert "".join(e["delta"] for _, e in deltas) == REPLY
    assert len(deltas) > 1, [size for size, _ in deltas]
    too_big = [(e["type"], size) for size, e in heard if size > MAX_EVENT_BYTES]
    assert too_big == [], too_big


def test_a_progress_line_past_the_event_cap_is_cut_not_split() -> None:
    """A `progress` delta is one line a client shows in place of the one before: one event,
    cut to `DELTA_PIECE_CHARS` (ending in `…`), not pieces of which a client would show the
    last."""
    event = {"type": "message.delta", "turnId": "t", "itemId": "retry-1", "kind": "progress"}
    line = "retrying: " + "x" * (DELTA_PIECE_CHARS * 3)
    [piece] = delta_pieces(StreamDelta(WS, "s", {**event, "delta": line}))
    text = delta_event(piece)["delta"]
    assert len(text) == DELTA_PIECE_CHARS and text.endswith("\u2026")
    assert line.startswith(text[:-1])
    small = StreamDelta(WS, "s", {**event, "delta": "retrying"})
    assert delta_pieces(small) == [small]
