"""A `turn.interrupt` the provider took is answered and applied, even when the Turn it ends
settles before the worker's reply and the Session then looks idle.

An interrupt in flight at the worker is work of the Session actor: once the Turn had settled
(the provider's end of it can overtake the worker's reply), an actor that counted it as none
was stopped by the idle reaper, the worker's reply found no actor, and the request was
answered 503 `session_stopped` for an interrupt the provider had applied.

Through the real daemon and tutti-agent: a short idle limit (`idle_actor_seconds`), and the
worker's reply held back after the provider took the interrupt
(`worker.turn.after_interrupt`), long past that limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.test_answer_outlives_idle_reap import asked_with_a_short_idle
from tests.support.daemon import WS, run_turn, settle

pytestmark = pytest.mark.timeout(120)


def test_an_interrupt_the_provider_took_is_answered_after_the_idle_reap(tmp_path: Path) -> None:
    point = "worker.turn.after_interrupt"
    with asked_with_a_short_idle(tmp_path, point) as (c, sid, turn_id, _request_id):
        status, body = c.call_raw(
            "turn.interrupt",
            {"workspaceId": WS, "agentSessionId": sid, "turnId": turn_id},
            timeout=60,
        )
        assert status == 200, body
        assert body["turn"]["outcome"] == "interrupted", body
        turn = settle(c, sid, turn_id)
        assert turn["outcome"] == "interrupted", turn
        assert [i["status"] for i in turn["interactions"]] == ["superseded"], turn
        c.call("debug.failpoints", {"points": {"worker.turn.after_interrupt": "off"}})
        # The Session goes on: its next Turn runs.
        assert run_turn(c, sid, "after the interrupt")["outcome"] == "completed"
