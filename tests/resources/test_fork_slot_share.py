"""Forks held in a slow provider call must not take a warm Session's runtime slot, through the
real daemon: with two slots per provider, forks may hold only one (`fork_share`), so a second
fork waits for the share instead of evicting the idle warm runtime, and the warm Session's
next Turn runs on its own slot while both forks are still held — it is never queued behind
them. Held by the `worker.fork.before_provider_call` failpoint, not by a clock."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, get_op, until_terminal
from tests.support.daemon import (
    DaemonProcess,
    create_session,
    run_turn,
    status_of_last_fork,
    submit,
    turn_of,
    wait_for,
)
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

P = "tutti-agent"
HOLD = {"worker.fork.before_provider_call": "hang"}
RELEASE = {"worker.fork.before_provider_call": "off"}


def _slots(c: Client) -> dict[str, Any]:
    return dict(c.call("host.status")["runtimes"][P])


def test_a_warm_turn_is_not_queued_behind_forks_held_in_their_provider_call(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nmax_runtimes_per_provider = 2\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        sources = []
        for name in ("a", "b"):
            sid = create_session(c)["agentSessionId"]
            sources.append((sid, run_turn(c, sid, f"source {name}")["turnId"]))
        warm = create_session(c)["agentSessionId"]
        assert run_turn(c, warm, "warm up")["outcome"] == "completed"
        (a, a_turn), (b, b_turn) = sources

        c.call("debug.failpoints", {"points": HOLD})
        _, op_a = fork(c, a, a_turn)
        wait_for(lambda: get_op(c, op_a["operationId"])["phase"] == "dispatching")
        # The second fork's reply waits for its runtime: asked from a thread of its own.
        forked: dict[str, tuple[int, dict[str, Any]]] = {}
        second = threading.Thread(
            target=lambda: forked.update(b=fork(d.client(timeout=110), b, b_turn)), daemon=True
        )
        second.start()
        # It either waits for the forks' share or (taking the warm runtime's slot) is held in
        # its provider call too.
        wait_for(
            lambda: (
                _slots(c).get("queuedForks")
                or status_of_last_fork(home / "store.sqlite3", b) == "dispatching"
            )
        )

        turn = submit(c, warm, "still warm")

        def settled_or_not_queued() -> dict[str, Any] | None:
            now = turn_of(c, warm, turn["turnId"])
            if now["phase"] == "settled":
                return now
            slots = _slots(c)
            assert slots["queued"] == slots.get("queuedForks", 0), (
                f"the warm Session's Turn waits for a slot behind the forks: {slots}"
            )
            return None

        settled = wait_for(settled_or_not_queued, 60)
        assert settled["outcome"] == "completed", settled
        # ... while the first fork is still in its provider call and the second still waits.
        assert get_op(c, op_a["operationId"])["phase"] == "dispatching"
        assert _slots(c)["queuedForks"] == 1
        assert not forked

        c.call("debug.failpoints", {"points": RELEASE})
        assert until_terminal(c, op_a)["status"] == "committed"
        second.join(100)
        _, op_b = forked["b"]
        assert until_terminal(c, op_b)["status"] == "committed"
        # The fork's slot is given back after its commit is answered: a moment later.
        wait_for(lambda: _slots(c)["forks"] == 0, 10)
    finally:
        d.stop()
