"""A listener a re-bind replaced (its socket file was removed) keeps the connections it accepted,
with their requests in flight, and is unbound once none is left (`Binder.rebind`,
`ConnectionGuard.replaced`, docs/design/connections.md "Listeners a re-bind replaces"). Real
ApiServer, real ipc sockets, in-test dispatcher."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from transport_harness import Running

from tests.support.daemon import wait_for
from tests.support.run_dir import listeners_in
from transport.client import Client
from transport.connections import REPLACED_GRACE_S
from transport.endpoints import ipc_path

pytestmark = pytest.mark.timeout(60)

MakeClient = Callable[..., Client]


def test_a_replaced_listener_serves_its_connection_then_is_closed(
    running: Running, client_for: MakeClient
) -> None:
    server = running.server
    path = ipc_path(running.ipc)
    assert path is not None
    run = os.path.dirname(path)
    before = listeners_in(os.getpid(), run)  # api.sock and events.sock
    old = client_for(running.ipc, timeout=10)
    assert old.call("echo", {"n": 0})["params"] == {"n": 0}
    in_flight = old.submit("hold", {})
    (held,) = running.dispatcher.wait_held(1)

    os.unlink(path)
    assert server.rebind_missing_ipc().result(timeout=10) == [running.ipc]
    assert os.path.exists(path) and os.stat(path).st_mode & 0o777 == 0o600
    assert [n for n in os.listdir(run) if n.startswith(".")] == []  # the spare name removed
    new = client_for(running.ipc, timeout=10)
    assert new.call("echo", {"n": 1})["params"] == {"n": 1}

    # The request made before the re-bind is answered on its connection, after it.
    held[1].result(200, {"late": True})
    assert in_flight.result(timeout=10).result() == {"late": True}
    time.sleep(REPLACED_GRACE_S + 0.5)  # past the grace: kept only because `old` is on it
    assert len(listeners_in(os.getpid(), run)) == len(before) + 1
    assert old.call("echo", {"n": 2})["params"] == {"n": 2}
    guard = server.connections
    assert guard is not None and guard.listeners_closed == 0 and guard.shed == 0

    old.close()  # the last connection on the replaced listener: it is unbound
    wait_for(lambda: guard.listeners_closed == 1, timeout=10)
    wait_for(lambda: len(listeners_in(os.getpid(), run)) == len(before), timeout=10)
    assert new.call("echo", {"n": 3})["params"] == {"n": 3}
    assert client_for(running.ipc, timeout=10).call("echo", {"n": 4})["params"] == {"n": 4}


def test_a_replaced_listener_without_connections_is_closed_and_its_name_reused(
    running: Running, client_for: MakeClient
) -> None:
    server = running.server
    path = ipc_path(running.ipc)
    assert path is not None
    run = os.path.dirname(path)
    first = {os.path.basename(a) for a in listeners_in(os.getpid(), run)}
    assert first == {"api.sock", "events.sock"}
    guard = server.connections
    assert guard is not None
    for i in range(1, 6):
        os.unlink(path)
        assert server.rebind_missing_ipc().result(timeout=10) == [running.ipc]
        with Client(running.ipc, timeout=10) as c:
            assert c.call("echo", {"n": i})["params"] == {"n": i}
        wait_for(lambda i=i: guard.listeners_closed == i, timeout=10)  # type: ignore[misc]
        # The endpoint's one listener, its file's, bound at a spare name the ones closed
        # before it free again: .api.1 and .api.2 in turn. The count is taken when the unbind
        # is asked; libzmq's I/O thread closes the descriptor just after.
        expected = {"events.sock", f".api.{2 - i % 2}"}

        def names() -> set[str]:
            return {os.path.basename(a) for a in listeners_in(os.getpid(), run)}

        wait_for(lambda e=expected: names() == e, timeout=10)  # type: ignore[misc]
        assert names() == expected, names()
    assert guard.shed == 0
