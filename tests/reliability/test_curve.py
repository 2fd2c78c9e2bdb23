"""TCP is authenticated and encrypted with ZeroMQ CURVE, through the real
`agenthost serve`: the first start makes the keys and `run/connection.json` (0600); a client
with an authorized key is served over TCP (API and events; the CLI, the Engine), while a client
with no key, an unknown key, a revoked key or the wrong server key gets nothing at all, and the
daemon keeps serving the others; the ipc sockets are unchanged."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.auth

from agenthost.keys import Connection, load_connection
from client.engine.lifecycle import Engine
from tests.support.daemon import DaemonProcess, create_session, wait_for
from transport.client import Client, ClientTimeout, EventSubscriber
from transport.security import ClientCurve

pytestmark = pytest.mark.timeout(120)

WS = "ws-curve"
NO_REPLY_S = 1.0  # how long a refused client waits before we call it "nothing came back"


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    api, events = _free_port(), _free_port()
    d = DaemonProcess(
        tmp_path_factory.mktemp("curve") / "home",
        args=(
            "--listen",
            f"tcp://127.0.0.1:{api}",
            "--events-listen",
            f"tcp://127.0.0.1:{events}",
        ),
    ).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def conn(daemon: DaemonProcess) -> Connection:
    return load_connection(daemon.home / "run" / "connection.json")


SERVED_WITHIN_S = 20.0  # an authorized client's handshake + reply, even on a loaded CI machine


def _answered(endpoint: str, curve: ClientCurve | None, timeout: float) -> bool:
    with Client(endpoint, timeout=timeout, curve=curve) as c:
        try:
            return bool(c.call("host.status")["protocol"] == 1)
        except ClientTimeout:
            return False


def served(endpoint: str, curve: ClientCurve | None) -> bool:
    """True when `host.status` over `endpoint` is answered (waiting long enough for a loaded
    machine: a slow answer is still an answer)."""
    return _answered(endpoint, curve, SERVED_WITHIN_S)


def refused(endpoint: str, curve: ClientCurve | None) -> bool:
    """True when nothing at all comes back within NO_REPLY_S."""
    return not _answered(endpoint, curve, NO_REPLY_S)


def fresh_pair(server_public_key: bytes) -> ClientCurve:
    public, secret = zmq.curve_keypair()
    return ClientCurve(server_public_key, public, secret)


def test_first_start_makes_keys_and_a_connection_file_all_0600(
    daemon: DaemonProcess, conn: Connection
) -> None:
    run = daemon.home / "run"
    keys = run / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "authorized").stat().st_mode) == 0o700
    files = [p for p in keys.rglob("*") if p.is_file()]
    names = {str(p.relative_to(keys)) for p in files}
    assert names >= {
        "server.key",
        "server.key_secret",
        "client.key",
        "client.key_secret",
        "authorized/default.key",
    }, names
    for path in [*files, run / "connection.json"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path, oct(path.stat().st_mode))
    data = json.loads((run / "connection.json").read_text())
    assert set(data) == {
        "transport",
        "api",
        "events",
        "eventsExact",  # null here: no --events-exact-listen
        "serverPublicKey",
        "clientPublicKey",
        "clientSecretKey",
    }
    assert data["transport"] == "tcp"
    assert data["eventsExact"] is None
    tcp_api = [e for e in daemon.ready["endpoints"] if e.startswith("tcp://")]
    tcp_events = [e for e in daemon.ready["eventsEndpoints"] if e.startswith("tcp://")]
    assert (data["api"], data["events"]) == (tcp_api[0], tcp_events[0])
    assert data["api"].startswith("tcp://127.0.0.1:")
    # The authorized key is the connection file's client key; the secret is nowhere else.
    assert data["clientPublicKey"] in (keys / "authorized" / "default.key").read_text()
    assert data["clientSecretKey"] not in (keys / "authorized" / "default.key").read_text()
    assert conn.api == data["api"]


def test_an_authorized_client_is_served_and_nobody_else_gets_anything(
    daemon: DaemonProcess, conn: Connection
) -> None:
    assert served(conn.api, conn.curve)
    server_key = conn.curve.server_public_key
    strangers = {
        "no key (NULL mechanism)": None,
        "an unknown key": fresh_pair(server_key),
        "the wrong server key": ClientCurve(
            zmq.curve_keypair()[0], conn.curve.public_key, conn.curve.secret_key
        ),
    }
    for what, curve in strangers.items():
        assert refused(conn.api, curve), f"a client with {what} was served over TCP"
        # The daemon keeps serving the authorized client and the ipc socket after each.
        assert served(conn.api, conn.curve), what
        assert served(daemon.api, None), what
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_raw_frames_without_curve_are_dropped_not_answered(
    daemon: DaemonProcess, conn: Connection
) -> None:
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(conn.api)
        body = {"v": 1, "id": "x1", "method": "session.list", "params": {"workspaceId": WS}}
        for frame in (msgpack.packb(body), b"\xff garbage", b""):
            dealer.send(frame)
        assert dealer.poll(int(NO_REPLY_S * 1000)) == 0  # no reply, not even an error reply
    finally:
        dealer.close()
        ctx.term()
    # A plain TCP peer sending junk instead of a ZMTP greeting is dropped too.
    host, port = conn.api.removeprefix("tcp://").rsplit(":", 1)
    with contextlib.closing(socket.create_connection((host, int(port)), timeout=5)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
    assert served(conn.api, conn.curve)


def test_keys_add_serves_a_new_client_and_revoke_refuses_it(
    daemon: DaemonProcess, conn: Connection, tmp_path: Path
) -> None:
    added = cli(daemon.home, "keys", "add", "laptop")
    assert added.returncode == 0, added.stderr
    laptop = json.loads(added.stdout)
    assert laptop["api"] == conn.api and laptop["events"] == conn.events
    assert laptop["serverPublicKey"] == conn.curve.server_public_key.decode()
    assert laptop["clientPublicKey"] != conn.curve.public_key.decode()
    key_file = daemon.home / "run" / "keys" / "authorized" / "laptop.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert laptop["clientSecretKey"] not in "".join(
        p.read_text() for p in (daemon.home / "run").rglob("*") if p.is_file() and "key" in p.name
    )  # the new secret leaves only in the printed file
    out = tmp_path / "laptop.json"
    out.write_text(added.stdout)
    out.chmod(0o600)  # a redirect under umask 022 makes it 0644, which clients refuse
    laptop_conn = load_connection(out)
    assert served(laptop_conn.api, laptop_conn.curve)  # no restart needed
    assert cli(daemon.home, "keys", "add", "laptop").returncode == 1  # name taken
    assert cli(daemon.home, "keys", "add", "../evil").returncode == 1  # not a path
    listed = cli(daemon.home, "keys", "list", "--json")
    assert json.loads(listed.stdout)["keys"] == ["default", "laptop"]

    # -o writes the file 0600.
    written = tmp_path / "phone.json"
    assert cli(daemon.home, "keys", "add", "phone", "-o", str(written)).returncode == 0
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert served(load_connection(written).api, load_connection(written).curve)

    revoked = cli(daemon.home, "keys", "revoke", "laptop")
    assert revoked.returncode == 0, revoked.stderr
    assert not key_file.exists()
    assert refused(laptop_conn.api, laptop_conn.curve)  # a new connection is refused
    assert served(conn.api, conn.curve)  # the others are still served
    assert cli(daemon.home, "keys", "revoke", "laptop").returncode == 1  # already gone
    assert cli(daemon.home, "keys", "revoke", "phone").returncode == 0


def test_events_over_tcp_need_curve_too(daemon: DaemonProcess, conn: Connection) -> None:
    assert conn.events is not None
    ws = "ws-curve-events"
    good = EventSubscriber(conn.events, (ws,), curve=conn.curve)
    strangers = [
        EventSubscriber(conn.events, (ws,)),
        EventSubscriber(conn.events, (ws,), curve=fresh_pair(conn.curve.server_public_key)),
    ]
    try:
        with Client(daemon.api, timeout=30) as c:
            seen: list[dict[str, Any]] = []

            def got_one() -> bool:
                # Keep publishing until the (slow-joining) authorized subscriber hears one.
                create_session(c, ws=ws, title="ping")
                event = good.next(0.2)
                if event is not None:
                    seen.append(event)
                return bool(seen)

            wait_for(got_one, timeout=30)
            create_session(c, ws=ws, title="after")
            assert wait_for(lambda: good.next(0.2) is not None, timeout=30)
        for stranger in strangers:
            assert stranger.next(NO_REPLY_S) is None  # not one of the events above
    finally:
        good.close()
        for stranger in strangers:
            stranger.close()


def test_cli_and_engine_over_tcp_with_the_connection_file(
    daemon: DaemonProcess, conn: Connection, tmp_path: Path
) -> None:
    path = str(daemon.home / "run" / "connection.json")
    # Another home: the CLI cannot be using the daemon's ipc socket by accident.
    elsewhere = tmp_path / "elsewhere"
    status = cli(elsewhere, "--connection", path, "--json", "status")
    assert status.returncode == 0, status.stderr
    assert Path(json.loads(status.stdout)["home"]) == daemon.home.resolve()
    made = cli(elsewhere, "--workspace", WS, "--json", "new", env={"AGENTHOST_CONNECTION": path})
    assert made.returncode == 0, made.stderr
    sid = json.loads(made.stdout)["session"]["agentSessionId"]
    said = cli(elsewhere, "--connection", path, "--workspace", WS, "say", sid, "hello")
    assert said.returncode == 0, said.stderr
    assert "assistant:" in said.stdout
    turns = cli(elsewhere, "--connection", path, "--workspace", WS, "--json", "show", sid)
    assert turns.returncode == 0, turns.stderr
    forked = cli(
        elsewhere, "--connection", path, "--workspace", WS, "--json", "fork", sid, "--through", "1"
    )
    assert forked.returncode == 0, forked.stderr

    # Without the keys the same TCP endpoint gives nothing: unreachable, with a hint.
    bare = cli(elsewhere, "--connect", conn.api, "--timeout", str(NO_REPLY_S), "status")
    assert bare.returncode == 3 and "--connection" in bare.stderr, bare.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"api": "tcp://127.0.0.1:1", "serverPublicKey": "short"}')
    bad.chmod(0o600)
    broken = cli(elsewhere, "--connection", str(bad), "status")
    assert broken.returncode == 2 and "serverPublicKey" in broken.stderr, broken.stderr

    # The Engine (and so the GUI, which runs on Engine.connect) over TCP, events included.
    engine = Engine.connect(conn.api, conn.events, WS, curve=conn.curve, timeout=30)
    try:
        assert sid in {s["agentSessionId"] for s in engine.load_sessions()}
        with Client(daemon.api, timeout=30) as c:
            made_now: list[str] = []

            def heard() -> bool:
                # Sessions made over ipc reach the Engine only through its TCP event pump.
                made_now.append(create_session(c, ws=WS, title="evt")["agentSessionId"])
                return engine.wait_for(
                    lambda: any(engine.session(x) is not None for x in made_now), 0.3
                )

            wait_for(heard, timeout=30)
    finally:
        engine.close()


def test_allow_remote_binds_a_wildcard_only_behind_curve(tmp_path: Path) -> None:
    port = _free_port()
    d = DaemonProcess(
        tmp_path / "home", args=("--allow-remote", "--listen", f"tcp://0.0.0.0:{port}")
    ).start()
    try:
        listeners = Path("/proc/net/tcp").read_text()
        assert f"00000000:{port:04X}" in listeners  # really open to other hosts
        conn = load_connection(d.home / "run" / "connection.json")
        assert conn.api == f"tcp://127.0.0.1:{port}" and conn.events is None
        assert refused(f"tcp://127.0.0.1:{port}", None)
        assert refused(conn.api, fresh_pair(conn.curve.server_public_key))
        assert served(conn.api, conn.curve)
    finally:
        d.stop()


def test_keys_survive_a_restart_and_a_revoked_default_stays_revoked(tmp_path: Path) -> None:
    port, events_port = _free_port(), _free_port()
    args = ("--listen", f"tcp://127.0.0.1:{port}")
    home = tmp_path / "home"
    home.mkdir()
    # The events TCP endpoint from agenthost.toml this time.
    (home / "agenthost.toml").write_text(
        f'[daemon]\nevents_listen = "tcp://127.0.0.1:{events_port}"\n'
    )
    d = DaemonProcess(home, args=args).start()
    try:
        first = load_connection(d.home / "run" / "connection.json")
        assert first.events == f"tcp://127.0.0.1:{events_port}"
    finally:
        d.stop()
    assert cli(d.home, "keys", "revoke", "default").returncode == 0
    d = DaemonProcess(tmp_path / "home", args=args).start()
    try:
        again = load_connection(d.home / "run" / "connection.json")
        assert again.curve == first.curve  # the same server and client keys
        assert refused(again.api, again.curve)  # still revoked after the restart
        assert served(d.api, None)  # ipc unchanged
    finally:
        d.stop()


def test_a_non_loopback_events_listen_needs_allow_remote(tmp_path: Path) -> None:
    out = cli(tmp_path / "h", "serve", "--events-listen", "tcp://192.0.2.1:7778")
    assert out.returncode == 2 and "not a loopback address" in out.stderr, out
    home = tmp_path / "h2"
    home.mkdir()
    (home / "agenthost.toml").write_text('[daemon]\nevents_listen = ["tcp://192.0.2.1:7778"]\n')
    out = cli(home, "serve")
    assert out.returncode == 2 and "[daemon] events_listen" in out.stderr, out


def test_the_gui_runs_over_tcp_with_the_connection_file(
    daemon: DaemonProcess, conn: Connection
) -> None:
    import asyncio

    from client.gui.app import AgentHostApp

    ws = "ws-curve-gui"
    with Client(daemon.api, timeout=30) as c:
        sid = create_session(c, ws=ws, title="over tcp")["agentSessionId"]

    async def main() -> None:
        # What `agenthost --connection FILE gui` builds (run_gui -> Engine.connect).
        engine = Engine.connect(conn.api, conn.events, ws, curve=conn.curve)
        app = AgentHostApp(engine, own_engine=True)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(400):
                if app.sessions_loaded and engine.session(sid) is not None:
                    break
                await pilot.pause(0.05)
            assert app.sessions_loaded and engine.session(sid) is not None

    asyncio.run(main())


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o604])
def test_a_connection_file_others_can_read_is_refused_with_the_fix_in_words(
    daemon: DaemonProcess, conn: Connection, tmp_path: Path, mode: int
) -> None:
    """It holds the client's secret key: like ssh with a private key, a client refuses a file
    that others may read, and says what to do; after `chmod 600` the same file is served."""
    path = tmp_path / "shared.json"
    path.write_text((daemon.home / "run" / "connection.json").read_text())
    path.chmod(mode)
    with pytest.raises(ValueError) as refused:
        load_connection(path)
    words = str(refused.value)
    assert f"permissions {mode:04o} are too open" in words
    assert "secret key" in words and f"chmod 600 {path}" in words
    done = cli(daemon.home, "--connection", str(path), "status")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "bad_connection_file" in done.stderr and f"chmod 600 {path}" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli(daemon.home, "status", env={"AGENTHOST_CONNECTION": str(path)})
    assert done.returncode == 2 and "too open" in done.stderr

    path.chmod(0o600)
    assert served(load_connection(path).api, load_connection(path).curve)
    assert cli(daemon.home, "--connection", str(path), "status").returncode == 0


@pytest.mark.parametrize("name", ["server", "client"])
def test_a_key_pair_missing_its_public_half_is_repaired_at_start_not_a_failed_start(
    tmp_path: Path, name: str
) -> None:
    """A removal of `run/` racing the live daemon putting its keys back can leave a pair's secret
    file without its public file: the next start writes the public half again from the secret
    (the same key, which clients and the connection file know) and serves."""
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    keys = home / "run" / "keys"
    before = (keys / f"{name}.key").read_text()
    d.stop()
    (keys / f"{name}.key").unlink()
    again = DaemonProcess(home).start()
    try:
        assert again.client().call("host.status", {})["protocol"] == 1
        assert zmq.auth.load_certificate(keys / f"{name}.key")[0] == _public_key_in(before)
        assert stat.S_IMODE((keys / f"{name}.key").stat().st_mode) == 0o600
    finally:
        again.stop()


def _public_key_in(text: str) -> bytes:
    """The public key a zmq.auth certificate's text names."""
    (line,) = [x for x in text.splitlines() if x.strip().startswith("public-key")]
    return line.split("=", 1)[1].strip().strip('"').encode()
