"""Terminated event topics, through the real daemon.

Beside the events socket whose topic frame is the bare workspace id (binding, unchanged), the
daemon binds `run/events-exact.sock` (and, when configured, a CURVE-only tcp endpoint) whose
topic frame is `workspaceId + "\\0"`: a ZeroMQ subscription to `team\\0` cannot prefix-match
`team-secret\\0`. These tests look at raw SUB sockets (no client filtering), then at the
clients that prefer the terminated endpoint when the daemon advertises it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from agenthost.cli import _parser
from agenthost.keys import Connection, load_connection
from client.cli.endpoints import events_source
from client.engine.lifecycle import Engine
from client.engine.values import ChangeKind, EngineChange
from tests.support.daemon import DaemonProcess, create_session, run_turn, wait_for
from transport.client import Client, EventSubscriber
from transport.security import ClientCurve

pytestmark = pytest.mark.timeout(120)

TEAM, SECRET, PING = "team", "team-secret", "ping"


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    api, events, exact = _free_port(), _free_port(), _free_port()
    d = DaemonProcess(
        tmp_path_factory.mktemp("exact") / "home",
        args=(
            "--listen",
            f"tcp://127.0.0.1:{api}",
            "--events-listen",
            f"tcp://127.0.0.1:{events}",
            "--events-exact-listen",
            f"tcp://127.0.0.1:{exact}",
        ),
    ).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def conn(daemon: DaemonProcess) -> Connection:
    return load_connection(daemon.home / "run" / "connection.json")


@pytest.fixture()
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


def _sub(ctx: zmq.Context[Any], endpoint: str, *topics: bytes) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    for topic in topics:
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.connect(endpoint)
    return sock


def _drain(sock: zmq.Socket[bytes], quiet: float = 0.5) -> list[list[bytes]]:
    """Every message until none arrives for `quiet` seconds."""
    got: list[list[bytes]] = []
    while sock.poll(int(quiet * 1000), zmq.POLLIN):
        got.append(sock.recv_multipart())
    return got


def _joined(c: Client, subs: list[zmq.Socket[bytes]], ws: str = PING) -> None:
    """Publish in `ws` until every SUB heard it (ZeroMQ's slow joiner), then drain them."""
    heard = [False] * len(subs)

    def all_heard() -> bool:
        create_session(c, ws=ws, title="ping")
        for i, sock in enumerate(subs):
            if sock.poll(200, zmq.POLLIN):
                heard[i] = True
        return all(heard)

    wait_for(all_heard, timeout=30)
    for sock in subs:
        _drain(sock)


def _twins(c: Client) -> str:
    sid = create_session(c, ws=TEAM)["agentSessionId"]
    create_session(c, ws=SECRET, agentSessionId=sid)
    return str(sid)


def test_ready_line_socket_file_and_connection_file_advertise_the_exact_endpoint(
    daemon: DaemonProcess, conn: Connection
) -> None:
    run = daemon.home / "run"
    assert daemon.ready["eventsExact"] == f"ipc://{run / 'events-exact.sock'}"
    assert daemon.ready["events"] == f"ipc://{run / 'events.sock'}"  # unchanged
    sock = run / "events-exact.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    tcp = [e for e in daemon.ready["eventsExactEndpoints"] if e.startswith("tcp://")]
    assert daemon.ready["eventsExactEndpoints"][0] == daemon.ready["eventsExact"]
    assert len(tcp) == 1 and tcp[0] not in daemon.ready["eventsEndpoints"]
    data = json.loads((run / "connection.json").read_text())
    assert data["eventsExact"] == tcp[0] and conn.events_exact == tcp[0]
    assert data["events"] == conn.events and conn.events != conn.events_exact


def test_a_raw_sub_of_team_nul_gets_team_and_never_team_secret(
    daemon: DaemonProcess, ctx: zmq.Context[Any]
) -> None:
    c = daemon.client()
    exact = _sub(ctx, daemon.events_exact, TEAM.encode() + b"\0", PING.encode() + b"\0")
    # Control: the bare-id socket, subscribed as an old client would, still prefix-matches.
    old = _sub(ctx, daemon.events, TEAM.encode(), PING.encode())
    _joined(c, [exact, old])
    sid = _twins(c)
    run_turn(c, sid, "secret", ws=SECRET)
    run_turn(c, sid, "mine", ws=TEAM)
    run_turn(c, sid, "secret again", ws=SECRET)
    heard = _drain(exact)
    topics = {frames[0] for frames in heard}
    assert topics == {b"team\0"}, topics  # at the socket: no client-side filtering
    turns = {
        msgpack.unpackb(frames[1])["turn"]["turnId"]
        for frames in heard
        if msgpack.unpackb(frames[1])["type"] == "turn.updated"
    }
    assert len(turns) == 1  # only `team`'s one Turn
    assert {frames[0] for frames in _drain(old)} == {b"team", b"team-secret"}


def test_an_all_subscriber_there_gets_each_event_once_and_the_old_socket_is_unchanged(
    daemon: DaemonProcess, ctx: zmq.Context[Any]
) -> None:
    c = daemon.client()
    exact = _sub(ctx, daemon.events_exact, b"")
    old = _sub(ctx, daemon.events, b"")
    _joined(c, [exact, old])
    sid = _twins(c)
    run_turn(c, sid, "/tool grep x", ws=SECRET)
    run_turn(c, sid, "mine", ws=TEAM)
    c.call("session.delete", {"workspaceId": SECRET, "agentSessionId": sid})
    on_exact, on_old = _drain(exact), _drain(old)
    assert on_old and all(len(frames) == 2 for frames in on_old)
    # The bare-topic socket: the bare workspace id, as PROTOCOL.md binds it (no NUL anywhere).
    assert {frames[0] for frames in on_old} == {b"team", b"team-secret"}
    # The new one: every one of those events once, in order, same bytes, topic + NUL.
    assert on_exact == [[frames[0] + b"\0", frames[1]] for frames in on_old]
    types = [msgpack.unpackb(frames[1])["type"] for frames in on_exact]
    assert {"session.upserted", "turn.updated", "session.removed"} <= set(types)


def test_event_subscriber_engine_and_cli_use_the_exact_endpoint(
    daemon: DaemonProcess, conn: Connection
) -> None:
    c = daemon.client()
    team = EventSubscriber(daemon.events_exact, (TEAM,), exact=True)
    everything = EventSubscriber(daemon.events_exact, ("",), exact=True)
    engine_events: list[dict[str, Any]] = []

    def spy(change: EngineChange) -> None:
        if change.kind is ChangeKind.EVENT and change.event is not None:
            engine_events.append(dict(change.event))

    engine = Engine.connect(daemon.api, daemon.events_exact, TEAM, events_exact=True)
    engine.subscribe(spy)
    try:
        made: list[str] = []

        def heard() -> bool:
            made.append(create_session(c, ws=TEAM, title="hello")["agentSessionId"])
            return team.next_message(0.3) is not None and engine.wait_for(
                lambda: any(engine.session(x) is not None for x in made), 0.3
            )

        wait_for(heard, timeout=30)
        while team.next_message(0.3) is not None:
            pass
        while everything.next_message(0.3) is not None:
            pass
        sid = _twins(c)
        run_turn(c, sid, "secret", ws=SECRET)
        mine = run_turn(c, sid, "mine", ws=TEAM)
        seen: list[tuple[str, dict[str, Any]]] = []
        while (got := team.next_message(1.0)) is not None:
            seen.append(got)
        assert seen and {topic for topic, _ in seen} == {TEAM}  # the NUL stripped
        every = set()
        while (got := everything.next_message(1.0)) is not None:
            every.add(got[0])
        assert every == {TEAM, SECRET}
        engine.wait_for(
            lambda: any(
                e.get("type") == "turn.updated"
                and e["turn"]["turnId"] == mine["turnId"]
                and e["turn"]["phase"] == "settled"
                for e in engine_events
            ),
            30,
        )
        sessions = [e["session"] for e in engine_events if e["type"] == "session.upserted"]
        assert sessions and all(s["workspaceId"] == TEAM for s in sessions)
        turns = {e["turn"]["turnId"] for e in engine_events if e["type"] == "turn.updated"}
        assert turns == {mine["turnId"]}
    finally:
        engine.close()
        team.close()
        everything.close()

    # The CLI (`say`, `fork`, `gui`) subscribes to what the daemon advertises.
    home = str(daemon.home)
    args = _parser().parse_args(["--home", home, "show", "x"])
    assert events_source(args) == (daemon.events_exact, True)
    path = str(daemon.home / "run" / "connection.json")
    args = _parser().parse_args(["--home", "/nonexistent", "--connection", path, "show", "x"])
    assert events_source(args) == (conn.events_exact, True)
    args = _parser().parse_args(["--home", home, "--events", daemon.events, "show", "x"])
    assert events_source(args) == (daemon.events, False)  # named: used as given


def fresh_pair(server_public_key: bytes) -> ClientCurve:
    public, secret = zmq.curve_keypair()
    return ClientCurve(server_public_key, public, secret)


def test_the_tcp_exact_endpoint_requires_curve(daemon: DaemonProcess, conn: Connection) -> None:
    assert conn.events_exact is not None and conn.events_exact.startswith("tcp://127.0.0.1:")
    good = EventSubscriber(conn.events_exact, (TEAM,), curve=conn.curve, exact=True)
    strangers = [
        EventSubscriber(conn.events_exact, ("",)),
        EventSubscriber(
            conn.events_exact, ("",), curve=fresh_pair(conn.curve.server_public_key), exact=True
        ),
    ]
    try:
        c = daemon.client()
        wait_for(
            lambda: create_session(c, ws=TEAM, title="ping") and good.next(0.2) is not None,
            timeout=30,
        )
        create_session(c, ws=TEAM, title="after")
        assert wait_for(lambda: good.next_message(0.2), timeout=30)[0] == TEAM
        for stranger in strangers:
            assert stranger.next(1.0) is None  # not one of the events above
    finally:
        good.close()
        for stranger in strangers:
            stranger.close()


def test_a_workspace_id_holding_nul_is_refused(daemon: DaemonProcess) -> None:
    c = daemon.client()
    for method, params in (
        ("session.create", {"provider": "tutti-agent"}),
        ("session.list", {}),
    ):
        status, error = c.call_raw(method, {"workspaceId": "team\0secret", **params})
        assert status == 400, (status, error)
        assert (error["code"], error["reason"]) == ("invalid_request", "invalid_argument")
        assert error["params"]["field"] == "workspaceId" and error["retryable"] is False
    assert c.call("host.status")["protocol"] == 1  # still serving


def test_a_home_too_long_for_the_exact_socket_still_starts() -> None:
    # events.sock fits (107 bytes) but events-exact.sock would not: the daemon still
    # starts, with no terminated endpoint advertised, and clients use events.sock.
    short = tempfile.mkdtemp(prefix="ah-x-")  # pytest's tmp_path may be too long already
    try:
        base = Path(short) / "h"
        room = 107 - len(str(base / "run" / "events.sock"))
        home = Path(str(base) + "x" * room)
        assert len(str(home / "run" / "events.sock")) == 107
        d = DaemonProcess(home).start()
        try:
            assert d.ready["eventsExact"] is None and d.ready["eventsExactEndpoints"] == []
            assert not (home / "run" / "events-exact.sock").exists()
            args = _parser().parse_args(["--home", str(home), "show", "x"])
            assert events_source(args) == (d.events, False)
        finally:
            d.stop()
    finally:
        shutil.rmtree(short, ignore_errors=True)
