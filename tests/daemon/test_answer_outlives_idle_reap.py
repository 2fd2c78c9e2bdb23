"""An `interaction.respond` whose answer the provider took is recorded and answered, even when
the Turn it let end settles before the worker's reply and the Session then looks idle.

The Session actor counted an answer in flight at the worker as no work: once the Turn had
settled (the provider's end can overtake the worker's reply), the idle reaper stopped the
actor, the worker's reply found no actor, the request was answered 503 `session_stopped`
("try again": a retry meets a question no longer pending) and the answer the provider took
was never recorded (the Interaction stayed `superseded`).

Through the real daemon and tutti-agent: a short idle limit (`idle_actor_seconds`), and the
worker's reply held back after the provider took the answer
(`worker.interaction.after_answer`), long past that limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, settle, submit
from tests.support.git_repos import pending_request
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.timeout(120)


def test_an_answer_the_provider_took_is_recorded_after_the_idle_reap(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nidle_actor_seconds = 0.2\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        turn_id = submit(c, sid, "/ask go on?")["turnId"]
        request_id = pending_request(c, sid, turn_id)
        c.call("debug.failpoints", {"points": {"worker.interaction.after_answer": "sleep:3000"}})
        status, body = c.call_raw(
            "interaction.respond",
            {
                "workspaceId": WS,
                "agentSessionId": sid,
                "turnId": turn_id,
                "requestId": request_id,
                "response": {"text": "yes"},
            },
            timeout=60,
        )
        assert status == 200, body
        assert body["interaction"]["status"] == "resolved", body
        turn = settle(c, sid, turn_id)
        assert turn["outcome"] == "completed", turn
        (asked,) = [i for i in turn["interactions"] if i["requestId"] == request_id]
        assert asked["status"] == "resolved", asked
        assert asked["output"]["text"] == "yes", asked
    finally:
        d.stop()
    assert_invariants(home)
