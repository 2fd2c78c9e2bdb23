"""A host_copy provider whose binder is missing fails closed before any operation exists
(seed 000 §7), run on an in-process daemon with real sockets and real workers."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from actors.ports import DriverInfo
from agenthost.catalog import Catalog
from agenthost.config import Config
from agenthost.daemon import Daemon
from storage.store import Store
from tests.support.daemon import WS, create_session, fork_params, run_turn
from tests.support.homes import child_rollouts, runtime_home
from tests.support.store_reads import find_fork_operation_by_request, fork_operations_of
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)


def test_host_copy_provider_without_binder_is_unsupported_before_any_operation(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    no_binder = Catalog(
        {"tutti-agent": DriverInfo("tutti-agent", "host_copy", False, "tutti-agent-home")}
    )
    daemon = Daemon(Config(home=home), catalog=no_binder)
    daemon.start()
    client = Client(daemon.api_endpoint, timeout=30)
    try:
        sid = create_session(client)["agentSessionId"]
        turn = run_turn(client, sid, "one")
        rid = str(uuid.uuid4())
        with pytest.raises(ApiError) as err:
            client.call(
                "fork.create",
                fork_params(WS, sid, turn["turnId"], request_id=rid),
            )
        assert err.value.status == 409
        assert err.value.reason == "agent_session_fork_unsupported"
        assert daemon.store is not None
        assert find_fork_operation_by_request(daemon.store, WS, rid) is None
        assert fork_operations_of(daemon.store, WS, sid) == []
        assert child_rollouts(runtime_home(home, WS, sid)) == []
        # The source is not fenced: it keeps taking turns.
        assert run_turn(client, sid, "two")["outcome"] == "completed"
    finally:
        client.close()
        daemon.close()
    # Nothing durable either.
    store = Store.open(home / "store.sqlite3")
    try:
        assert fork_operations_of(store, WS, sid) == []
    finally:
        store.close()
