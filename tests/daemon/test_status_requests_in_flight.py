"""`host.status` → `requestsInFlight` counts the requests the daemon took and has not answered,
the status request itself included: through a real `agenthost serve`, a `turn.submit` held at
a `sleep` failpoint before its claim shows as one more than the status alone, from another
client, for as long as it is held; once it is answered the count is 1 again."""

from __future__ import annotations

import uuid

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, wait_for

pytestmark = pytest.mark.timeout(120)

HELD_MS = 3000


def test_requests_in_flight_counts_a_held_submit_until_it_is_answered(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    watcher = daemon.client()
    sid = create_session(c)["agentSessionId"]
    assert watcher.call("host.status", {})["requestsInFlight"] == 1
    c.call("debug.failpoints", {"points": {"host.turn.before_claim": f"once:sleep:{HELD_MS}"}})
    pending = c.submit(
        "turn.submit",
        {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "input": [{"type": "text", "text": "held"}],
        },
    )
    wait_for(
        lambda: watcher.call("host.status", {})["requestsInFlight"] == 2, timeout=HELD_MS / 1000
    )
    assert not pending.done()  # seen while the submit was still unanswered
    reply = pending.result(timeout=30)
    assert reply.ok, reply.error
    assert watcher.call("host.status", {})["requestsInFlight"] == 1
