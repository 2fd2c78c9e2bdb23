"""Events that carry a Session, through the real daemon: a Session's `settings` may take most of
a 1 MiB request, and every write of it (a pin, a Turn's start and end) published it whole in a
`session.upserted` (and a fork's child in its `fork.operation`), so a subscriber that does not
read held up to 1,000 such events of ~1 MiB — four times the per-subscriber bound the events'
256 KiB cap promises. Such an event now carries the Session with `settings: {}` and
`settingsOmitted: true` (read them with `session.get`), within the cap; small settings are
carried as before."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq

from tests.support.daemon import WS, DaemonProcess, create_session, fork_params, run_turn
from transport.server import MAX_EVENT_BYTES

BIG = {"blob": "x" * (600 << 10), "theme": "dark"}


def _events(
    sub: zmq.Socket[bytes], want: int, timeout: float = 30.0, *, until_fork: bool = False
) -> list[tuple[int, Any]]:
    """`(size, event)` of the next `want` Session-carrying events (with `until_fork`, also up
    to the first `fork.operation` carrying its child)."""
    got: list[tuple[int, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (
        len(got) < want or (until_fork and not any(e["type"] == "fork.operation" for _, e in got))
    ):
        if not sub.poll(200):
            continue
        _, body = sub.recv_multipart()
        event = msgpack.unpackb(body, raw=False)
        if event["type"] == "session.upserted" or (
            event["type"] == "fork.operation" and event["operation"]["session"] is not None
        ):
            got.append((len(body), event))
    return got


def test_events_of_a_session_with_big_settings_stay_under_the_cap(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, WS.encode())
    sub.connect(daemon.events)
    try:
        time.sleep(0.5)  # ZeroMQ's slow joiner: let the subscription reach the PUB side
        small = create_session(c, settings={"theme": "dark"})
        size, event = _events(sub, 1)[0]
        assert event["session"]["settings"] == {"theme": "dark"}
        assert "settingsOmitted" not in event["session"]
        big = create_session(c, settings=BIG)
        sid = big["agentSessionId"]
        assert big["settings"] == BIG  # the reply carries them whole
        c.call("session.pin", {"workspaceId": WS, "agentSessionId": sid, "pinned": True})
        turn = run_turn(c, sid, "hello")
        op = c.call("fork.create", fork_params(WS, sid, turn["turnId"]))["operation"]
        assert op["status"] == "committed" and op["session"]["settings"] == BIG
        seen = _events(sub, 5, until_fork=True)
        assert len(seen) >= 5, seen
        for size, event in seen:
            session = event["session"] if "session" in event else event["operation"]["session"]
            assert size <= MAX_EVENT_BYTES, (size, event["type"])
            assert session["settings"] == {} and session["settingsOmitted"] is True
        assert any(e["type"] == "fork.operation" for _, e in seen)
        # The Session read whole, and a small one's events unchanged.
        got = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert got["settings"] == BIG and "settingsOmitted" not in got
        assert small["settings"] == {"theme": "dark"}
    finally:
        sub.close()
        ctx.term()
