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

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, settle, submit
from tests.support.git_repos import pending_request
from tests.support.invariants import assert_invariants
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@contextmanager
def asked_with_a_short_idle(tmp_path: Path, point: str) -> Iterator[tuple[Client, str, str, str]]:
    """A daemon whose Session actors are reaped after 0.2 s idle, a tutti-agent Turn waiting
    on its question, and worker failpoint `point` holding a reply 3 s: yields (client,
    session, Turn, request); then stops the daemon and checks every law."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nidle_actor_seconds = 0.2\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        turn_id = submit(c, sid, "/ask go on?")["turnId"]
        request_id = pending_request(c, sid, turn_id)
        c.call("debug.failpoints", {"points": {point: "sleep:3000"}})
        yield c, sid, turn_id, request_id
    finally:
        d.stop()
    assert_invariants(home)


def test_an_answer_the_provider_took_is_recorded_after_the_idle_reap(tmp_path: Path) -> None:
    point = "worker.interaction.after_answer"
    with asked_with_a_short_idle(tmp_path, point) as (c, sid, turn_id, request_id):
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
