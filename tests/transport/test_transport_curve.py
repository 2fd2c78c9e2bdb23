"""The ApiServer's CURVE option on real sockets: one ROUTER and one PUB serve ipc with the NULL
mechanism and tcp with CURVE behind pyzmq's ZAP handler; `close()` stops the handler (the
context terminates instead of hanging)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from protocol.envelope import Request
from transport.client import Client, ClientTimeout, EventSubscriber
from transport.security import ClientCurve, InsecureEndpoint, ServerCurve, bind_order
from transport.server import ApiServer, Responder

pytestmark = pytest.mark.timeout(60)


def echo(request: Request, responder: Responder) -> None:
    responder.result(200, {"method": request.method})


def test_bind_order_puts_null_endpoints_first() -> None:
    eps = ["tcp://127.0.0.1:0", "ipc:///x", "tcp://[::1]:0", "ipc:///y"]
    assert [eps[i] for i in bind_order(eps)] == [
        "ipc:///x",
        "ipc:///y",
        "tcp://127.0.0.1:0",
        "tcp://[::1]:0",
    ]


def test_tcp_is_curve_and_ipc_is_unchanged_on_one_socket(short_tmp: str) -> None:
    server_public, server_secret = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    allowed = {public}
    calls: list[bytes] = []

    def authorize(key: bytes) -> bool:
        calls.append(key)
        return key in allowed

    server = ApiServer(
        ["tcp://127.0.0.1:0", f"ipc://{short_tmp}/run/api.sock"],
        f"ipc://{short_tmp}/run/events.sock",
        echo,
        events_listen=["tcp://127.0.0.1:0"],
        curve=ServerCurve(server_secret, authorize),
    )
    server.start()
    try:
        tcp, ipc = server.endpoints  # the order given, whatever the bind order
        assert tcp.startswith("tcp://127.0.0.1:") and ipc.startswith("ipc://")
        assert Path(ipc.removeprefix("ipc://")).exists()
        good = ClientCurve(server_public, public, secret)
        with Client(ipc, timeout=5) as c:
            assert c.call("a") == {"method": "a"}  # NULL, and no ZAP round for it
        assert calls == []
        with Client(tcp, timeout=5, curve=good) as c:
            assert c.call("b") == {"method": "b"}
        with Client(ipc, timeout=5, curve=good) as c:  # keys are ignored on ipc
            assert c.call("b2") == {"method": "b2"}
        assert calls == [public]
        for curve in (None, ClientCurve(server_public, *zmq.curve_keypair())):
            with Client(tcp, timeout=1, curve=curve) as c, pytest.raises(ClientTimeout):
                c.call("c")
        # Events: the same rule on the PUB socket.
        events_tcp = server.events_endpoints[1]
        subs: list[Any] = [
            EventSubscriber(events_tcp, curve=good),
            EventSubscriber(events_tcp),
        ]
        try:
            deadline = time.monotonic() + 20
            got = None
            while got is None and time.monotonic() < deadline:
                server.publish("ws", {"type": "session.removed", "agentSessionId": "tick"})
                got = subs[0].next(0.1)
            assert got == {"type": "session.removed", "agentSessionId": "tick"}
            assert subs[1].next(1.0) is None
        finally:
            for sub in subs:
                sub.close()
    finally:
        closer = threading.Thread(target=server.close)
        closer.start()
        closer.join(20)
        assert not closer.is_alive(), "close() hung: the ZAP handler kept the context alive"


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:0", "tcp://*:0", "tcp://[::]:0"])
def test_a_non_loopback_endpoint_is_refused_without_curve(short_tmp: str, endpoint: str) -> None:
    server = ApiServer([endpoint], f"ipc://{short_tmp}/run/events.sock", echo)
    with pytest.raises(InsecureEndpoint, match="needs CURVE"):
        server.start()
    server.close()
    assert not Path(f"{short_tmp}/run/events.sock").exists()
    # Loopback without keys stays possible for in-process tests of the transport itself.
    local = ApiServer(["tcp://127.0.0.1:0"], f"ipc://{short_tmp}/run/events.sock", echo)
    local.start()
    local.close()
