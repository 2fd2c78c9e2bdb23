"""An ipc connection that arrives while the daemon is at its descriptor limit must not abort
it. libzmq 4.3.5 asserts on EMFILE from accept() on an ipc listener (SIGABRT); the daemon
runs with the accept shim (transport/accept_shim.py), which reports it as ENFILE, which libzmq
tolerates: the connection waits in the kernel's backlog until a descriptor frees.

The limit is reached exactly, not by a flood: the test lowers the running daemon's soft
RLIMIT_NOFILE (prlimit) to its lowest free descriptor, so the very next descriptor it would
make fails with EMFILE — then connects a fresh client over ipc."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.daemon import DaemonProcess, create_session, run_turn, wait_for
from transport.accept_shim import build
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def _at_the_limit(pid: int) -> tuple[int, int]:
    """Lower the daemon's soft descriptor limit to its lowest free descriptor; the old limits."""
    proc = psutil.Process(pid)
    soft, hard = proc.rlimit(psutil.RLIMIT_NOFILE)
    # The lowest over a few looks: a descriptor the daemon holds for a moment (the connection
    # guard's look at its own fd table) would otherwise leave a free one below the limit.
    lowest_free = 1 << 30
    for _ in range(8):
        used = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
        lowest_free = min(lowest_free, min(set(range(max(used) + 2)) - used))
        time.sleep(0.007)
    proc.rlimit(psutil.RLIMIT_NOFILE, (lowest_free, hard))
    return soft, hard


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


def _connect_at_the_limit(d: DaemonProcess) -> tuple[Client, tuple[int, int]]:
    assert d.proc is not None
    limits = _at_the_limit(d.proc.pid)
    c = d.client(timeout=1.5)  # connects now, at the limit
    # Accepted by libzmq's I/O thread at EMFILE: the connection cannot be served yet.
    with pytest.raises(TimeoutError):
        c.call("host.status")
    return c, limits


def test_an_ipc_client_arriving_at_the_descriptor_limit_waits_and_is_then_served(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    assert d.proc is not None
    try:
        warm = d.client()
        shim = warm.call("host.status")["connections"]["acceptShim"]
        assert shim == {"loaded": True, "unavailable": None}, shim
        _c, (soft, hard) = _connect_at_the_limit(d)
        time.sleep(0.5)
        assert d.proc.poll() is None, f"daemon died ({d.proc.returncode}): {d.tail_log()}"
        psutil.Process(d.proc.pid).rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
        fresh = d.client(timeout=20)
        assert fresh.call("host.status")["protocol"] == 1
        sid = create_session(fresh)["agentSessionId"]
        assert run_turn(fresh, sid, "after the limit")["outcome"] == "completed"
        assert d.proc.poll() is None
    finally:
        d.stop()


def test_without_the_shim_the_same_accept_aborts_the_daemon(tmp_path: Path) -> None:
    # What the shim is for (and the proof the test above reaches EMFILE): with it turned
    # off, libzmq aborts the whole daemon on that accept.
    d = DaemonProcess(tmp_path / "home", env={"AGENTHOST_NO_ACCEPT_SHIM": "1"}).start()
    assert d.proc is not None
    try:
        shim = d.client().call("host.status")["connections"]["acceptShim"]
        assert shim["loaded"] is False and "turned off" in shim["unavailable"], shim
        _connect_at_the_limit(d)
        wait_for(lambda: d.proc is not None and d.proc.poll() is not None, 10)
        assert d.proc.returncode == -6  # SIGABRT
        assert "Too many open files (src/ipc_listener.cpp" in d.tail_log()
    finally:
        d.kill()


def test_a_test_daemon_is_handed_its_shim_and_starts_in_one_interpreter(tmp_path: Path) -> None:
    """The harness preloads the shim as `serve`'s re-execution would (`preload_env`): the
    daemon finds it loaded and runs in the interpreter it was started in, not a second one
    (a Python start less for every test daemon). Each interpreter's `-X importtime` profile
    opens with its header line, once."""
    d = DaemonProcess(tmp_path / "home", env={"PYTHONPROFILEIMPORTTIME": "1"}).start()
    try:
        shim = d.client().call("host.status")["connections"]["acceptShim"]
        assert shim == {"loaded": True, "unavailable": None}, shim
        assert d.log_path.read_text(errors="replace").count("import time: self [us]") == 1
    finally:
        d.stop()


def test_the_workers_and_providers_do_not_inherit_the_shim(tmp_path: Path) -> None:
    # The daemon re-executes itself with the shim, as a user's does (the harness's preloaded
    # start hands the workers the same environment).
    d = DaemonProcess(tmp_path / "home", shim_reexec=True).start()
    assert d.proc is not None
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "hello")["outcome"] == "completed"
        assert "accept_shim" in _maps(d.proc.pid)
        children = psutil.Process(d.proc.pid).children(recursive=True)
        assert children, "a Turn started no worker"
        for child in children:
            assert "accept_shim" not in _maps(child.pid), child.cmdline()
            preloaded = [v for v in _environ(child.pid) if v.startswith("LD_PRELOAD=")]
            assert not [v for v in preloaded if "accept_shim" in v], child.cmdline()
            assert not [v for v in _environ(child.pid) if v.startswith("AGENTHOST_ACCEPT_SHIM")]
    finally:
        d.stop()


def test_the_launcher_finds_serve_past_the_global_options_and_only_there() -> None:
    from agenthost.launch import subcommand

    assert subcommand(["--home", "/h", "serve", "--listen", "x"]) == "serve"
    assert subcommand(["--home=/h", "-v", "serve"]) == "serve"
    assert subcommand(["--workspace", "serve", "say", "serve"]) == "say"
    assert subcommand(["say", "serve"]) == "say"
    assert subcommand(["--json"]) is None


_SHUT_LISTENER = """
import errno, socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen()
listener.shutdown(socket.SHUT_RDWR)  # a listener shut down: a blocking accept fails EINVAL
try:
    listener.accept()
except OSError as exc:
    print(exc.errno == errno.EINVAL, listener.fileno())
"""


def test_an_accept_failing_with_einval_is_passed_on_and_its_descriptor_described(
    tmp_path: Path,
) -> None:
    # What the abort `Invalid argument (src/ipc_listener.cpp:…)` does not say: which
    # descriptor it was and what it held (docs/design/connections.md).
    library = build()
    out = subprocess.run(
        [sys.executable, "-c", _SHUT_LISTENER, str(tmp_path / "l.sock")],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, LD_PRELOAD=str(library)),
    )
    assert out.returncode == 0, out.stderr
    einval, fd = out.stdout.split()
    assert einval == "True", out  # unchanged: libzmq must not retry a listener that is gone
    assert re.search(
        rf"^accept shim: accept on descriptor {fd} failed with EINVAL: socket:\[\d+\], socket,"
        r" SO_ACCEPTCONN 1$",
        out.stderr,
        re.MULTILINE,
    ), out.stderr
