"""Many short-lived clients against the real daemon: the daemon's CPU per request as the
clients it answered within `RECENTLY_ANSWERED_S` pass `MAX_ANSWERED_PEERS`.

Batches of 2,000 clients, one after another: each a new DEALER that sends one `session.get`
of an unknown Session (answered 404 during dispatch, on the transport thread), reads the
reply and closes. Reported per batch: the daemon's CPU seconds (utime + stime from
/proc/PID/stat) and the wall time. The first two batches stay under 4,096 clients answered;
the later ones are past it.

`build/venv/bin/python -m bench.many_clients [BATCHES]`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import zmq

from bench.harness import BenchDaemon

BATCH = 2000


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    frame = msgpack.packb(
        {
            "v": 1,
            "id": "x",
            "method": "session.get",
            "params": {
                "workspaceId": "w",
                "agentSessionId": "00000000-0000-0000-0000-000000000000",
            },
        }
    )
    with (
        tempfile.TemporaryDirectory(prefix="many-clients-") as tmp,
        BenchDaemon(Path(tmp) / "home").start() as daemon,
    ):
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            for batch in range(batches):
                cpu, wall = _cpu_s(daemon.pid), time.monotonic()
                for _ in range(BATCH):
                    sock = ctx.socket(zmq.DEALER)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(daemon.api)
                    sock.send(frame)
                    if not sock.poll(10_000):
                        raise SystemExit("no reply in 10 s")
                    sock.recv()
                    sock.close()
                print(
                    f"batch {batch + 1}: clients {BATCH * (batch + 1)}, daemon CPU"
                    f" {_cpu_s(daemon.pid) - cpu:.2f} s, wall {time.monotonic() - wall:.2f} s",
                    flush=True,
                )
        finally:
            ctx.destroy(linger=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
