"""`turn.updated` events of a Turn whose Interactions are big, through the real daemon: a
question of 300 KiB and an answer of 300 KiB were carried whole in every event of the Turn
(the cap trimmed only its messages), events of ~1-2 MB past the 256 KiB cap, so a subscriber
that does not read held up to 1,000 of them. Such an event now carries the Interactions that do
not fit with `input: {}` (and `output: {}` once answered) and `omitted: true`, the Turn with
`interactionsTruncated: true`, within the cap; `merge_turn` says to read the Turn whole
(`session.timeline`), which carries every Interaction whole."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    settle,
    submit,
    turn_of,
    wait_for,
)
from transport.client import merge_turn
from transport.server import MAX_EVENT_BYTES

QUESTION = "q" * (300 << 10)
ANSWER = "a" * (300 << 10)


def _turn_events(sub: zmq.Socket[bytes], timeout: float = 10.0) -> list[tuple[int, Any]]:
    """`(size, turn)` of every `turn.updated` until none came for a second."""
    got: list[tuple[int, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sub.poll(1000):
        _, body = sub.recv_multipart()
        event = msgpack.unpackb(body, raw=False)
        if event["type"] == "turn.updated":
            got.append((len(body), event["turn"]))
    return got


def test_turn_events_with_big_interactions_stay_under_the_cap(daemon: DaemonProcess) -> None:
    c = daemon.client()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, WS.encode())
    sub.connect(daemon.events)
    try:
        time.sleep(0.5)  # ZeroMQ's slow joiner: let the subscription reach the PUB side
        sid = create_session(c)["agentSessionId"]
        turn_id = submit(c, sid, "/ask " + QUESTION)["turnId"]
        asked = wait_for(lambda: turn_of(c, sid, turn_id)["interactions"])[0]
        assert QUESTION in str(asked["input"])
        c.call(
            "interaction.respond",
            {
                "workspaceId": WS,
                "agentSessionId": sid,
                "turnId": turn_id,
                "requestId": asked["requestId"],
                "response": {"text": ANSWER},
            },
        )
        settled = settle(c, sid, turn_id)
        seen = _turn_events(sub)
        assert seen, "no turn.updated"
        omitted = 0
        for size, turn in seen:
            assert size <= MAX_EVENT_BYTES, (size, turn["phase"])
            for interaction in turn["interactions"]:
                if interaction.get("omitted"):
                    omitted += 1
                    assert turn["interactionsTruncated"] is True
                    assert interaction["input"] == {}
                    assert interaction["requestId"] == asked["requestId"]
            if turn.get("interactionsTruncated"):
                # A client cannot build the whole Turn from it: it reads the timeline.
                assert merge_turn(None, turn) is None
        assert omitted, "no event omitted the big Interaction"
        # The settled event says the Interaction was answered; the timeline carries it whole.
        last = seen[-1][1]
        assert last["phase"] == "settled" and last["interactions"][0]["status"] == "resolved"
        whole = settled["interactions"][0]
        assert QUESTION in str(whole["input"]) and whole["output"]["text"] == ANSWER
    finally:
        sub.close()
        ctx.term()
