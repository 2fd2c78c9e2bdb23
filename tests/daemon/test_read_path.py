"""The read path: `session.get` and `fork.get` of a settled operation are answered
on the transport thread from the daemon's read-only connection — no reader-pool thread, no
Session actor — and a read after an acknowledged write sees that write.

The daemon runs in this process (the real `Daemon`, its real sockets and store) so the test
can look at its threads and counters; the requests go through a real ZeroMQ client.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from agenthost.daemon import Daemon
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(60)

WS = "ws-read-path"


def _store_with_committed_fork(home: Path) -> tuple[str, str]:
    """A Session with one settled Turn and a fork operation left at `provider_accepted`:
    the daemon's start-up recovery commits it. Returns (source session id, operation id)."""
    store = Store.open(home / "store.sqlite3")
    try:
        sid = str(uuid.uuid4())
        store.sessions.create_session(
            WS,
            session_id=sid,
            provider="tutti-agent",
            title="source",
            cwd=str(home),
            settings={},
            provider_session_id="thread-1",
            runtime_context={"driverKind": "tutti-agent", "driverVersion": "0.1.0"},
        )
        turn, _ = store.turns.claim_submit(WS, sid, "req-1", "hello")
        store.turns.bind_provider_turn(WS, sid, turn.turn_id, "pturn-1")
        reply = store.history.append_message(WS, sid, turn.turn_id, kind="assistant", text="echo")
        store.turns.settle_turn(
            WS, sid, turn.turn_id, outcome="completed", final_assistant_message_id=reply.message_id
        )
        op, _ = store.fork_prepare.prepare_fork(
            WS,
            ForkPrepareRequest(
                source_session_id=sid,
                request_id="fork-1",
                target_session_id=str(uuid.uuid4()),
                turn_id=turn.turn_id,
                driver_kind="tutti-agent",
                driver_version="0.1.0",
                binding_mode="host_copy",
                runtime_identity={"cwd": str(home), "settings": {}, "runtime_context": {}},
            ),
        )
        store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
        store.fork_transitions.mark_fork_provider_accepted(
            WS,
            op.operation_id,
            ProviderForkEvidence(
                child_provider_session_id="child-1",
                provider_turn_ids=("pturn-1",),
                binding_mode="host_copy",
                receipt={"test": True},
            ),
        )
        return sid, op.operation_id
    finally:
        store.close()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client, str, str]]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    sid, op_id = _store_with_committed_fork(home)
    with in_process_daemon(home) as (daemon, client):
        yield daemon, client, sid, op_id


def _reader_pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("agenthost-read")]


def test_point_reads_need_no_reader_thread_and_no_actor(
    running: tuple[Daemon, Client, str, str],
) -> None:
    daemon, client, sid, op_id = running
    before = daemon.api.plumbing.inline_reads
    for _ in range(5):
        status, result = client.call_raw("session.get", {"workspaceId": WS, "agentSessionId": sid})
        assert status == 200 and result["session"]["agentSessionId"] == sid
        status, result = client.call_raw("fork.get", {"workspaceId": WS, "operationId": op_id})
        assert status == 200 and result["operation"]["status"] == "committed"
        assert result["operation"]["session"] is not None  # the child, projected
    # Typed errors of point reads are answered the same way.
    status, error = client.call_raw("fork.get", {"workspaceId": WS, "operationId": "nope"})
    assert status == 404, error
    status, error = client.call_raw(
        "session.get", {"workspaceId": WS, "agentSessionId": str(uuid.uuid4())}
    )
    assert status == 404, error
    assert daemon.api.plumbing.inline_reads - before == 10
    # No reader-pool thread was ever started, and no Session actor.
    assert _reader_pool_threads() == []
    actors: list[int] = []
    daemon.host.tell(_count(actors))
    assert _wait(lambda: actors) == [0]


def test_a_read_after_an_acknowledged_write_sees_it(
    running: tuple[Daemon, Client, str, str],
) -> None:
    _, client, sid, _ = running
    for i in range(30):
        status, _ = client.call_raw(
            "session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": f"t{i}"}
        )
        assert status == 200
        status, result = client.call_raw("session.get", {"workspaceId": WS, "agentSessionId": sid})
        assert status == 200 and result["session"]["title"] == f"t{i}"


def test_repeat_point_reads_come_from_the_reply_cache_and_never_outlive_a_commit(
    running: tuple[Daemon, Client, str, str],
) -> None:
    """A repeated `session.get` / `fork.get` is answered from the reply cache (the same
    reply, no SELECT); a commit by the daemon's writer, or by any other connection to the
    store, empties it, so the next read is the new committed state, never the kept one."""
    daemon, client, sid, op_id = running
    cache = daemon.api.plumbing.reply_cache
    get_session = {"workspaceId": WS, "agentSessionId": sid}
    get_fork = {"workspaceId": WS, "operationId": op_id}
    first = client.call_raw("session.get", get_session)
    fork_first = client.call_raw("fork.get", get_fork)
    hits = cache.hits
    assert client.call_raw("session.get", get_session) == first
    assert client.call_raw("fork.get", get_fork) == fork_first
    assert cache.hits == hits + 2
    # The daemon's own write: the next read is fresh.
    for i in range(5):
        status, _ = client.call_raw("session.updateTitle", {**get_session, "title": f"cached {i}"})
        assert status == 200
        hits = cache.hits
        status, result = client.call_raw("session.get", get_session)
        assert status == 200 and result["session"]["title"] == f"cached {i}"
        assert cache.hits == hits  # read, not served from before the write
        assert client.call_raw("session.get", get_session) == (status, result)
        assert cache.hits == hits + 1
    # Another connection's commit (another process would be the same): seen at once.
    other = apsw.Connection(str(daemon.store.path))
    try:
        other.execute("UPDATE sessions SET title = 'from outside' WHERE session_id = ?", (sid,))
    finally:
        other.close()
    status, result = client.call_raw("session.get", get_session)
    assert status == 200 and result["session"]["title"] == "from outside"
    # The operation's reply after its acknowledgement equals the store's own projection.
    status, acked = client.call_raw("fork.acknowledge", get_fork)
    assert status == 200
    assert client.call_raw("fork.get", get_fork) == (200, acked)
    # An error is never kept: a Session that appears later is found.
    missing = {"workspaceId": WS, "agentSessionId": str(uuid.uuid4())}
    assert client.call_raw("session.get", missing)[0] == 404


def _count(out: list[int]) -> object:
    from actors.host_actor import CountActors

    return CountActors(out.append)


def _wait(pred: object, timeout: float = 10.0) -> object:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")
