"""`session.history` of a history past the host↔worker link's frame bound (`MAX_LINK_FRAME`,
64 MiB), through an in-process daemon (real store file, real Claude Code worker process, the
real link): a Claude Session whose transcript holds 70 Turns of 1 MiB prompts (each as big as
a request may carry) answers a history of ~70 MiB of text. Its answer was one frame past the
bound: the host's end of the link dropped it, so the host waited out its timeout for an answer
that never came (and the frames sent with it were lost). It is now answered in pages, each
well under the bound, that the host joins: every Turn, in order, each with its text whole.
The pages are cut from one read of the transcript, held by the worker under a cursor (each
page read it whole again: ~9 reads of 70 MiB), counted as the worker's bytes read."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psutil
import pytest

from actors.context import runtime_key
from domain.worker_messages import (
    HISTORY_TURN_ALLOWANCE,
    HistoryRequest,
    SessionStart,
    history_page,
)
from drivers.claude_transcript import transcript_path
from tests.support.daemon import WS, create_session
from tests.support.in_process import in_process_daemon
from transport.client import Client
from transport.worker_link import MAX_LINK_FRAME

pytestmark = [pytest.mark.claude, pytest.mark.timeout(300)]

PROVIDER = "claude-code"
TURNS = 70
PROMPT_CHARS = 1 << 20


def _prompt(n: int) -> str:
    return f"{n:04d} " + "p" * (PROMPT_CHARS - 5)


def _transcript(turns: int) -> tuple[bytes, list[str]]:
    """A transcript as the CLI writes it (one JSON object a line): per Turn its root user
    message and an assistant reply. Its root user ids, in order."""
    lines: list[bytes] = []
    roots: list[str] = []
    for n in range(turns):
        root = str(uuid.uuid4())
        roots.append(root)
        user = {
            "type": "user",
            "uuid": root,
            "message": {"role": "user", "content": _prompt(n)},
        }
        reply = {
            "type": "assistant",
            "uuid": str(uuid.uuid4()),
            "parentUuid": root,
            "message": {"role": "assistant", "content": [{"type": "text", "text": f"ok {n}"}]},
        }
        lines += [json.dumps(user).encode(), json.dumps(reply).encode()]
    return b"\n".join(lines) + b"\n", roots


def _worker(c: Client) -> psutil.Process:
    """The provider's worker process, as `host.status` names it."""
    workers = c.call("host.status")["workers"]
    return psutil.Process(next(w["pid"] for w in workers if w["provider"] == PROVIDER))


def test_a_history_past_the_link_frame_is_answered_whole_in_pages(tmp_path: Path) -> None:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as (daemon, c):
        sid = create_session(c, provider=PROVIDER)["agentSessionId"]
        assert daemon.store is not None
        row = daemon.store.sessions.get_session(WS, sid)
        home = daemon.ctx.runtime_home(WS, sid, PROVIDER)
        home.mkdir(parents=True, exist_ok=True)
        provider_session_id = str(uuid.uuid4())
        start = SessionStart(
            agent_session_id=runtime_key(WS, sid),
            home=str(home),
            cwd=row.cwd,
            settings=dict(row.settings),
            model=row.model,
            provider_session_id=provider_session_id,
            runtime_context=dict(row.runtime_context),
        )
        daemon.ctx.workers.start_session(PROVIDER, start, 30.0).result(timeout=30)
        text, roots = _transcript(TURNS)
        path = transcript_path(home, row.cwd, provider_session_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)
        assert len(text) > MAX_LINK_FRAME

        request = HistoryRequest(runtime_key(WS, sid), home=str(home))
        worker = _worker(c)
        before = worker.io_counters().read_chars
        history = daemon.ctx.workers.history(PROVIDER, request, 30.0).result(timeout=120)
        # One read of the transcript for all the pages (each page read it whole again).
        assert worker.io_counters().read_chars - before < 2 * len(text)
        assert [t.provider_turn_id for t in history.turns] == roots
        assert [t.user_text for t in history.turns] == [_prompt(n) for n in range(TURNS)]
        assert all(t.binding_json for t in history.turns)
        # The link still carries what follows.
        again = daemon.ctx.workers.history(PROVIDER, request, 30.0).result(timeout=120)
        assert len(again.turns) == TURNS
        # A page whose cursor the worker no longer holds (dropped, or another worker's) is
        # answered from a new read.
        gone = HistoryRequest(runtime_key(WS, sid), home=str(home), after_index=9, cursor="gone")
        rest = daemon.ctx.workers.history(PROVIDER, gone, 30.0).result(timeout=120)
        assert [t.provider_turn_id for t in rest.turns] == roots[9:]


def test_a_page_ends_before_the_turn_past_its_bound_never_before_its_first() -> None:
    turns = [{"providerTurnId": f"t{n}", "userText": "u" * 100} for n in range(5)]
    each = HISTORY_TURN_ALLOWANCE + 102
    assert history_page(turns, 0, max_chars=2 * each) == (turns[:2], 2)
    assert history_page(turns, 2, max_chars=2 * each) == (turns[2:4], 4)
    assert history_page(turns, 4, max_chars=2 * each) == (turns[4:], None)
    # A Turn past the bound on its own is a page of its own: paging moves on.
    assert history_page(turns, 1, max_chars=10) == (turns[1:2], 2)
    assert history_page(turns, 5) == ([], None)
