"""The fork fast path (the daemon side): a `fork.create` — like every request bound for a
Session actor — is routed from the transport thread after a point read of the Session on the
read-only connection, with no reader-pool hop in front of the actor; and a fork's operation
and Session changes do not wake the event publisher when nobody subscribed to the workspace.
An in-process daemon (real store, real worker and tutti-agent app-server), so the tests can
count what crossed the reader pool and how often the publisher woke — never a timing."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agenthost.daemon import Daemon
from tests.support.daemon import WS, create_session, fork_params, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


class _PoolCount:
    """Counts what is handed to the API's reader pool (still run there, unchanged)."""

    def __init__(self, daemon: Daemon) -> None:
        assert daemon.api is not None
        self.pool = daemon.api.plumbing._pool
        self.submitted = 0
        self._lock = threading.Lock()
        self._real: Callable[..., Any] = self.pool.submit

        def submit(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.submitted += 1
            return self._real(fn, *args, **kwargs)

        self.pool.submit = submit  # type: ignore[method-assign]


def _source(c: Client) -> tuple[str, str]:
    sid = create_session(c, title="fast")["agentSessionId"]
    return sid, run_turn(c, sid, "one")["turnId"]


def fork(c: Client, sid: str, turn_id: str) -> tuple[int, dict[str, Any]]:
    """`fork.create` through `turn_id`, the raw (status, body) of the reply."""
    status, body = c.call_raw(
        "fork.create",
        fork_params(WS, sid, turn_id),
    )
    return status, dict(body)


def test_fork_create_and_turn_submit_reach_the_actor_without_the_reader_pool(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    sid, turn_id = _source(c)
    pool = _PoolCount(daemon)
    assert daemon.api is not None
    routed = daemon.api.plumbing.routed_now
    status, body = fork(c, sid, turn_id)
    assert status == 200 and body["operation"]["status"] == "committed", body
    # The reply came from the source's actor (a committed child), routed with no pool task.
    assert body["operation"]["session"] is not None
    assert pool.submitted == 0
    assert daemon.api.plumbing.routed_now == routed + 1
    child = body["operation"]["targetAgentSessionId"]
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": body["operation"]["operationId"]})
    before = pool.submitted
    # Any Session-bound mutation takes the same path (here a turn on the child).
    status, submitted = c.call_raw(
        "turn.submit",
        {
            "workspaceId": WS,
            "agentSessionId": child,
            "requestId": str(uuid.uuid4()),
            "input": [{"type": "text", "text": "two"}],
        },
    )
    assert status == 202 and submitted["turn"]["phase"] == "active", submitted
    assert pool.submitted == before
    assert daemon.api.plumbing.routed_now == routed + 2


def test_a_routed_request_for_a_missing_session_is_still_a_typed_404(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    missing = str(uuid.uuid4())
    status, error = c.call_raw(
        "turn.submit",
        {
            "workspaceId": WS,
            "agentSessionId": missing,
            "requestId": str(uuid.uuid4()),
            "input": [{"type": "text", "text": "x"}],
        },
    )
    assert status == 404 and error["reason"] == "workspace_agent_session_not_found", error
    # fork.create of a missing source may still be a replay (seed 000 §8): asked of the store
    # on the pool, and a 404 when there is none.
    status, error = fork(c, missing, str(uuid.uuid4()))
    assert status == 404 and error["reason"] == "workspace_agent_session_not_found", error
    sid = create_session(c, title="alive")["agentSessionId"]
    assert daemon.api is not None and daemon.api.plumbing.routed_now == 0
    status, _ = c.call_raw(
        "session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": "renamed"}
    )
    assert status == 200
    assert (
        c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]["title"]
        == "renamed"
    )


def test_a_fork_wakes_no_event_publisher_when_nobody_subscribed(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    publisher, server = daemon.publisher, daemon.server
    assert publisher is not None and server is not None and not server.wants(WS)
    sid, turn_id = _source(c)
    # The source's Turn changes went to the publisher thread (it must forget each Turn it
    # skips); wait until it has drained them.
    wait_for(lambda: publisher.queue.empty())
    time.sleep(0.2)
    batches, skipped = publisher.batches, publisher.skipped
    status, body = fork(c, sid, turn_id)
    assert status == 200 and body["operation"]["status"] == "committed", body
    # prepared, dispatching, provider_accepted and the commit's two changes (the operation's,
    # the child's; none of the source's, whose row no step writes): every one dropped before the
    # queue, none woke the thread.
    wait_for(lambda: publisher.skipped >= skipped + 5)
    time.sleep(0.2)
    assert publisher.batches == batches
    assert publisher.projected == 0


def test_a_warm_fork_asks_whether_it_attests_again_once(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm fork's prepare and its attest step run in one actor step: the saga's
    `attestation_key` (a JSON dump of the runtime's settings) is worked out once per fork, by
    the prepare, not again by `_attest` (twice before forkprof's cut)."""
    import actors.fork_saga as fork_saga

    _, c = running
    sid, turn_id = _source(c)
    for _ in range(2):  # the first attests; the next ones find that runtime warm
        status, body = fork(c, sid, turn_id)
        assert status == 200 and body["operation"]["status"] == "committed", body
        c.call(
            "fork.acknowledge",
            {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
        )
    keys: list[str] = []
    real = fork_saga.attestation_key

    def counting(runtime: Any, generation: str) -> tuple[str, ...]:
        keys.append(generation)
        return real(runtime, generation)

    monkeypatch.setattr(fork_saga, "attestation_key", counting)
    status, body = fork(c, sid, turn_id)
    assert status == 200 and body["operation"]["status"] == "committed", body
    assert len(keys) == 1


def test_a_warm_fork_s_structure_is_one_worker_request_and_two_actor_messages(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm fork's structure (forkhops' inventory, docs/performance.md): one request to the
    worker (`fork`: no `session.start`, no `runtime.attest`), two messages into an actor's
    inbox (the `fork.create` and the worker's answer brought back to the Session actor), its
    caller's budget timer armed and cancelled without waking the timer thread, and three
    transactions by the saga (the prepare, written at `dispatching`; the lazy
    `provider_accepted`; the commit) of which two are fsync'd COMMITs. A hop, round trip or
    transaction added to the warm path fails here."""
    import actors.pool as pool

    daemon, c = running
    sid, turn_id = _source(c)
    for _ in range(2):  # the first attests; the next ones find that runtime warm
        status, body = fork(c, sid, turn_id)
        assert status == 200 and body["operation"]["status"] == "committed", body
        c.call(
            "fork.acknowledge",
            {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
        )
    time.sleep(0.3)  # the second fork's own after-math (events, its ACK) is over
    requests: list[str] = []
    real_request = daemon.supervisor.request

    def request(provider: str, method: str, *args: Any, **kwargs: Any) -> Any:
        requests.append(method)
        return real_request(provider, method, *args, **kwargs)

    monkeypatch.setattr(daemon.supervisor, "request", request)
    puts: list[str] = []
    real_put = pool._PooledInbox.put

    def put(self: Any, envelope: Any, /) -> None:
        puts.append(type(envelope.message).__name__)
        real_put(self, envelope)

    monkeypatch.setattr(pool._PooledInbox, "put", put)
    timers = daemon.ctx.actor_pool.timers
    # Requests and inbox messages are the fork's own: every fork shows them. A timer wake or a
    # transaction may also come from the daemon's other timers and writers (a loaded CI run saw
    # one wake), so those are read on the quietest of up to three forks: a structural cost
    # (the budget timer waking the thread, a transaction added) shows on every one of them.
    seen: list[tuple[int, int, int]] = []
    for _ in range(3):
        requests.clear()
        puts.clear()
        wakes, stats = timers.wakes, daemon.store.db.write_stats.snapshot()
        status, body = fork(c, sid, turn_id)
        assert status == 200 and body["operation"]["status"] == "committed", body
        after = daemon.store.db.write_stats.snapshot()
        assert requests == ["fork"]
        assert puts == ["ForkCreate", "FollowUp"], puts
        seen.append(
            (
                timers.wakes - wakes,
                after["transactions"] - stats["transactions"],
                after["commits"] - stats["commits"],
            )
        )
        if seen[-1] == (0, 3, 2):
            break
        c.call(
            "fork.acknowledge",
            {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
        )
        time.sleep(0.3)
    assert seen[-1] == (0, 3, 2), seen


def test_a_fork_of_a_source_found_live_is_routed_without_reading_it_again(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fork.create` on a source the transport thread found live before is routed from its
    memory of live Sessions, no point read (one SQLite statement a fork before this cut); a
    replay on a source deleted while still remembered live (the delete's commit not yet seen
    by `_on_change`) is answered from durable state as before — the actor's 404 asks the
    fork's `gone` — and a fork of it that nothing durable answers is still a 404."""
    daemon, c = running
    assert daemon.api is not None
    api = daemon.api.plumbing
    checks: list[tuple[str, str]] = []
    real = api._view.session_exists

    def counted(ws: str, sid: str) -> bool:
        checks.append((ws, sid))
        return real(ws, sid)

    monkeypatch.setattr(api._view, "session_exists", counted)
    sid = create_session(c, title="remembered")["agentSessionId"]
    turn_id = run_turn(c, sid, "one")["turnId"]
    assert (WS, sid) in api.live_sessions  # the Turn's submit found it live
    before = len(checks)
    ops = []
    for _ in range(2):
        params = fork_params(WS, sid, turn_id)
        status, body = c.call_raw("fork.create", params)
        assert status == 200 and body["operation"]["status"] == "committed", body
        c.call(
            "fork.acknowledge",
            {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
        )
        ops.append((params, body["operation"]))
    assert len(checks) == before  # routed from memory: no read
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    api.live_sessions.add((WS, sid))  # as if `_on_change` had not run yet
    params, op = ops[-1]
    status, again = c.call_raw("fork.create", params)  # a replay: same requestId and target
    assert status == 200, again
    assert again["operation"]["operationId"] == op["operationId"]
    assert again["operation"]["status"] == "committed"
    assert len(checks) == before
    status, error = c.call_raw("fork.create", fork_params(WS, sid, turn_id))
    assert status == 404 and error["reason"] == "workspace_agent_session_not_found", error


def test_a_warm_fork_dumps_its_runtime_settings_once(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm fork asks `attestation_key` of its frozen runtime twice in one actor step (the
    Session's warm-runtime check, then the saga's `attests_again`): the runtime's settings are
    JSON-dumped once a fork, not twice (the thread's last key kept for that runtime object and
    generation); a fork on a runtime with other settings would still get its own key."""
    import types

    import actors.fork_saga as fork_saga

    _, c = running
    sid, turn_id = _source(c)
    for _ in range(2):  # the first attests; the next ones find that runtime warm
        status, body = fork(c, sid, turn_id)
        assert status == 200 and body["operation"]["status"] == "committed", body
        c.call(
            "fork.acknowledge",
            {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
        )
    dumps: list[Any] = []
    real = fork_saga.json.dumps

    def counting(value: Any, **kwargs: Any) -> str:
        dumps.append(value)
        return real(value, **kwargs)

    monkeypatch.setattr(fork_saga, "json", types.SimpleNamespace(dumps=counting))
    for n in (1, 2):
        status, body = fork(c, sid, turn_id)
        assert status == 200 and body["operation"]["status"] == "committed", body
        c.call(
            "fork.acknowledge",
            {"workspaceId": WS, "operationId": body["operation"]["operationId"]},
        )
        assert len(dumps) <= n, dumps  # the first may dump once (another runtime object)
    runtime = fork_saga.PreparedRuntime("p", "/h", "/c", {"a": 1}, "ps", {})
    other = fork_saga.PreparedRuntime("p", "/h", "/c", {"a": 2}, "ps", {})
    assert fork_saga.attestation_key(runtime, "g") != fork_saga.attestation_key(other, "g")
    assert fork_saga.attestation_key(runtime, "g") != fork_saga.attestation_key(runtime, "h")
