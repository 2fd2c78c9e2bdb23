"""Fairness, through the real daemon: 64 slow provider calls (app-servers that take
minutes to start) must not stall an unrelated warm Session's turn. The worker runs calls that
may block (a spawn, a fork) on a `slow` lane and a warm Session's `session.start` /
`turn.start` on a `fast` lane; with one 64-thread pool for both, the warm turn
would wait until the slow calls timed out.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, submit, wait_for

pytestmark = pytest.mark.timeout(240)

SLOW_CALLS = 64


def _sleepers(tag: str) -> int:
    """Live `sleep <tag>` processes: the slow app-server starts in flight."""
    n = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "cmdline").read_bytes() == f"sleep\0{tag}\0".encode():
                n += 1
        except OSError:
            continue
    return n


def test_warm_turn_completes_while_64_slow_calls_are_pending(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    flag = tmp_path / "slow-from-now-on"
    tag = f"300.{random.randrange(100, 999)}"  # this test's sleepers, told apart from others
    wrapper = tmp_path / "tutti-agent.sh"
    tutti = Path(sys.executable).parent / "tutti-agent"
    wrapper.write_text(
        f'#!/bin/sh\nif [ -e "{flag}" ]; then exec sleep {tag}; fi\nexec "{tutti}" "$@"\n'
    )
    wrapper.chmod(0o755)
    (home / "agenthost.toml").write_text(
        f'[providers.tutti-agent]\ncommand = ["/bin/sh", "{wrapper}"]\n'
        # Every slow start reaches the worker at once (the host's start gate would otherwise
        # hold all but 4 of them back): this test is about the worker's lanes.
        "[daemon]\nmax_runtimes_per_provider = 200\nmax_runtime_starts_per_provider = 200\n"
    )
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        warm = create_session(c)["agentSessionId"]
        assert run_turn(c, warm, "warm up")["outcome"] == "completed"
        flag.touch()
        slow = []
        for _ in range(SLOW_CALLS):
            sid = create_session(c)["agentSessionId"]
            slow.append((sid, submit(c, sid, "never starts")["turnId"]))
        # Every slow call has reached the worker and holds a thread there.
        wait_for(lambda: _sleepers(tag) >= SLOW_CALLS, 60)
        turn = run_turn(c, warm, "still served")
        assert turn["outcome"] == "completed"
        assert any(m.get("text") == "echo: still served" for m in turn["messages"]), turn
        # ... while the slow calls are still pending.
        assert _sleepers(tag) >= SLOW_CALLS
        phases = {
            t["phase"]
            for sid, tid in slow
            for t in c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
            if t["turnId"] == tid
        }
        assert phases == {"active"}, phases
    finally:
        d.stop()
