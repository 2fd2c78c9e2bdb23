"""Through the real daemon: clients that never read must not grow its memory.

- An events subscriber that never reads: the PUB queue per subscriber is 1000 events, and a
  `turn.updated` is capped at 256 KiB (a bigger Turn carries its latest messages and
  `messagesTruncated`); a 100,000-event queue of whole Turns would hold over 1 GB.
- The same subscriber over Turns of many messages: each `turn.updated` carries only the
  messages added since the Turn's previous one (first and settling events whole), so what it
  holds grows with the Turns' size, not its square (whole Turns: +84 MB over 15 such Turns).
- A DEALER that sends many `session.list` and never reads: its unread replies count in its
  per-connection budget (1,024 in flight, 16 MiB of unread replies beyond the 32 ZeroMQ
  queues), past which it is refused and further replies dropped; a ROUTER that queued every
  reply (SNDHWM 0) would hold 5.9 GB.

Both clients are real ZeroMQ sockets whose receive queues are tiny, so back-pressure reaches
the daemon as it would from a client that has stopped reading.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import msgpack
import pytest
import zmq

from tests.resources.steps import steps_daemon
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(300)

TURNS = 40
RSS_BOUND_MB = 100.0
"""The most the non-reading DEALER may add to the daemon's resident memory."""
SUBSCRIBER_BOUND_MB = 100.0
"""The most a non-reading subscriber may add over the same Turns without it. Its queue may
legitimately hold every event of these 40 Turns (about 200 events of up to ~300 KB, under its
1,000-event bound: ~60 MB), and the allocator adds noise of tens of MB either way (measured
+25 to +83 MB alone, +76 to +102 MB stalled on a loaded machine); a 100,000-event queue
of whole Turns adds about +183 MB, which this bound catches."""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _stalled(ctx: zmq.Context[zmq.Socket[bytes]], kind: int, endpoint: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


def _big_turns_growth(tmp: Path, stalled_subscriber: bool) -> float:
    """RSS growth of a fresh daemon over 40 Turns of 300 KB, with or without a subscriber
    that never reads."""
    d = DaemonProcess(tmp / ("stalled" if stalled_subscriber else "alone")).start()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        assert d.proc is not None
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm up")
        before = _rss_mb(d.proc.pid)
        # Held until the end: a socket that is garbage collected is closed (and reads no more).
        stalled = _stalled(ctx, zmq.SUB, d.events) if stalled_subscriber else None
        time.sleep(0.5)  # the subscription reaches the daemon
        big = "x" * 300_000  # every Turn's events carry ~1.5 MB in all
        for i in range(TURNS):
            assert run_turn(c, sid, f"{i} {big}")["outcome"] == "completed"
        grown = _rss_mb(d.proc.pid) - before
        assert stalled is None or not stalled.closed  # connected, never read, to the end
        assert c.call("host.status")["version"]  # still serving
        return grown
    finally:
        ctx.destroy(linger=0)
        d.stop()


def test_a_subscriber_that_never_reads_does_not_grow_the_daemon(tmp_path: Path) -> None:
    # The allocator alone keeps tens of MB after 40 big Turns; the bound is on what the
    # stalled subscriber adds to that.
    alone = _big_turns_growth(tmp_path, stalled_subscriber=False)
    stalled = _big_turns_growth(tmp_path, stalled_subscriber=True)
    assert stalled - alone < SUBSCRIBER_BOUND_MB, (
        f"alone +{alone:.0f} MB, stalled +{stalled:.0f} MB"
    )


LONG_TURNS = 15
LONG_TURN_TEXT = "steps 40 6000"
"""Each Turn: the user text, 40 reasoning Messages of 6 KB and the reply (~250 KB, 42
messages, ~45 `turn.updated`)."""
LONG_TURNS_BOUND_MB = 30.0
"""The most a subscriber that never reads may add to the daemon over 15 such Turns (stated in
docs/protocol.md). All their events fit its 1,000-event queue: each Turn about twice (its
deltas, then its settling event), ~8 MB in all; were every event to carry the whole Turn
(~125 KB on average), ~85 MB."""


def _long_turns_growth(home: Path, stalled_subscriber: bool) -> float:
    """RSS growth of a fresh daemon over 15 long Turns, with or without a subscriber that never
    reads."""
    with steps_daemon(home) as d:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            assert d.proc is not None
            c = d.client(timeout=60)
            sid = create_session(c)["agentSessionId"]
            run_turn(c, sid, LONG_TURN_TEXT)  # warm: worker, runtime, the allocator's pools
            before = _rss_mb(d.proc.pid)
            # Held until the end: a socket that is garbage collected is closed.
            stalled = _stalled(ctx, zmq.SUB, d.events) if stalled_subscriber else None
            time.sleep(0.5)  # the subscription reaches the daemon
            peak = 0.0
            for _ in range(LONG_TURNS):
                assert run_turn(c, sid, LONG_TURN_TEXT)["outcome"] == "completed"
                peak = max(peak, _rss_mb(d.proc.pid) - before)
            assert stalled is None or not stalled.closed  # connected, never read, to the end
            assert c.call("host.status")["version"]  # still serving
            return peak
        finally:
            ctx.destroy(linger=0)


def test_a_subscriber_that_never_reads_while_long_turns_run(tmp_path: Path) -> None:
    """Turns of many messages: what a stalled subscriber adds is linear in the Turns' size
    (events carry what changed), not quadratic (the whole Turn at every message)."""
    alone = _long_turns_growth(tmp_path / "alone", stalled_subscriber=False)
    stalled = _long_turns_growth(tmp_path / "stalled", stalled_subscriber=True)
    assert stalled - alone < LONG_TURNS_BOUND_MB, (
        f"alone +{alone:.0f} MB, stalled +{stalled:.0f} MB"
    )


def test_a_dealer_that_sends_and_never_reads_does_not_grow_the_daemon(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        assert d.proc is not None
        c = d.client(timeout=60)
        for i in range(200):
            create_session(c, title=f"{i} " + "t" * 500)
        listed = c.call("session.list", {"workspaceId": WS, "limit": 200})["sessions"]
        assert len(listed) == 200
        before = _rss_mb(d.proc.pid)
        dealer = _stalled(ctx, zmq.DEALER, d.api)
        frame = {"v": 1, "method": "session.list", "params": {"workspaceId": WS, "limit": 200}}
        for _ in range(1000):
            dealer.send(msgpack.packb({**frame, "id": str(uuid.uuid4())}), zmq.NOBLOCK)
        # Let the daemon work through what it accepted.
        deadline = time.monotonic() + 60
        peak = 0.0
        while time.monotonic() < deadline:
            peak = max(peak, _rss_mb(d.proc.pid) - before)
            if c.call("host.status") and time.monotonic() > deadline - 50:
                break
            time.sleep(0.2)
        time.sleep(3)
        grown = max(peak, _rss_mb(d.proc.pid) - before)
        assert grown < RSS_BOUND_MB, f"daemon grew {grown:.0f} MB"
        # Other clients are served meanwhile.
        assert len(c.call("session.list", {"workspaceId": WS, "limit": 10})["sessions"]) == 10
        dealer.close()
    finally:
        ctx.destroy(linger=0)
        d.stop()
