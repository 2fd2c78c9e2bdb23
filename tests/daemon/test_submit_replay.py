"""A `turn.submit` replayed with its `requestId`, through the real daemon: the same input gets
the claimed Turn (202) while it runs, after it settled and after a daemon kill; another input
under that `requestId` is 409 `conflict`/`turn_request_conflict` naming the claimed Turn —
it got the claimed Turn 202, so the caller believed a text submitted that no Turn ever ran."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests.support.daemon import WS, DaemonProcess, create_session, settle
from transport.client import Client


def _submit(c: Client, sid: str, request_id: str, text: str) -> tuple[int, Any]:
    status, body = c.call_raw(
        "turn.submit",
        {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": request_id,
            "input": [{"type": "text", "text": text}],
        },
    )
    return status, body


def test_a_submit_replayed_with_another_input_is_a_conflict(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "home").start()
    try:
        c = daemon.client()
        sid = create_session(c)["agentSessionId"]
        request_id = str(uuid.uuid4())
        status, body = _submit(c, sid, request_id, "/slow 1500 hello")
        assert status == 202, body
        turn_id = body["turn"]["turnId"]
        # While the Turn runs (its claim active), the same input is the claimed Turn.
        status, body = _submit(c, sid, request_id, "/slow 1500 hello")
        assert status == 202 and body["turn"]["turnId"] == turn_id, body
        status, body = _submit(c, sid, request_id, "something else")
        assert status == 409 and body["reason"] == "turn_request_conflict", body
        settle(c, sid, turn_id)
        status, body = _submit(c, sid, request_id, "/slow 1500 hello")
        assert status == 202 and body["turn"]["turnId"] == turn_id, body
        status, body = _submit(c, sid, request_id, "something else")
        assert status == 409 and body["params"]["turnId"] == turn_id, body
        daemon.kill()
        daemon = DaemonProcess(tmp_path / "home").start()
        c = daemon.client()
        status, body = _submit(c, sid, request_id, "/slow 1500 hello")
        assert status == 202 and body["turn"]["turnId"] == turn_id, body
        status, body = _submit(c, sid, request_id, "something else")
        assert status == 409 and body["reason"] == "turn_request_conflict", body
        # Nothing of the refused inputs was written: one Turn, its one user Message.
        turns = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
        assert [t["turnId"] for t in turns] == [turn_id]
        users = [m["text"] for m in turns[0]["messages"] if m["kind"] == "user"]
        assert users == ["/slow 1500 hello"]
        # The same requestId on another Session is that Session's own claim.
        other = create_session(c)["agentSessionId"]
        status, body = _submit(c, other, request_id, "something else")
        assert status == 202 and body["turn"]["turnId"] != turn_id, body
    finally:
        daemon.stop()
