"""A client that never reads large replies, against the real daemon: how much it grows.

Sessions with ~0.9 MB of settings each (a request frame is at most 1 MiB); one DEALER whose
receive side is tiny (RCVHWM 1, RCVBUF 4 KiB) sends `session.list` (limit 200) and never
reads. Reported: the daemon's RSS before, its peak growth while the requests are served, and
the bytes the client finally reads when it drains (= what the daemon held for it, in ZeroMQ,
its backlog and the socket buffers), plus what one page carries.

`build/venv/bin/python -m bench.unread_replies [--quick|--smoke]`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import msgpack
import zmq

from bench.common import BenchResult, Mode, Table, bench_main, log, pick
from bench.harness import WS, BenchDaemon

SETTINGS_BYTES = 900_000


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(mode: Mode) -> BenchResult:
    sessions = pick(mode, 200, 60, 20)
    requests = pick(mode, 20, 20, 20)
    settle_s = pick(mode, 30.0, 20.0, 10.0)
    tmp = Path(tempfile.mkdtemp(prefix="agenthost-unread-"))
    result = BenchResult("unread_replies", "", mode.value)
    d = BenchDaemon(tmp / "home").start()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        c = d.client()
        log(f"creating {sessions} Sessions with {SETTINGS_BYTES} B of settings each")
        for i in range(sessions):
            c.call(
                "session.create",
                {
                    "workspaceId": WS,
                    "provider": "tutti-agent",
                    "settings": {"blob": f"{i}" + "s" * SETTINGS_BYTES},
                },
            )
        page = c.call("session.list", {"workspaceId": WS, "limit": 200})
        page_bytes = len(msgpack.packb(page))
        before = _rss_mb(d.pid)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVHWM, 1)
        dealer.setsockopt(zmq.RCVBUF, 4096)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(d.api)
        frame = {"v": 1, "method": "session.list", "params": {"workspaceId": WS, "limit": 200}}
        for _ in range(requests):
            dealer.send(msgpack.packb({**frame, "id": str(uuid.uuid4())}), zmq.NOBLOCK)
        peak = 0.0
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            peak = max(peak, _rss_mb(d.pid) - before)
            time.sleep(0.1)
        held = 0
        replies = 0
        while dealer.poll(2000):
            held += len(dealer.recv())
            replies += 1
        dealer.close()
        result.tables.append(
            Table(
                f"a client that never reads: {requests} session.list of {sessions} Sessions"
                f" with {SETTINGS_BYTES / 1e6:.1f} MB settings",
                ("figure", "value"),
                (
                    ("RSS before (MB)", round(before)),
                    ("RSS peak growth (MB)", round(peak)),
                    ("held for the client, read when it drains (MB)", round(held / 2**20, 1)),
                    ("replies it then read", replies),
                    ("Sessions in one page (limit 200)", len(page["sessions"])),
                    ("bytes of one page (MB)", round(page_bytes / 2**20, 2)),
                ),
            )
        )
        result.figures.update(
            {
                "rss_before_mb": before,
                "rss_peak_growth_mb": peak,
                "held_mb": held / 2**20,
                "page_sessions": len(page["sessions"]),
                "page_mb": page_bytes / 2**20,
            }
        )
    finally:
        ctx.destroy(linger=0)
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.unread_replies", __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
