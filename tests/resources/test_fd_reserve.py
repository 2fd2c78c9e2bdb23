"""A connection flood never takes the daemon to its descriptor limit, however far behind the
connection guard is: the accept shim closes a connection accepted into the top of the
descriptor table at once (docs/design/connections.md, *The descriptor reserve at accept*).

The guard counts after the fact, on a thread of its own; a guard that is outrun is made
deterministic here: the daemon starts at a limit of 1,024 (its guard's thresholds: 768
descriptors, 256 connections), then its soft limit is lowered (prlimit) to 200 above what it
holds, so nothing a flood of raw ipc connections brings is refused by the guard before the
limit. Without the reserve at accept, the flood takes the daemon to exactly its limit (the
shim's EMFILE → ENFILE keeps it alive, and nothing else can open a descriptor); with it, the
daemon keeps its reserve free, a client connected before the flood is answered and a Turn
starts its worker (whose link is accepted inside the reserve) while the flood is held."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.daemon import DaemonProcess, create_session, run_turn
from tests.support.invariants import check_descriptor_reserve
from transport.connections import ConnectionLimits

pytestmark = pytest.mark.timeout(180)

FD_LIMIT = 1024
HEADROOM = 200
"""The lowered limit: this many descriptors above what the daemon holds before the flood
(below the guard's connection cap, 256, and its descriptor threshold, 768)."""
FLOOD = 400
"""Raw ipc connections, twice the headroom; one the daemon's full backlog turns away is tried
again (for up to `PERSIST_S`), so the flood outruns libzmq's accepts every time."""
PERSIST_S = 4.0


def _limit_fds() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@contextlib.contextmanager
def persistent_flood(path: str, count: int) -> Iterator[list[socket.socket]]:
    """`count` raw connections to the ipc `path`, never sending; one turned away (a full
    backlog: EAGAIN) is tried again until `PERSIST_S` has passed."""
    held: list[socket.socket] = []
    deadline = time.monotonic() + PERSIST_S
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            while True:
                try:
                    s.connect(path)
                    held.append(s)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        s.close()
                        break
                    time.sleep(0.001)
            if time.monotonic() > deadline:
                break
        yield held
    finally:
        for s in held:
            s.close()


class Peak:
    """The most descriptors the daemon held, sampled from /proc until `stop`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, len(os.listdir(f"/proc/{self.pid}/fd")))
            except OSError:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def test_a_flood_the_guard_cannot_refuse_in_time_leaves_the_reserve_free(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path / "home", preexec_fn=_limit_fds).start()
    assert d.proc is not None
    proc = psutil.Process(d.proc.pid)
    try:
        c = d.client(timeout=60)
        assert c.call("host.status")["connections"]["acceptShim"]["loaded"] is True
        sid = create_session(c)["agentSessionId"]
        run_dir = Path(d.api[len("ipc://") :]).parent
        held = len(os.listdir(f"/proc/{proc.pid}/fd"))
        lowered = held + HEADROOM
        reserve = ConnectionLimits.for_fd_limit(FD_LIMIT).accept_reserve
        assert lowered < FD_LIMIT - ConnectionLimits.for_fd_limit(FD_LIMIT).fd_reserve
        proc.rlimit(psutil.RLIMIT_NOFILE, (lowered, FD_LIMIT))
        peak = Peak(proc.pid)
        try:
            with persistent_flood(d.api[len("ipc://") :], FLOOD) as flood:
                time.sleep(1.0)  # libzmq has accepted what it will
                connected = len(flood)
                during = len(os.listdir(f"/proc/{proc.pid}/fd"))
                # Served while the flood is held: a request of a client connected before,
                # and a Turn, whose worker and provider need descriptors of the reserve.
                status = c.call("host.status")["connections"]
                violations = check_descriptor_reserve(proc.pid, run_dir, reserve)
                turn = run_turn(c, sid, "during the flood")
                after_turn = c.call("host.status")["connections"]["refusedAtAccept"]
        finally:
            top = peak.stop()
        print(
            f"fd reserve: limit lowered to {lowered} ({held} held), {connected} of {FLOOD} raw"
            f" ipc connections connected; peak {top}, {during} during the flood; {status}"
        )
        assert proc.is_running() and d.proc.poll() is None, d.tail_log()
        assert connected == FLOOD  # none turned away for good: the refused ones were closed
        assert top < lowered, (top, lowered)
        assert violations == [], violations  # no accepted connection in the reserve
        # The connections stopped at the reserve: the daemon's own use is what is above it.
        assert during <= lowered - reserve + 40, (during, lowered, reserve)
        assert status["refusedAtAccept"] > 0, status
        assert turn["outcome"] == "completed", turn
        # Its worker's link was accepted inside the reserve, never closed there.
        assert after_turn == status["refusedAtAccept"], (after_turn, status)
        proc.rlimit(psutil.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
        fresh = d.client(timeout=30)
        assert fresh.call("host.status")["protocol"] == 1
    finally:
        d.stop()
