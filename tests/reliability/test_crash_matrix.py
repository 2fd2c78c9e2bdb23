"""The crash matrix: every failpoint of PROTOCOL.md × every wired provider ×
`kill`. Each trial forks, SIGKILLs the process that hits the point, restarts what died, lets
recovery run, and asserts the end state written in docs/reliability.md plus every invariant.

A trial proves it reached its point (the process died with SIGKILL and the point's durable
`once:` marker exists): a cell whose provider never reaches its point fails.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.reliability_harness import (
    LEDGER,
    PROVIDERS,
    SOAK,
    children_of,
    fork_params,
    host_fired,
    provider_env,
    session_exists,
    trials,
    unwired_reason,
    worker_fired,
    worker_of,
)
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline, wait_for
from tests.support.invariants import assert_invariants
from transport.client import Client

TRIALS = trials(1, 50)
SLOW_TRACE = os.environ.get("AGENTHOST_TRACE") == "1"
pytestmark = pytest.mark.timeout(900 if TRIALS > 3 else 240)


@dataclass(frozen=True, slots=True)
class Expect:
    """The contract's end state after a kill at one point (docs/reliability.md, table 1)."""

    status: str
    """Public operation status after recovery."""
    children: int
    """Provider children the fork leaves, counted in the provider's own files."""


# Host points are the same for every provider: they are steps of the saga itself.
HOST: dict[str, Expect] = {
    "host.fork.after_prepare": Expect("failed", 0),  # prepared → failed at restart
    "host.fork.after_dispatching": Expect("unknown", 0),  # dispatching → unknown, never resent
    "host.fork.deadline": Expect("unknown", 0),  # the same place: the request not yet sent
    "host.fork.after_provider_result": Expect("unknown", 1),  # child made, not yet accepted
    "host.fork.before_commit": Expect("committed", 1),  # provider_accepted → commit at restart
    "host.fork.after_commit": Expect("committed", 1),
}
# The worker dies with the request in flight: the host cannot know, so always `unknown`. For
# Claude (`provider_owned`) the SDK writes the child next to the source and the driver moves it
# into the child's home; that move is its binding step and carries the `worker.bind.*` points.
WORKER: dict[str, Expect] = {
    "worker.fork.before_provider_call": Expect("unknown", 0),
    "worker.fork.after_provider_call": Expect("unknown", 1),
    "worker.bind.before_copy": Expect("unknown", 1),
    "worker.bind.after_copy": Expect("unknown", 1),
}
EXPECTED: dict[str, dict[str, Expect]] = {provider: HOST | WORKER for provider in PROVIDERS}
POINTS = sorted(HOST) + sorted(WORKER)


def _cells() -> list[Any]:
    cells = []
    for provider in PROVIDERS:
        # A provider that is not installed FAILS its cells (never skips): `make test` installs
        # every pinned provider, so a missing one is a broken set-up, not a pass.
        marks: list[Any] = []
        if provider == "claude-code":
            marks.append(pytest.mark.claude)
        if provider == "codex":
            marks.append(pytest.mark.codex)
        for point in POINTS:
            cells.append(pytest.param(provider, point, marks=marks, id=f"{provider}-{point}"))
    return cells


class Cell:
    """One (provider, point) cell: a daemon home with one source Session forked once per trial
    (at the same Turn after a failed or ACKed fork, at a new Turn after an `unknown` one)."""

    def __init__(self, provider: str, point: str, home: Path, cwd: Path) -> None:
        self.provider = provider
        self.point = point
        self.expect = EXPECTED[provider][point]
        self.home = home
        self.log: list[str] = []  # phase timings, printed when a trial fails
        self._t0 = time.monotonic()
        self.d = DaemonProcess(home).start()
        c = self.client()
        self.sid = create_session(c, provider=provider, title="src", cwd=str(cwd))["agentSessionId"]
        self.boundary = self._turn(c, self.sid, "t0")
        self.source_pid = c.call("session.get", {"workspaceId": WS, "agentSessionId": self.sid})[
            "session"
        ]["providerSessionId"]
        assert self.source_pid

    def mark(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self._t0:8.2f}s {what}")

    def client(self) -> Client:
        return self.d.client(timeout=60)

    @staticmethod
    def _turn(c: Client, sid: str, text: str) -> dict[str, Any]:
        turn = run_turn(c, sid, text)
        assert turn["outcome"] == "completed", turn
        return turn

    def restart(self) -> None:
        self.d.kill()
        self.mark("killed")
        self.d = DaemonProcess(self.home).start()
        self.mark("restarted")

    def trial(self, k: int) -> str:
        self.mark(f"trial {k}")
        c = self.client()
        before = children_of(self.home, self.source_pid)
        c.call("debug.failpoints", {"points": {self.point: "once:kill"}})
        rid, target = str(uuid.uuid4()), str(uuid.uuid4())
        params = fork_params(self.sid, self.boundary["turnId"], request_id=rid, target=target)
        if self.point.startswith("host."):
            c.submit("fork.create", params)  # the reply never comes: the daemon dies
            assert self.d.wait_exit(60) == -signal.SIGKILL, self.d.tail_log()
            assert host_fired(self.d, self.point)
            self.restart()
            c = self.client()
        else:
            worker = worker_of(self.d, self.provider)
            assert worker is not None
            c.call_raw("fork.create", params)
            assert worker_fired(self.d, self.point)
            wait_for(lambda: (w := worker_of(self.d, self.provider)) and w["pid"] != worker["pid"])
        self.mark("point reached")
        # The Engine's retry: the same identity returns the durable, recovered operation.
        op = _until_terminal(c, c.call("fork.create", params)["operation"])
        self.mark(f"operation {op['status']}")
        assert op["status"] == self.expect.status, (self.point, op)
        after = children_of(self.home, self.source_pid)
        assert len(after - before) == self.expect.children, (self.point, after - before)
        assert session_exists(c, target) == (op["status"] == "committed")
        if op["status"] == "committed":
            child_turns = timeline(c, target)
            assert [t["sequence"] for t in child_turns] == list(range(1, len(child_turns) + 1))
            assert child_turns[-1]["turnId"] == op["lineage"]["targetTurnId"]
            if k == 0 or SOAK:
                # Resume proof: the child runs a turn on its own provider state (the checker
                # below proves readability from the files on every trial).
                self._turn(c, target, f"child {k}")
                self.mark("child turn")
        if op["status"] == "unknown":
            # Never redispatched: a new identity on the boundary gets the same operation back.
            again = c.call("fork.create", fork_params(self.sid, self.boundary["turnId"]))
            assert again["operation"]["operationId"] == op["operationId"]
            assert children_of(self.home, self.source_pid) == after
        assert_invariants(self.home)
        self.mark("invariants")
        # The fence is released: a fenced write succeeds. An `unknown` operation keeps its
        # boundary's barrier forever, so the next trial needs a new Turn (also a fenced write).
        if op["status"] == "unknown":
            self.boundary = self._turn(c, self.sid, f"after {k}")
        else:
            c.call(
                "session.updateSettings",
                {"workspaceId": WS, "agentSessionId": self.sid, "settings": {"trial": k}},
            )
            if op["status"] == "committed":
                c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
        self.mark("fence released")
        return str(op["status"])

    def close(self) -> None:
        self.d.stop()


def _until_terminal(c: Client, op: dict[str, Any]) -> dict[str, Any]:
    def poll() -> dict[str, Any] | None:
        got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
        return got["operation"] if got["operation"]["status"] != "accepted" else None

    return dict(op if op["status"] != "accepted" else wait_for(poll, 60))


@pytest.mark.parametrize(("provider", "point"), _cells())
def test_kill_at_failpoint_ends_as_the_contract_table_says(
    tmp_path: Path, provider: str, point: str
) -> None:
    reason = unwired_reason(provider)
    assert reason is None, f"NOT WIRED: {reason}"
    outcomes: Counter[str] = Counter()
    with provider_env(provider, tmp_path / "home") as cwd:
        cell = Cell(provider, point, tmp_path / "home", cwd)
        cell.mark("source ready")
        try:
            for k in range(TRIALS):
                outcomes[cell.trial(k)] += 1
        except BaseException:
            print("\n".join(cell.log))
            print(cell.d.tail_log())
            raise
        finally:
            cell.close()
        if SLOW_TRACE:
            print("\n".join(cell.log))
    expect = EXPECTED[provider][point]
    LEDGER.record(
        "crash-matrix",
        f"{provider} {point}",
        trials=TRIALS,
        outcomes=outcomes,
        invariant_checks=TRIALS,
    )
    assert outcomes == Counter({expect.status: TRIALS})
