"""The connection guard never shuts down a listener: an `accepted` event it reads after the
connection's descriptor number went to something else — an ipc listener bound again after
`run/` was removed, another socket, a file — is not counted and never acted on
(`transport.connections.accepted_inode`, docs/design/connections.md).

A guard that took whatever the number holds when it reads the event for the connection would
shut the new listener down when refusing it; the listener's next accept4() fails with EINVAL
and libzmq aborts the process (`Invalid argument (src/ipc_listener.cpp:297)`, as the
contention soak met it). The end-to-end case runs in a child process, since that abort ends
the process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from transport.connections import accepted_inode

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("listener_reuse_child.py")


def _child(run: str, *mode: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("LD_PRELOAD", None)  # libzmq as it is: the shim changes nothing on this path
    return subprocess.run(
        [sys.executable, str(CHILD), run, *mode],
        capture_output=True,
        text=True,
        timeout=45,
        env=env,
    )


def test_a_listener_bound_again_on_a_dropped_connections_descriptor_keeps_serving(
    short_tmp: str,
) -> None:
    out = _child(short_tmp)
    what = f"exit {out.returncode}\nstdout: {out.stdout}\nstderr: {out.stderr}"
    assert out.returncode != -signal.SIGABRT, "libzmq aborted (a listener was shut down): " + what
    assert "ipc_listener" not in out.stderr, what
    assert out.returncode == 0, what
    # The guard read the event and let it be (counted stale, nothing refused).
    assert "guard: stale=1 refused={}" in out.stdout, what
    assert "served: True" in out.stdout, what


def test_accepted_inode_names_only_a_connection_accepted_on_the_endpoint(short_tmp: str) -> None:
    path = os.path.join(short_tmp, "api.sock")
    other = os.path.join(short_tmp, "other.sock")
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other_listener,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other_client,
        open(os.devnull, "rb") as a_file,
    ):
        listener.bind(path)
        listener.listen()
        other_listener.bind(other)
        other_listener.listen()
        client.connect(path)
        other_client.connect(other)
        accepted, _ = listener.accept()
        accepted_elsewhere, _ = other_listener.accept()
        with accepted, accepted_elsewhere:
            endpoint = f"ipc://{path}"
            assert accepted_inode(accepted.fileno(), endpoint) == os.fstat(accepted.fileno()).st_ino
            # The file gone (run/ removed): the connection still has its address.
            os.unlink(path)
            assert accepted_inode(accepted.fileno(), endpoint) == os.fstat(accepted.fileno()).st_ino
            assert accepted_inode(listener.fileno(), endpoint) is None  # a listener
            assert accepted_inode(accepted_elsewhere.fileno(), endpoint) is None  # another endpoint
            assert accepted_inode(client.fileno(), endpoint) is None  # a connecting side
            assert accepted_inode(a_file.fileno(), endpoint) is None  # not a socket
            closed = accepted.fileno()
        assert accepted_inode(closed, endpoint) is None  # closed


def test_accepted_inode_on_tcp_compares_the_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            with accepted:
                ino = os.fstat(accepted.fileno()).st_ino
                assert accepted_inode(accepted.fileno(), f"tcp://127.0.0.1:{port}") == ino
                assert accepted_inode(accepted.fileno(), f"tcp://127.0.0.1:{port + 1}") is None
                assert accepted_inode(listener.fileno(), f"tcp://127.0.0.1:{port}") is None
                assert accepted_inode(client.fileno(), f"tcp://127.0.0.1:{port}") is None


def test_at_the_descriptor_limit_a_shutdown_waits_for_a_bind_in_progress(
    short_tmp: str,
) -> None:
    # Without a free descriptor the guard cannot take its own reference to the socket it shuts
    # down; it shuts the number down under `binding()`, which a re-bind holds, so a listener
    # being made cannot take that number between the check and the shutdown.
    out = _child(short_tmp, "at-the-limit")
    what = f"exit {out.returncode}\nstdout: {out.stdout}\nstderr: {out.stderr}"
    assert out.returncode == 0, what
    assert "waited for the bind: True; refused after it: True" in out.stdout, what


def test_accepted_inode_of_a_connection_closed_right_after_its_fstat_is_none(
    short_tmp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libzmq closes a connection that came and went at once on its own thread: between the
    guard's fstat and its look at the socket the descriptor may be gone (EBADF). The guard
    must take it as closed, not fail: a clean-clone CI saw the guard thread die of it ("connection
    guard failed; connections are no longer capped") and every replaced listener stay bound."""
    path = os.path.join(short_tmp, "api.sock")
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client,
    ):
        listener.bind(path)
        listener.listen()
        client.connect(path)
        accepted, _ = listener.accept()
        fd = accepted.detach()
        real_fstat = os.fstat

        def fstat_then_closed(n: int) -> os.stat_result:
            st = real_fstat(n)
            if n == fd:
                os.close(n)  # libzmq's thread, in between
            return st

        monkeypatch.setattr(os, "fstat", fstat_then_closed)
        try:
            inode = accepted_inode(fd, f"ipc://{path}")
        finally:
            monkeypatch.undo()
        assert inode is None
