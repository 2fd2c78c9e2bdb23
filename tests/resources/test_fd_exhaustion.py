"""Descriptor exhaustion through the real daemon: started with a low fd limit (soft and hard),
it survives a flood of ipc connections and of unauthenticated TCP connections to its CURVE
endpoint, then serves a fresh client and runs a Turn.

The daemon caps what its listeners hold (docs/design/connections.md): libzmq asserts on EMFILE
from accept() on an ipc listener (`Too many open files (src/ipc_listener.cpp:297)`, SIGABRT), so
a flood that took the daemon to its limit would make `host.status` answer 500 (EMFILE importing
a module) and the next ipc connection abort it inside libzmq.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from tests.support.daemon import DaemonProcess, create_session, run_turn, wait_for
from tests.support.floods import dealer_flood, free_port, raw_flood

pytestmark = pytest.mark.timeout(240)

FD_LIMIT = 1024
"""Soft and hard (systemd's default soft limit, here the hard one too): the daemon cannot
raise it; its listeners must stay inside it."""
DEALERS = 200
"""Idle ZeroMQ clients on ipc (their handshake completes; a shed one reconnects by itself)."""
IPC_FLOOD = 1000
"""The owner's own ipc connections, raw: connected, never a byte sent."""
TCP_FLOOD = 1100
"""Unauthenticated TCP connections to the CURVE endpoint (no key: the handshake never ends)."""


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _alive(d: DaemonProcess) -> None:
    assert d.proc is not None
    assert d.proc.poll() is None, f"daemon died ({d.proc.returncode}): {d.tail_log()}"


def test_the_daemon_survives_ipc_and_unauthenticated_tcp_floods_at_a_low_fd_limit(
    tmp_path: Path,
) -> None:
    port = free_port()
    d = DaemonProcess(
        tmp_path / "home", args=("--listen", f"tcp://127.0.0.1:{port}"), preexec_fn=_limit_fds
    ).start()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, 4 * DEALERS)
    try:
        assert d.proc is not None
        pid = d.proc.pid
        limits = Path(f"/proc/{pid}/limits").read_text()
        assert any(
            line.startswith("Max open files") and f" {FD_LIMIT} " in line
            for line in limits.splitlines()
        ), limits
        peak = 0
        # ipc: ZeroMQ clients whose handshake completes (held, idle), then raw connections that
        # never greet; then unauthenticated TCP connections to the CURVE endpoint.
        with dealer_flood(ctx, d.api, DEALERS):
            time.sleep(2)
            peak = max(peak, _open_fds(pid))
            _alive(d)
            with raw_flood(d.api[len("ipc://") :], IPC_FLOOD) as ipc:
                peak = max(peak, _open_fds(pid))
                _alive(d)
                with raw_flood(("127.0.0.1", port), TCP_FLOOD) as tcp:
                    time.sleep(1)
                    peak = max(peak, _open_fds(pid))
                    _alive(d)
                    # Still serving during the flood: a fresh ipc client is answered (its
                    # connection may take the place of an idle one).
                    c = d.client(timeout=30)
                    assert c.call("host.status")["version"]
                    stats = c.call("host.status")["connections"]
            _alive(d)
        print(
            f"fd flood: limit {FD_LIMIT}; {DEALERS} idle ZeroMQ clients, {ipc.held} of"
            f" {IPC_FLOOD} raw ipc and {tcp.held} of {TCP_FLOOD} unauthenticated TCP connections"
            " connected;"
            f" peak {peak} descriptors; {stats}"
        )
        assert (ipc.attempted, tcp.attempted) == (IPC_FLOOD, TCP_FLOOD)
        assert peak < FD_LIMIT, peak
        assert stats["refused"] + stats["shed"] > 0, stats
        assert stats["open"] <= stats["max"], stats
        # After the flood: a fresh client is served and a Turn runs (a worker and an
        # app-server start: the descriptors they need were kept in reserve).
        c = d.client(timeout=60)
        wait_for(lambda: c.call("host.status")["version"], timeout=30)
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "after the flood")["outcome"] == "completed"
        # What was refused is logged (in the guard's summary, written every few seconds).
        assert wait_for(lambda: "connections refused" in d.tail_log(200_000), timeout=20)
        # ... and `agenthost status` says it in words.
        status = subprocess.run(
            [sys.executable, "-m", "agenthost.cli", "--home", str(d.home), "status"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert f"descriptor limit {FD_LIMIT}" in status and " refused, " in status, status
        _alive(d)
    finally:
        ctx.destroy(linger=0)
        d.stop()
