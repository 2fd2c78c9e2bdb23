"""What a worker keeps after a fork's answer is bounded, through the real daemon: a fork's large
objects (the binder's decoded lines) are freed on the worker's `deferred-release` thread a
settle after the answer, with the cyclic collector held off until then
(`drivers/app_server/fork.py`: `release_later`). Forked as fast as the worker answers — far
above one fork per `SETTLE_SECONDS`, i.e. 20 a second — for many seconds, that thread must keep
up: the worker's RSS levels off (its last third is no higher than its middle one, with a
margin) and, once the forks stop, no thread of the worker keeps waking (a backlog of batches
would be freed one settle apart, each a wake-up, the collector held off until the last). Before
`0ced450` each batch slept its settle after the previous one: above ~20 forks/s per worker the
queue grew for as long as the forks came, and the worker's RSS with it.

Everything is measured from the outside (`/proc` of the worker process: its RSS and each of
its threads' voluntary context switches); the source is one Session whose settled Turn has
~600 rollout lines (the fake Responses API's `steps`), so every fork's litter is past
`INLINE_ELEMENTS` and goes to the release thread. Several clients fork that one Turn at once
(the barrier serialises its forks: a client asking while one is active gets that operation),
each operation must commit and is ACKed. `AGENTHOST_SOAK=1` forks for 120 s instead of 20."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from drivers.app_server.fork import INLINE_ELEMENTS
from tests.resources.steps import steps_daemon
from tests.support.daemon import WS, create_session, fork_params, run_turn
from transport.client import ApiError, Client

SOAK = os.environ.get("AGENTHOST_SOAK") == "1"
BURST_S = 120.0 if SOAK else 20.0
CLIENTS = 4
SOURCE = "steps 300 20"
"""The source Turn: 300 reasoning items of 20 bytes (~600 rollout lines)."""
RSS_MARGIN_KB = 2048 if SOAK else 1024
"""How much higher the last third's RSS may peak than the middle third's. The old code's
backlog grew the worker by ~40 KB a batch, several batches a second (+1.3-3.4 MB from the
middle third to the last at 21-34 forks/s, more the faster it forks); today's worker grows by
one step of ~0.5 MB somewhere near its 1,000th-2,000th fork (the interpreter's table of
interned strings, which pathlib fills with each fork's new path names, resizing; level before
and after), which a quiet machine's 20 s may reach."""
IDLE_S = 1.5
"""The window over which each thread's wake-ups are counted, before the forks and after."""
GRACE_S = 0.5
"""From the last fork's answer to the window after (ten settles)."""
WAKE_MARGIN = 4
"""Wake-ups a thread may have in the window after more than in the one before (the
release thread of a backlog wakes once per settle: 30 in the window)."""

pytestmark = pytest.mark.timeout(BURST_S + 120)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _wakeups(pid: int) -> dict[str, int]:
    """Each thread's voluntary context switches (a wake-up each: it went to sleep and woke)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                out[task.name] = int(line.split()[1])
    return out


def _woken(pid: int, seconds: float) -> dict[str, int]:
    before = _wakeups(pid)
    time.sleep(seconds)
    after = _wakeups(pid)
    return {tid: n - before.get(tid, 0) for tid, n in after.items()}


def _rollout_lines(home: Path, sid: str) -> int:
    rollouts = list((home / "runtimes" / WS / sid).glob("*/sessions/**/rollout-*.jsonl"))
    assert len(rollouts) == 1, rollouts
    return len(rollouts[0].read_bytes().splitlines())


def _worker(c: Client) -> dict[str, Any]:
    (worker,) = [w for w in c.call("host.status")["workers"] if w["provider"] == "tutti-agent"]
    return dict(worker)


def test_a_worker_forked_fast_for_long_frees_what_each_fork_left(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with steps_daemon(home) as d:
        c = d.client(timeout=60)
        sid = create_session(c)["agentSessionId"]
        turn = run_turn(c, sid, SOURCE)
        assert turn["outcome"] == "completed", turn
        # Every fork's litter (the bind's decoded lines) goes to the release thread.
        assert _rollout_lines(home, sid) > 2 * INLINE_ELEMENTS
        worker = _worker(c)
        pid = int(worker["pid"])
        idle = _woken(pid, IDLE_S)

        committed: set[str] = set()
        failures: list[str] = []
        rss: list[tuple[float, int]] = []
        lock = threading.Lock()
        start = time.monotonic()
        deadline = start + BURST_S

        def fork_until_deadline() -> None:
            own = d.client(timeout=60)
            while time.monotonic() < deadline and not failures:
                status, body = own.call_raw(
                    "fork.create",
                    fork_params(WS, sid, turn["turnId"]),
                )
                if status >= 400:
                    failures.append(str(ApiError.from_reply(status, body)))
                    return
                op = body["operation"]
                while op["status"] == "accepted":
                    time.sleep(0.003)
                    got = own.call(
                        "fork.get", {"workspaceId": WS, "operationId": op["operationId"]}
                    )
                    op = got["operation"]
                if op["status"] != "committed":
                    failures.append(f"{op['operationId']}: {op['status']} {op.get('error')}")
                    return
                # Another client may have ACKed it already: the ACK is idempotent.
                own.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
                with lock:
                    committed.add(op["operationId"])

        clients = [threading.Thread(target=fork_until_deadline) for _ in range(CLIENTS)]
        for t in clients:
            t.start()
        while any(t.is_alive() for t in clients):
            rss.append((time.monotonic() - start, _rss_kb(pid)))
            time.sleep(0.25)
        for t in clients:
            t.join()
        elapsed = time.monotonic() - start
        time.sleep(GRACE_S)
        after = _woken(pid, IDLE_S)

        assert not failures, failures[:5]
        rate = len(committed) / elapsed
        print(
            f"{len(committed)} forks committed in {elapsed:.1f} s ({rate:.1f}/s) into worker {pid}"
        )
        # The same worker all along: none died and was restarted.
        assert _worker(c)["pid"] == pid and _worker(c)["restarts"] == 0
        assert committed

        middle = max(kb for t, kb in rss if BURST_S / 3 <= t < 2 * BURST_S / 3)
        last = max(kb for t, kb in rss if t >= 2 * BURST_S / 3)
        print(f"worker RSS: start {rss[0][1]} KB, middle third {middle} KB, last third {last} KB")
        problems = []
        if last - middle > RSS_MARGIN_KB:
            problems.append(
                f"the worker's RSS still grows: {middle} KB at most in the middle third of the"
                f" forks, {last} KB in the last"
            )
        # Once the forks stop, what they left is freed within a few settles: no thread (the
        # release thread working off a backlog, one wake-up per batch) keeps waking.
        excess = max(after.items(), key=lambda kv: kv[1] - idle.get(kv[0], 0))
        print(
            f"worker wake-ups in {IDLE_S} s after the last fork, busiest thread above its idle"
            f" rate: {excess[1]} (before the forks: {idle.get(excess[0], 0)})"
        )
        busy = {
            tid: (n, idle.get(tid, 0))
            for tid, n in after.items()
            if n > idle.get(tid, 0) + WAKE_MARGIN
        }
        if busy:
            problems.append(
                f"{GRACE_S} s after the last fork worker threads still wake (tid: (wake-ups in"
                f" {IDLE_S} s, in {IDLE_S} s before the forks)): {busy}"
            )
        assert not problems, f"{len(committed)} forks at {rate:.1f}/s: {problems}"
