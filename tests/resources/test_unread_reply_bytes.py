"""A client that never reads large replies through the real daemon: what the daemon keeps for it
is bounded in bytes, not in replies.

Were ZeroMQ to queue 32 replies per connection whatever their size, and a `session.list` page to
carry every listed Session whole, 20 `session.list` of 200 Sessions with ~1 MB settings each
would take the daemon from about 426 MB to 5 GB. A page ends at ~1 MiB (`nextCursor` continues),
and of large replies ZeroMQ holds at most 8 MiB per connection not yet written to its socket
(`transport.server`); further replies wait in the 16 MiB backlog or are dropped.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgpack
import pytest
import zmq

from tests.support.daemon import WS, DaemonProcess, create_session, wait_for

pytestmark = pytest.mark.timeout(240)

SESSIONS = 12
SETTINGS_BYTES = 900_000
"""Each Session's settings (a request frame is at most 1 MiB)."""
REQUESTS = 200
HELD_BOUND_MB = 32.0
"""What the daemon may hold for one connection that does not read (docs/protocol.md): 8 MiB
of large replies in ZeroMQ, 16 MiB of backlog, one reply over each, the socket buffers."""
RSS_BOUND_MB = 100.0
"""RSS growth allowed over the flood (what is held plus the allocator's noise)."""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_client_that_never_reads_large_replies_holds_a_bounded_number_of_bytes(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        assert d.proc is not None
        c = d.client(timeout=60)
        for i in range(SESSIONS):
            create_session(c, settings={"blob": f"{i}" + "s" * SETTINGS_BYTES})
        # The whole list is still there, page by page.
        seen, cursor = 0, None
        while True:
            params = {"workspaceId": WS, "limit": 200, **({"cursor": cursor} if cursor else {})}
            page = c.call("session.list", params)
            assert len(page["sessions"]) >= 1
            assert all(len(s["settings"]["blob"]) > SETTINGS_BYTES for s in page["sessions"])
            seen += len(page["sessions"])
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert seen == SESSIONS
        before = _rss_mb(d.proc.pid)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVHWM, 1)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(d.api)
        frame = {"v": 1, "method": "session.list", "params": {"workspaceId": WS, "limit": 200}}
        for _ in range(REQUESTS):
            dealer.send(msgpack.packb({**frame, "id": str(uuid.uuid4())}), zmq.NOBLOCK)
        peak = 0.0

        def all_answered() -> bool:
            # Served meanwhile; and only once every one of the 200 is answered (sent, kept or
            # dropped) is what the daemon holds for the client what it reads: a reply made
            # after the client began to read (a loaded host) goes into the room it freed.
            nonlocal peak
            peak = max(peak, _rss_mb(d.proc.pid) - before)
            status = c.call("host.status")
            assert status["version"]
            return bool(status["requestsInFlight"] == 1)

        wait_for(all_answered, timeout=180, interval=0.2)
        # What the daemon held for the client is what it reads now.
        held = 0
        while dealer.poll(1000):
            held += len(dealer.recv())
        held_mb = held / (1 << 20)
        print(f"held for the client: {held_mb:.1f} MB; daemon RSS peak +{peak:.0f} MB")
        assert held_mb < HELD_BOUND_MB, f"{held_mb:.1f} MB held for a client that did not read"
        assert peak < RSS_BOUND_MB, f"daemon grew {peak:.0f} MB"
        dealer.close()
    finally:
        ctx.destroy(linger=0)
        d.stop()
