"""`session.history` of a Tutti Agent thread whose turns, read whole, are one app-server line
past the line bound (`MAX_LINE_BYTES`, 64 MiB), through an in-process daemon (real store file,
real worker process, the real `tutti_agent` app-server): 70 Turns of 1 MiB prompts. Read with
one `thread/read`, the server wrote its answer as one line past the bound, the worker killed
it and the history failed typed (`provider_protocol_error`). It is now read in pages of
`thread/turns/list`, each well under the bound: every Turn, in order, each prompt whole; and
read once for all the link's pages (`session.history` pages of 8 Mi characters)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from actors.context import runtime_key
from domain.worker_messages import HistoryRequest, SessionStart
from drivers.app_server.process import MAX_LINE_BYTES
from tests.support.daemon import WS, create_session
from tests.support.in_process import in_process_daemon
from tests.tutti_agent.items import assistant_msg, task_complete, task_started, user_msg
from tests.tutti_agent.storeutil import write_root
from transport.client import Client
from tutti_agent.rollout import LineType, RolloutItem
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(300)

PROVIDER = "tutti-agent"
TURNS = 70
PROMPT_CHARS = 1 << 20


def _prompt(n: int) -> str:
    return f"{n:04d} " + "p" * (PROMPT_CHARS - 5)


def _turn(turn_id: str, text: str) -> list[RolloutItem]:
    """A Turn as the agent writes it: the model's input message, then the item it shows."""
    shown = {
        "type": "userMessage",
        "id": f"u-{turn_id}",
        "clientId": None,
        "content": [{"type": "text", "text": text, "text_elements": []}],
    }
    event = {"type": "item_completed", "turn_id": turn_id, "item": shown}
    return [
        task_started(turn_id),
        user_msg(text),
        RolloutItem(LineType.EVENT_MSG, event),
        assistant_msg(f"ok {turn_id}"),
        task_complete(turn_id),
    ]


def _worker(c: Client) -> psutil.Process:
    """The provider's worker process, as `host.status` names it."""
    workers = c.call("host.status")["workers"]
    return psutil.Process(next(w["pid"] for w in workers if w["provider"] == PROVIDER))


def test_a_history_past_the_app_server_line_bound_is_read_whole_in_pages(
    tmp_path: Path,
) -> None:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as (daemon, c):
        sid = create_session(c, provider=PROVIDER)["agentSessionId"]
        assert daemon.store is not None
        row = daemon.store.sessions.get_session(WS, sid)
        home = daemon.ctx.runtime_home(WS, sid, PROVIDER)
        home.mkdir(parents=True, exist_ok=True)
        items: list[RolloutItem] = []
        ids = [f"turn-{n:04d}" for n in range(TURNS)]
        for n, turn_id in enumerate(ids):
            items += _turn(turn_id, _prompt(n))
        thread_id = write_root(ThreadStore(home), items, cwd=row.cwd)
        assert TURNS * PROMPT_CHARS > MAX_LINE_BYTES
        start = SessionStart(
            agent_session_id=runtime_key(WS, sid),
            home=str(home),
            cwd=row.cwd,
            settings=dict(row.settings),
            model=row.model,
            provider_session_id=thread_id,
            runtime_context=dict(row.runtime_context),
        )
        daemon.ctx.workers.start_session(PROVIDER, start, 30.0).result(timeout=30)

        request = HistoryRequest(runtime_key(WS, sid), home=str(home))
        worker = _worker(c)
        before = worker.io_counters().read_chars
        history = daemon.ctx.workers.history(PROVIDER, request, 30.0).result(timeout=240)
        # The app-server's pages were read once for all the link's pages (the worker read
        # the whole history from its pipe again for each of them).
        assert worker.io_counters().read_chars - before < 2 * TURNS * PROMPT_CHARS
        assert [t.provider_turn_id for t in history.turns] == ids
        assert [t.status for t in history.turns] == ["completed"] * TURNS
        assert [t.user_text for t in history.turns] == [_prompt(n) for n in range(TURNS)]
