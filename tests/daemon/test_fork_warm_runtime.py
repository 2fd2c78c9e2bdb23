"""The fork fast path on the host: a fork of a Session whose runtime its last fork
attested — still live, at the same generation, at the same identity — sends no `session.start`
and makes no separate replay read before `prepare_fork`; the worker still refuses the fork if
that runtime is gone by the time the fork reaches it (`not_started`, so `failed`, no child),
and the next fork starts and re-attests the runtime. The Session row the fork starts from is
cached in the actor, and a mutation of the row is never answered from a stale cache.

An in-process daemon (real store, real worker and tutti-agent app-server); the worker port and
two store methods are wrapped to count what the daemon sent and read (the calls still go to
the real ones) — counts, never timings."""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agenthost.daemon import Daemon
from tests.daemon.test_fork_saga import until_terminal
from tests.daemon.test_hung_provider import _app_servers
from tests.support.daemon import (
    WS,
    create_session,
    fork_params,
    run_turn,
    status_of_last_fork,
    wait_for,
)
from tests.support.in_process import in_process_daemon
from tests.support.worker_requests import SentRequests
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, Client]]:
    monkeypatch.setenv("AGENTHOST_ENABLE_FAILPOINTS", "1")
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


class _Calls:
    """Counts calls of one store method, `part.method` (each still made)."""

    def __init__(self, daemon: Daemon, name: str) -> None:
        self.count = 0
        part_name, name = name.split(".")
        store = getattr(daemon.store, part_name)
        real: Callable[..., Any] = getattr(store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)

        setattr(store, name, call)


def _source(c: Client) -> tuple[str, str]:
    sid = create_session(c, title="warm")["agentSessionId"]
    return sid, run_turn(c, sid, "one")["turnId"]


def _create(c: Client, sid: str, turn_id: str, request_id: str | None = None) -> dict[str, Any]:
    return c.call(
        "fork.create",
        fork_params(WS, sid, turn_id, request_id=request_id),
    )


def _committed(c: Client, sid: str, turn_id: str) -> dict[str, Any]:
    op = until_terminal(c, _create(c, sid, turn_id)["operation"])
    assert op["status"] == "committed", op
    # ACKed, so the boundary's barrier does not answer the next fork with this operation.
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    return op


def test_a_warm_fork_sends_no_session_start_and_reads_no_replay_before_prepare(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    sid, turn_id = _source(c)
    sent = SentRequests(daemon)
    replay_reads = _Calls(daemon, "fork_prepare.existing_fork")
    _committed(c, sid, turn_id)  # the first fork attests the runtime: remembered
    first = sent.take()
    assert first["fork"] == 1, first
    for _ in range(3):
        _committed(c, sid, turn_id)
    warm = sent.take()
    # One request per fork: the fork itself (no session.start, no runtime.attest).
    assert warm == Counter({"fork": 3}), warm
    assert replay_reads.count <= 1  # only the first (cold) fork asked before preparing


def test_a_warm_forks_replay_still_answers_the_same_operation(
    running: tuple[Daemon, Client],
) -> None:
    """No replay read before `prepare_fork` on the warm path: `prepare_fork` itself answers a
    replayed `requestId` with the original operation, and a different fork under the same
    `requestId` with a typed conflict."""
    daemon, c = running
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)
    replay_reads = _Calls(daemon, "fork_prepare.existing_fork")
    request_id = str(uuid.uuid4())
    target = str(uuid.uuid4())
    params = {
        "workspaceId": WS,
        "agentSessionId": sid,
        "requestId": request_id,
        "targetAgentSessionId": target,
        "point": {"type": "throughTurn", "turnId": turn_id},
    }
    first = until_terminal(c, c.call("fork.create", params)["operation"])
    assert first["status"] == "committed", first
    again = c.call("fork.create", params)["operation"]
    assert again["operationId"] == first["operationId"], (first, again)
    assert again["status"] == "committed"
    status, error = c.call_raw("fork.create", {**params, "targetAgentSessionId": str(uuid.uuid4())})
    assert status == 409 and error["params"]["operationId"] == first["operationId"], error
    assert replay_reads.count == 0


def test_a_warm_fork_whose_runtime_is_replaced_is_refused_then_re_attested(
    running: tuple[Daemon, Client],
) -> None:
    """The warm fork relied on the generation its Session's last fork attested; the source's
    app-server dies after the host chose to reuse it (inside `host.fork.after_prepare`): the
    worker refuses the fork (`not_started` → `failed`, no child). The next fork starts the
    runtime again (`session.start`) and, the generation being new, re-attests it."""
    daemon, c = running
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)
    sent = SentRequests(daemon)
    c.call("debug.failpoints", {"points": {"host.fork.after_prepare": "once:sleep:1500"}})
    pending = c.submit(
        "fork.create",
        fork_params(WS, sid, turn_id),
    )
    wait_for(lambda: status_of_last_fork(daemon.config.store_path, sid) == "dispatching", 10)
    for pid in _app_servers(sid):
        os.kill(pid, signal.SIGKILL)
    status, body = pending.result(timeout=30)
    op = until_terminal(c, body["operation"])
    assert op["status"] == "failed", op
    assert "runtime changed since its attestation" in op["error"], op
    assert op["session"] is None
    refused = sent.take()
    assert refused == Counter({"fork": 1}), refused  # the warm path: no session.start
    _committed(c, sid, turn_id)
    again = sent.take()
    assert again["session.start"] == 1 and again["runtime.attest"] == 1, again
    assert again["fork"] == 1, again


def test_a_turn_between_forks_keeps_the_row_cache_and_moves_only_two_fields_of_the_row(
    running: tuple[Daemon, Client],
) -> None:
    """A Turn's writes (claim, binding, messages, settlement) move only the Session row's
    `active_turn_id` and `updated_at_ms` (and its `version`, which every change of the row
    moves: schema v18), which nothing reads from the actor's row cache; so a Turn leaves the
    cache in place and the next fork reads no Session row. Every other field of a fresh read
    after the Turn equals the row before it."""
    daemon, c = running
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)
    before = daemon.store.sessions.get_session(WS, sid)
    run_turn(c, sid, "between the forks")
    after = daemon.store.sessions.get_session(WS, sid)
    assert after.updated_at_ms >= before.updated_at_ms
    assert after.version > before.version
    assert after == replace(
        before,
        active_turn_id=after.active_turn_id,
        updated_at_ms=after.updated_at_ms,
        version=after.version,
    )
    row_reads = _Calls(daemon, "sessions.get_session")
    op = _committed(c, sid, turn_id)
    assert row_reads.count == 0
    child = c.call(
        "session.get", {"workspaceId": WS, "agentSessionId": op["targetAgentSessionId"]}
    )["session"]
    assert (child["cwd"], child["settings"]) == (after.cwd, dict(after.settings))


def test_a_settings_change_between_forks_is_not_answered_from_the_row_cache(
    running: tuple[Daemon, Client],
) -> None:
    """The fork's Session row is cached in its actor; `session.updateSettings` (a mutation
    through the same actor) empties it, so the next fork starts the runtime with the new
    settings and freezes them into its child. A stale row would reuse the old runtime and
    give the child the old settings."""
    daemon, c = running
    sid, turn_id = _source(c)
    _committed(c, sid, turn_id)
    _committed(c, sid, turn_id)  # warm: the row is cached now
    base = {"workspaceId": WS, "agentSessionId": sid}
    assert c.call("session.updateSettings", {**base, "settings": {"x": 2}})["session"]
    sent = SentRequests(daemon)
    op = _committed(c, sid, turn_id)
    assert sent.take()["session.start"] == 1
    child = c.call(
        "session.get", {"workspaceId": WS, "agentSessionId": op["targetAgentSessionId"]}
    )["session"]
    assert child["settings"] == {"x": 2}, child
