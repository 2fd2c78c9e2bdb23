"""The worker calls a Session's provider history *final* only when every `turn.start` of that
Session it received has ended (answered, and its provider turn over) — an in-process daemon
(real store file, real tutti-agent worker and app-servers) asks its worker for Sessions'
histories with their homes: one whose Turn this worker ran to its end (final), one whose runtime
it only prepared (`session.start`, no Turn: final), one whose start waits in a lane before the
driver and one whose Turn is answered but still runs at the provider (not final, until each has
ended) — and without a home (never final)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.context import runtime_key
from actors.ports import WorkerFailed
from agenthost.daemon import Daemon
from domain.worker_messages import HistoryRequest, SessionHistory, SessionStart, TurnStart
from tests.support.daemon import (
    WS,
    create_session,
    respond,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.git_repos import pending_request
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, Client]]:
    monkeypatch.setenv("AGENTHOST_ENABLE_FAILPOINTS", "1")  # `debug.failpoints` on
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _home(daemon: Daemon, sid: str) -> str:
    return str(daemon.ctx.runtime_home(WS, sid, "tutti-agent"))


def _history(daemon: Daemon, sid: str, home: str | None) -> SessionHistory:
    request = HistoryRequest(runtime_key(WS, sid), home=home)
    return daemon.ctx.workers.history("tutti-agent", request, 30.0).result(timeout=30)


def _turn_starts_here(daemon: Daemon) -> int:
    ping = daemon.ctx.workers.supervisor.request("tutti-agent", "worker.ping", {}, 10)
    return int(ping.result(20)["turnStartsHere"])


def test_a_history_is_final_once_the_starts_the_worker_got_have_ended(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    started = create_session(c, title="its Turn reached this worker")["agentSessionId"]
    assert run_turn(c, started, "one")["outcome"] == "completed"
    prepared = create_session(c, title="only prepared")["agentSessionId"]
    assert daemon.store is not None
    row = daemon.store.sessions.get_session(WS, prepared)
    home = _home(daemon, prepared)
    Path(home).mkdir(parents=True, exist_ok=True)
    start = SessionStart(
        agent_session_id=runtime_key(WS, prepared),
        home=home,
        cwd=row.cwd,
        settings=dict(row.settings),
        model=row.model,
        provider_session_id=row.provider_session_id,
        runtime_context=dict(row.runtime_context),
    )
    daemon.ctx.workers.start_session("tutti-agent", start, 30.0).result(timeout=30)

    # Its one start was answered and its provider turn completed: nothing of it can come.
    mine = _history(daemon, started, _home(daemon, started))
    assert len(mine.turns) == 1 and mine.final, mine
    fresh = _history(daemon, prepared, home)
    assert fresh.turns == () and fresh.final, fresh
    # No home named: the worker cannot look for the home's processes.
    assert not _history(daemon, prepared, None).final


def test_a_start_still_running_keeps_the_history_not_final(
    running: tuple[Daemon, Client], tmp_path: Path
) -> None:
    daemon, c = running
    sid = create_session(c, title="its starts are still running")["agentSessionId"]
    home = _home(daemon, sid)
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    assert _history(daemon, sid, home).final
    # A start held in a lane before the driver has it: not final.
    point = "worker.turn.before_start"
    c.call("debug.failpoints", {"points": {point: "once:hang"}})
    queued = submit(c, sid, "held before its start")["turnId"]
    fired = tmp_path / "home" / "run" / "workers" / "failpoints-state" / f"fired.{point}"
    wait_for(fired.exists, 30)
    held = _history(daemon, sid, home)
    assert len(held.turns) == 1 and not held.final, held
    c.call("debug.failpoints", {"points": {point: "off"}})
    assert settle(c, sid, queued)["outcome"] == "completed"
    assert _history(daemon, sid, home).final
    # A start answered (the Turn bound) whose provider turn still runs, waiting on an answer:
    # a warm start, started on the worker's link thread (`begin_turn`).
    here = _turn_starts_here(daemon)
    asking = submit(c, sid, "/ask go on?")["turnId"]
    request_id = pending_request(c, sid, asking)
    assert turn_of(c, sid, asking)["rootProviderTurnId"]
    assert _turn_starts_here(daemon) == here + 1
    running_turn = _history(daemon, sid, home)
    assert len(running_turn.turns) == 3 and not running_turn.final, running_turn
    # A start the driver refuses before its provider gets anything (the Session is busy) has
    # ended with its answer: it keeps nothing open once the running Turn ends.
    busy = TurnStart(runtime_key(WS, sid), str(uuid.uuid4()), "refused: a Turn runs", home=home)
    with pytest.raises(WorkerFailed) as refused:
        daemon.ctx.workers.start_turn("tutti-agent", busy, 30.0).result(timeout=30)
    assert refused.value.error["reason"] == "agent_session_busy", refused.value.error
    assert not _history(daemon, sid, home).final
    respond(c, sid, asking, request_id, {"text": "yes"})
    assert settle(c, sid, asking)["outcome"] == "completed"
    assert _history(daemon, sid, home).final
