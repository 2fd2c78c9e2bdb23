"""The contention soak's fresh app-server proof (`ProofRace`): beside the chaos's load, a daemon
of its own (its home beside the soak's) whose Tutti Agent proves every fork's child readable by
a fresh app-server (`readability_proof = "app_server"`, the fallback the in-worker readers
stand in front of: `proof_round` is the crash soak's). Two Sessions run a Turn each; then
forks of them (`throughTurn` of a settled Turn, or `latestSettled`) race a client that mutates
the same Sessions — Turns submitted, titles and pins written, committed children deleted.
After the race (one fork more, nothing racing it, when none of the race's committed): every
fork ends; each committed one was proven `app_server` (its binding
receipt), and its child, if not deleted, runs a Turn; a fork refused or a mutation refused
counts by its reason, a 500 is a failure. The daemon stopped, its home's laws are checked
(`check_invariants`) and no process of it is left (`check_processes`)."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from tests.reliability.reliability_harness import fork_latest_params, trials
from tests.reliability.tutti_forks import _proof_of
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, settle, wait_for
from tests.support.invariants import Violation, check_invariants, check_processes
from transport.client import Client

CONFIG = '[providers."tutti-agent"]\nreadability_proof = "app_server"\n'
FORKS = trials(4, 12)
"""The forks of the race (each proven by a fresh app-server: a process start, so few)."""


class ProofRace:
    """`start` runs the race in a thread (beside the soak's chaos), `join` waits for it and
    judges its daemon's home; `ran` tallies what it met."""

    def __init__(self, base: Path, seed: int) -> None:
        self.home = base / "1"  # short: its sockets live in it
        self.rng = random.Random(seed ^ 0xA995E7)
        self.ran: Counter[str] = Counter()
        self.failures: list[str] = []
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.home.mkdir(parents=True)
        (self.home / "agenthost.toml").write_text(CONFIG)
        self._thread = threading.Thread(target=self._run, name="proof-race", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 240.0) -> list[Violation]:
        """The race's end (its failures raised here) and its home's laws, the daemon stopped."""
        if self._thread is None:
            return []
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the proof race still runs after {timeout} s"
        self._thread = None
        assert not self.failures, self.failures
        return list(check_invariants(self.home).violations) + check_processes(self.home, None)

    def summary(self) -> str:
        return "app_server proof race: " + (
            " ".join(f"{k}={v}" for k, v in sorted(self.ran.items())) or "did not run"
        )

    def _run(self) -> None:
        try:
            d = DaemonProcess(self.home).start()
            try:
                self._race(d)
            finally:
                d.stop()
        except BaseException as exc:  # noqa: BLE001 - judged by `join`
            self.failures.append(f"proof race: {type(exc).__name__}: {exc}")

    def _race(self, d: DaemonProcess) -> None:
        c = d.client(timeout=60)
        sids = [create_session(c)["agentSessionId"] for _ in range(2)]
        settled = {sid: [run_turn(c, sid, "seed")["turnId"]] for sid in sids}
        children: list[str] = []
        lock = threading.Lock()
        done = threading.Event()
        mutator = threading.Thread(
            target=self._mutate,
            args=(d.client(timeout=60), sids, settled, children, lock, done),
            name="proof-race-mutator",
            daemon=True,
        )
        mutator.start()
        ops: list[str] = []
        try:
            for _ in range(FORKS):
                sid = self.rng.choice(sids)
                with lock:
                    turn = self.rng.choice(settled[sid])
                params = (
                    fork_latest_params(sid)
                    if self.rng.random() < 0.5
                    else fork_latest_params(sid)
                    | {"point": {"type": "throughTurn", "turnId": turn}}
                )
                status, body = c.call_raw("fork.create", params)
                if status >= 400:
                    self._refused("fork.create", status, body)
                    continue
                op_id = body["operation"]["operationId"]
                if op_id in ops:
                    # The boundary's operation already (a fork of the same boundary answers
                    # the operation made for it: the barrier), its child counted once.
                    self.ran["fork answered an earlier one's operation"] += 1
                    continue
                ops.append(op_id)
                ended = self._ended(c, op_id)
                self.ran[f"fork {ended['status']}"] += 1
                if ended["status"] == "committed":
                    with lock:
                        children.append(ended["targetAgentSessionId"])
        finally:
            done.set()
            mutator.join(120)
        assert not mutator.is_alive(), "the proof race's mutator still runs"
        if not any(k == "fork committed" for k in self.ran):
            # Every fork of the race was refused or failed: one more, nothing racing it (the
            # proof is never left to chance).
            sid = sids[0]
            wait_for(lambda: self._idle(c, sid), timeout=60)
            op = c.call("fork.create", fork_latest_params(sid))["operation"]
            ops.append(op["operationId"])
            self.ran[f"fork after the race {self._ended(c, ops[-1])['status']}"] += 1
        for op_id in ops:
            op = self._ended(c, op_id)
            if op["status"] != "committed":
                continue
            proof = _proof_of(self.home, op_id)
            assert proof == "app_server", (op_id, proof)
            self.ran["proven app_server"] += 1
            child = op["targetAgentSessionId"]
            status, _ = c.call_raw("session.get", {"workspaceId": WS, "agentSessionId": child})
            if status == 200:
                wait_for(lambda ch=child: self._idle(c, ch), timeout=60)
                spoke = run_turn(c, child, "the child speaks")
                assert spoke["outcome"] == "completed", (op_id, spoke)
                self.ran["children spoke"] += 1

    def _mutate(
        self,
        m: Client,
        sids: list[str],
        settled: dict[str, list[str]],
        children: list[str],
        lock: threading.Lock,
        done: threading.Event,
    ) -> None:
        rng = random.Random(self.rng.random())
        while not done.is_set():
            sid = rng.choice(sids)
            draw = rng.random()
            s = {"workspaceId": WS, "agentSessionId": sid}
            if draw < 0.4:
                method = "turn.submit"
                params: dict[str, Any] = s | {
                    "requestId": str(uuid.uuid4()),
                    "input": [{"type": "text", "text": f"/write race.md {rng.random()}"}],
                }
            elif draw < 0.6:
                method, params = "session.updateTitle", s | {"title": f"r{rng.randrange(99)}"}
            elif draw < 0.8:
                method, params = "session.pin", s | {"pinned": rng.random() < 0.5}
            else:
                with lock:
                    child = children.pop(0) if children else None
                if child is None:
                    continue
                method, params = "session.delete", {"workspaceId": WS, "agentSessionId": child}
            try:
                status, body = m.call_raw(method, params)
            except Exception as exc:  # noqa: BLE001 - judged by `join`
                self.failures.append(f"{method}: {type(exc).__name__}: {exc}")
                return
            if status >= 400:
                self._refused(method, status, body)
                continue
            self.ran[f"{method} {status}"] += 1
            if method == "turn.submit":
                turn = settle(m, sid, body["turn"]["turnId"])
                if turn["outcome"] == "completed":
                    with lock:
                        settled[sid].append(turn["turnId"])

    def _refused(self, method: str, status: int, body: Any) -> None:
        reason = body.get("reason") if isinstance(body, dict) else body
        why = (body.get("params") or {}).get("forkBoundaryReason") if isinstance(body, dict) else 0
        reason = f"{reason}/{why}" if why else reason
        self.ran[f"{method} refused {reason}"] += 1
        if status >= 500:
            self.failures.append(f"{method} answered {status}: {body}")

    @staticmethod
    def _ended(c: Client, op_id: str) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            got = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            return dict(got) if got["status"] != "accepted" else None

        return dict(wait_for(ended, timeout=120))

    @staticmethod
    def _idle(c: Client, sid: str) -> bool:
        body = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
        return body["session"]["activeTurnId"] is None
