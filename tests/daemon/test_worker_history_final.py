"""The worker calls a Session's provider history *final* only when it never received a
`turn.start` of that Session: an in-process daemon (real store file, real tutti-agent worker
and app-servers) asks its worker for two Sessions' histories with their homes — one whose Turn
this worker started (its start may still be anywhere in this worker: not final), one whose
runtime it only prepared (`session.start`, no Turn: final) — and without a home (never
final)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.context import runtime_key
from agenthost.daemon import Daemon
from domain.worker_messages import HistoryRequest, SessionHistory, SessionStart
from tests.support.daemon import WS, create_session, run_turn
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _home(daemon: Daemon, sid: str) -> str:
    return str(daemon.ctx.runtime_home(WS, sid, "tutti-agent"))


def _history(daemon: Daemon, sid: str, home: str | None) -> SessionHistory:
    request = HistoryRequest(runtime_key(WS, sid), home=home)
    return daemon.ctx.workers.history("tutti-agent", request, 30.0).result(timeout=30)


def test_a_history_is_final_only_for_a_session_whose_start_the_worker_never_got(
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

    mine = _history(daemon, started, _home(daemon, started))
    assert len(mine.turns) == 1 and not mine.final, mine
    fresh = _history(daemon, prepared, home)
    assert fresh.turns == () and fresh.final, fresh
    # No home named: the worker cannot look for the home's processes.
    assert not _history(daemon, prepared, None).final
