"""An interrupt that reaches the provider as its Turn ends, through the real daemon and a real
tutti-agent app-server behind the relay (`misbehaving_app_server`, `hold_end`): the provider
answers that it runs no such Turn, and that answer overtakes the Turn's `turn/completed` (the
provider writes the two from two threads). The provider is not hung: the Turn settles as the
provider ended it, `completed`, the interrupt is answered with that, and the runtime that ran it
runs the next Turn (stopping it recorded the completed Turn `interrupted`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.test_hung_provider import _app_servers
from tests.daemon.test_misbehaving_provider import Relay, _daemon
from tests.support.daemon import (
    WS,
    create_session,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "end_after_ms",
    # The end read close behind the answer (either may reach the Session actor first), or a
    # second later (the answer first: the end is awaited).
    [0, 1000],
)
def test_an_interrupt_the_provider_answers_as_its_turn_ends_gets_that_end(
    tmp_path: Path, end_after_ms: int
) -> None:
    relay = Relay(tmp_path)
    d = _daemon(tmp_path, relay)
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "warm")["outcome"] == "completed"
        servers = _app_servers(sid)
        relay.arm(f"hold_end {end_after_ms}")
        turn_id = submit(c, sid, "second")["turnId"]
        # The provider answered (its reply recorded) and ended the Turn; its end is held back.
        wait_for(
            lambda: any(m["kind"] == "assistant" for m in turn_of(c, sid, turn_id)["messages"])
        )
        assert turn_of(c, sid, turn_id)["phase"] == "active"
        answered = c.call(
            "turn.interrupt", {"workspaceId": WS, "agentSessionId": sid, "turnId": turn_id}
        )["turn"]
        done = settle(c, sid, turn_id)
        assert done["outcome"] == "completed", done
        assert (answered["phase"], answered["outcome"]) == ("settled", "completed"), answered
        assert run_turn(c, sid, "third")["outcome"] == "completed"
        assert _app_servers(sid) == servers  # the runtime that ran it was not stopped
    finally:
        d.stop()
