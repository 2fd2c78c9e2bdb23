"""Every request gets a reply, even one whose Session actor the idle reaper would stop:
a `fork.create` waits for its source's runtime preparation (a provider runtime slot, then
`session.start`) before any operation exists. The Session actor counts that wait as work:
were the idle reaper to stop it mid-wait, the preparation's answer would find no actor
("session actor … gone before a driver answer") and the request would never be answered.

Through the real daemon and tutti-agent: one runtime slot (`max_runtimes_per_provider = 1`)
held by another Session's slow turn, an idle limit far shorter than that turn
(`idle_actor_seconds`), and a fork of a third-party Session queued behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.test_fork_saga import until_terminal
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    run_turn,
    submit,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


def test_fork_waiting_for_a_runtime_slot_is_answered_after_the_idle_reap(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(
        "[daemon]\nmax_runtimes_per_provider = 1\nidle_actor_seconds = 0.2\n"
    )
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        source = create_session(c)["agentSessionId"]
        boundary = run_turn(c, source, "hello")
        holder = create_session(c)["agentSessionId"]
        slow = submit(c, holder, "/slow 3000 holds the only runtime slot")
        # The holder's turn runs: it has the slot until it settles.
        wait_for(
            lambda: (
                c.call("session.get", {"workspaceId": WS, "agentSessionId": holder})["session"][
                    "activeTurnId"
                ]
                == slow["turnId"]
            ),
            30,
        )
        # Queued behind the slot far longer than the idle limit; had the reaper stopped the
        # source's actor meanwhile, this call would get no reply (a client timeout here).
        status, body = c.call_raw(
            "fork.create",
            fork_params(WS, source, boundary["turnId"]),
            timeout=60,
        )
        assert status in (200, 202), body
        assert until_terminal(c, body["operation"])["status"] == "committed"
    finally:
        d.stop()
