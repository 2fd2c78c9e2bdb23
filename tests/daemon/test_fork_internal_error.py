"""A `thread/fork` answered `-32603` (internal error): an app-server answers so for a failure
that may come after it wrote the child (Codex 0.171.0 when it cannot read the child's rollout
back or list its Turns; the Tutti Agent when building its answer fails), so the fork is
`unknown`, never `failed` with a child no operation owns: `fork.resolve` finds the child,
adopts it, and the child runs. Through the real daemon and a real tutti-agent app-server behind
the misbehaving relay, which forks for real and then answers the error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.test_fork_resolve import adopt_and_use
from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.daemon.test_misbehaving_provider import Relay, _daemon
from tests.support.daemon import WS
from tests.support.homes import child_rollouts, runtime_home

pytestmark = pytest.mark.timeout(180)


def test_a_fork_answered_internal_error_after_its_child_was_written_is_unknown_and_adoptable(
    tmp_path: Path,
) -> None:
    relay = Relay(tmp_path)
    d = _daemon(tmp_path, relay)
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        source_home = runtime_home(d.home, WS, sid)
        relay.arm("internal")
        _, op = fork(c, sid, turns[1]["turnId"])
        op = until_terminal(c, op)
        relay.taken_pid()  # the relay answered this fork's `thread/fork`
        assert len(child_rollouts(source_home)) == 1  # the provider made its child
        assert op["status"] == "unknown", op
        session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        adopt_and_use(c, op, session["providerSessionId"], lambda: len(child_rollouts(source_home)))
    finally:
        d.stop()
