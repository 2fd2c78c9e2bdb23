"""Access: the run dir is 0700 and its sockets 0600; another local user
(`nobody`, via setpriv) can neither connect to the API socket nor read the store, even when
the home's parents are world-traversable; TCP listens on loopback only unless
`--allow-remote`; and no method reaches another workspace's Sessions or operations."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.config import ConfigError, check_listen
from agenthost.keys import load_connection
from tests.reliability.reliability_harness import fork_params
from tests.support.daemon import DaemonProcess, create_session, run_turn, timeline, wait_for
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter lives under /root (0700)


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """Run a stdlib-only Python snippet as user nobody; it prints one verdict word."""
    setpriv = shutil.which("setpriv")
    assert setpriv and os.path.exists(SYSTEM_PYTHON), "setpriv and /usr/bin/python3 are needed"
    return subprocess.run(
        [
            setpriv,
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            SYSTEM_PYTHON,
            "-c",
            textwrap.dedent(code),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def open_parent() -> Iterator[Path]:
    """A home parent any user may traverse, as a real home directory (0755) is: so only the
    daemon's own modes stand between `nobody` and its files."""
    if os.geteuid() != 0:
        pytest.fail("the access tests run as root (they switch to nobody with setpriv)")
    base = Path(tempfile.mkdtemp(prefix="agenthost-access-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def daemon(open_parent: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(open_parent / "home").start()
    try:
        yield d
    finally:
        d.stop()


def test_run_dir_is_0700_and_sockets_are_0600(daemon: DaemonProcess) -> None:
    run = daemon.home / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    for name in ("api.sock", "events.sock", "events-exact.sock"):
        st = (run / name).stat()
        assert stat.S_ISSOCK(st.st_mode), name
        assert stat.S_IMODE(st.st_mode) == 0o600, (name, oct(st.st_mode))


def test_another_user_cannot_connect_to_the_api_socket(daemon: DaemonProcess) -> None:
    sock_path = daemon.home / "run" / "api.sock"
    # Control: nobody can reach the home itself, so the refusal below is the daemon's doing.
    listing = as_nobody(f"import os; print(sorted(os.listdir({str(daemon.home)!r})))")
    assert listing.returncode == 0 and "run" in listing.stdout, listing
    probe = as_nobody(
        f"""
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect({str(sock_path)!r})
            print("CONNECTED")
        except PermissionError:
            print("DENIED")
        """
    )
    assert probe.stdout.strip() == "DENIED", probe
    # Control: root connects fine, so the socket is live.
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as s:
        s.connect(str(sock_path))


def test_another_user_cannot_read_the_store(daemon: DaemonProcess) -> None:
    store = daemon.home / "store.sqlite3"
    assert store.exists()
    probe = as_nobody(
        f"""
        try:
            with open({str(store)!r}, "rb") as f:
                print("READ", len(f.read(100)))
        except PermissionError:
            print("DENIED")
        """
    )
    assert probe.stdout.strip() == "DENIED", (
        f"user nobody can read the store: {probe.stdout.strip()} "
        f"(home {oct(daemon.home.stat().st_mode)}, store {oct(store.stat().st_mode)})"
    )


@pytest.mark.parametrize(
    ("endpoint", "allowed"),
    [
        ("tcp://127.0.0.1:7777", True),
        ("tcp://127.8.9.10:7777", True),
        ("tcp://[::1]:7777", True),
        ("tcp://localhost:7777", True),
        ("tcp://0.0.0.0:7777", False),
        ("tcp://*:7777", False),
        ("tcp://192.0.2.1:7777", False),
        ("tcp://[::]:7777", False),
        ("tcp://eth0:7777", False),
        ("ipc:///tmp/x.sock", True),
    ],
)
def test_tcp_listen_is_loopback_only_unless_remote_is_allowed(endpoint: str, allowed: bool) -> None:
    if allowed:
        check_listen(endpoint, allow_remote=False)
    else:
        with pytest.raises(ConfigError, match="not a loopback address"):
            check_listen(endpoint, allow_remote=False)
    check_listen(endpoint, allow_remote=True)  # explicitly asked for: accepted


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_refuses_a_non_loopback_listen_and_serves_loopback_tcp(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is not on this machine: the refusal must come before any bind.
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "agenthost.cli",
            "--home",
            str(tmp_path / "h1"),
            "serve",
            "--listen",
            "tcp://192.0.2.1:7777",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "not a loopback address" in refused.stderr, refused
    port = _free_port()
    d = DaemonProcess(tmp_path / "h2", args=("--listen", f"tcp://127.0.0.1:{port}")).start()
    try:
        # TCP needs the CURVE keys of the connection file (tests/reliability/test_curve.py).
        conn = load_connection(d.home / "run" / "connection.json")
        assert conn.api == f"tcp://127.0.0.1:{port}"
        with Client(conn.api, timeout=30, curve=conn.curve) as c:
            assert c.call("host.status")["protocol"] == 1
        listeners = Path("/proc/net/tcp").read_text()
        assert f"0100007F:{port:04X}" in listeners  # bound to 127.0.0.1 only
        assert f"00000000:{port:04X}" not in listeners
    finally:
        d.stop()


def test_config_file_listen_is_loopback_only_too(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text('[daemon]\nlisten = "tcp://192.0.2.1:7777"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), "serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A refusal exits at once; the slack is for a loaded machine.
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"serve neither refused nor exited: {err[-500:]}")
    assert proc.returncode != 0
    assert "not a loopback address" in err, err[-2000:]


def test_no_method_reaches_another_workspaces_objects(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        a, b = "ws-owner", "ws-intruder"
        sid = create_session(c, ws=a, title="mine")["agentSessionId"]
        turn = run_turn(c, sid, "one", ws=a)
        op = c.call("fork.create", fork_params(sid, turn["turnId"], ws=a))["operation"]
        wait_for(
            lambda: (
                c.call("fork.get", {"workspaceId": a, "operationId": op["operationId"]})[
                    "operation"
                ]["status"]
                != "accepted"
            )
        )
        s = {"workspaceId": b, "agentSessionId": sid}
        session_calls = [
            ("session.get", s),
            ("session.timeline", s),
            ("session.updateSettings", s | {"settings": {"x": 1}}),
            ("session.updateTitle", s | {"title": "stolen"}),
            ("session.pin", s | {"pinned": True}),
            ("session.delete", s),
            ("turn.submit", s | {"requestId": "r", "input": [{"type": "text", "text": "x"}]}),
            ("turn.interrupt", s | {"turnId": turn["turnId"]}),
            (
                "interaction.respond",
                s | {"turnId": turn["turnId"], "requestId": "q", "response": {"text": "a"}},
            ),
            ("goal.set", s | {"goal": "g"}),
            ("goal.clear", s),
            ("fork.create", fork_params(sid, turn["turnId"], ws=b)),
        ]
        for method, params in session_calls:
            status, body = c.call_raw(method, params)
            assert (status, body.get("reason")) == (404, "workspace_agent_session_not_found"), (
                method,
                body,
            )
        for method in ("fork.get", "fork.acknowledge"):
            status, body = c.call_raw(method, {"workspaceId": b, "operationId": op["operationId"]})
            assert (status, body.get("reason")) == (
                404,
                "agent_session_fork_operation_not_found",
            ), (method, body)
        assert c.call("session.list", {"workspaceId": b})["sessions"] == []
        # The owner's data is untouched, and the owner still works on it.
        mine = c.call("session.get", {"workspaceId": a, "agentSessionId": sid})["session"]
        assert (mine["title"], mine["pinned"], mine["settings"]) == ("mine", False, {})
        assert len(timeline(c, sid, ws=a)) == 1
        got = c.call("fork.get", {"workspaceId": a, "operationId": op["operationId"]})
        assert got["operation"]["status"] == "committed"
        c.call("fork.acknowledge", {"workspaceId": a, "operationId": op["operationId"]})
        assert str(uuid.UUID(sid)) == sid
    finally:
        d.stop()
