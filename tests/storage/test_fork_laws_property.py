"""A hypothesis state machine over a real store file: it interleaves `fork.create` of both
point kinds (prepare → dispatch → accepted/commit, unknown, failed), `fork.resolve` (adopt,
abandon), ACK, `session.delete`, new Turns and restarts (close, reopen, start-up recovery), and
after every step the invariant checker (tests/support/invariants.py) finds no violation of the
store's laws: one barrier holder per boundary whatever the point kind (law 8), a child iff
committed (law 2), reservations, the fence, and no `unknown` operation whose source is gone
(law 9). `AGENTHOST_SOAK=1` runs 200 examples instead of 10.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from store_builders import WS, new_session, settled_turn
from store_builders import fork_evidence as _evidence

from actors.recovery import recover_fork_operations
from domain.errors import HostError
from storage.models import ForkOperation, ForkPointKind, ForkPrepareRequest
from storage.store import Store
from tests.support.invariants import STORE_LAWS, check_invariants, provider_home

pytestmark = pytest.mark.timeout(300)


def _request(sid: str, turn_id: str, kind: str) -> ForkPrepareRequest:
    return ForkPrepareRequest(
        source_session_id=sid,
        request_id=f"req-{uuid.uuid4()}",
        target_session_id=str(uuid.uuid4()),
        turn_id="" if kind == ForkPointKind.LATEST_SETTLED else turn_id,
        point_kind=kind,
        driver_kind="tutti-agent",
        driver_version="0.0.10",
        binding_mode="host_copy",
        runtime_identity={},
    )


class ForkLaws(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.home = Path(tempfile.mkdtemp(prefix="fork-laws-"))
        self.store = Store.open(self.home / "store.sqlite3")
        self.sources: list[str] = []
        self.ops: list[str] = []
        self.steps = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.home, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------

    def _live_sources(self) -> list[str]:
        live = []
        for sid in self.sources:
            try:
                self.store.sessions.require_session_live(WS, sid)
            except HostError:
                continue
            live.append(sid)
        return live

    def _op(self, i: int) -> ForkOperation:
        return self.store.fork_queries.get_fork_operation(WS, self.ops[i % len(self.ops)])

    # -- rules ---------------------------------------------------------------------------------

    @precondition(lambda self: len(self.sources) < 3)
    @rule()
    def new_source(self) -> None:
        sid = new_session(self.store, provider_session_id=f"prov-{uuid.uuid4().hex[:8]}")
        # The provider home a real source has: the evidence the checker looks for (law 9).
        provider_home(self.home, WS, sid, "tutti-agent").mkdir(parents=True)
        settled_turn(self.store, sid, text="first")
        self.sources.append(sid)

    @precondition(lambda self: bool(self.sources))
    @rule(i=st.integers(0, 5))
    def new_turn(self, i: int) -> None:
        live = self._live_sources()
        if live:
            # Fenced by an active fork: refused, typed.
            with contextlib.suppress(HostError):
                settled_turn(self.store, live[i % len(live)], text="more")

    @precondition(lambda self: bool(self.sources))
    @rule(
        i=st.integers(0, 5),
        back=st.integers(0, 3),
        kind=st.sampled_from([ForkPointKind.THROUGH_TURN, ForkPointKind.LATEST_SETTLED]),
    )
    def fork_create(self, i: int, back: int, kind: str) -> None:
        live = self._live_sources()
        if not live:
            return
        sid = live[i % len(live)]
        turns, _ = self.store.history.timeline(WS, sid, after_sequence=0, limit=1000)
        settled = [t.turn_id for t in turns if t.phase == "settled"]
        if not settled:
            return
        turn_id = settled[max(0, len(settled) - 1 - back)]
        try:
            op, created = self.store.fork_prepare.prepare_fork(WS, _request(sid, turn_id, kind))
        except HostError:
            return
        if created:
            self.ops.append(op.operation_id)

    @precondition(lambda self: bool(self.ops))
    @rule(
        i=st.integers(0, 50),
        outcome=st.sampled_from(["commit", "unknown", "failed", "accept_only", "dispatch_only"]),
    )
    def advance(self, i: int, outcome: str) -> None:
        op = self._op(i)
        try:
            if op.status == "prepared":
                if outcome == "failed":
                    self.store.fork_transitions.mark_fork_failed(
                        WS, op.operation_id, "provider refused"
                    )
                    return
                self.store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
                if outcome == "dispatch_only":
                    return
                op = self.store.fork_queries.get_fork_operation(WS, op.operation_id)
            if op.status == "dispatching":
                if outcome == "unknown":
                    self.store.fork_transitions.mark_fork_unknown(WS, op.operation_id, "no answer")
                    return
                if outcome == "failed":
                    self.store.fork_transitions.mark_fork_failed(WS, op.operation_id, "rejected")
                    return
                self.store.fork_transitions.mark_fork_provider_accepted(
                    WS, op.operation_id, _evidence(op)
                )
                if outcome == "accept_only":
                    return
                op = self.store.fork_queries.get_fork_operation(WS, op.operation_id)
            if op.status == "provider_accepted":
                self.store.fork_commit.commit_fork(WS, op.operation_id)
        except HostError:
            pass

    @precondition(lambda self: bool(self.ops))
    @rule(i=st.integers(0, 50), action=st.sampled_from(["adopt", "abandon"]))
    def resolve(self, i: int, action: str) -> None:
        op = self._op(i)
        if op.status != "unknown":
            return
        try:
            self.store.resolution.begin_resolution(
                WS,
                op.operation_id,
                request_id=str(uuid.uuid4()),
                action=action,
                child_id=f"child-{op.operation_id}" if action == "adopt" else None,
                evidence={"verdict": "adoptable" if action == "adopt" else "absent"},
            )
            if action == "adopt":
                self.store.resolution.adopt_unknown_fork(WS, op.operation_id, _evidence(op))
                self.store.fork_commit.commit_fork(WS, op.operation_id)
                self.store.resolution.finish_resolution(WS, op.operation_id, {"action": "adopt"})
            else:
                self.store.resolution.abandon_fork(WS, op.operation_id, {"action": "abandon"})
        except HostError:
            pass

    @precondition(lambda self: bool(self.ops))
    @rule(i=st.integers(0, 50))
    def acknowledge(self, i: int) -> None:
        with contextlib.suppress(HostError):
            self.store.fork_transitions.acknowledge_fork(WS, self._op(i).operation_id)

    @precondition(lambda self: bool(self.sources))
    @rule(i=st.integers(0, 5))
    def delete(self, i: int) -> None:
        live = self._live_sources()
        if not live:
            return
        sid = live[i % len(live)]
        unknown = [
            o
            for o in (self.store.fork_queries.get_fork_operation(WS, op_id) for op_id in self.ops)
            if o.source_session_id == sid and o.status == "unknown"
        ]
        try:
            self.store.sessions.delete_session(WS, sid)
        except HostError as exc:
            assert exc.reason in ("agent_session_fork_unresolved", "agent_session_fork_in_progress")
            return
        assert not unknown, "a source with an unknown fork was deleted"

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = Store.open(self.home / "store.sqlite3")
        recover_fork_operations(self.store)
        self.store.resolution.recover_fork_resolutions()

    # -- the laws after every step ---------------------------------------------------------------

    @invariant()
    def laws_hold(self) -> None:
        self.steps += 1
        report = check_invariants(self.home, probe_fence=self.steps % 5 == 0)
        broken = [v for v in report.violations if v.law in STORE_LAWS]
        assert not broken, broken


ForkLaws.TestCase.settings = settings(
    max_examples=200 if os.environ.get("AGENTHOST_SOAK") == "1" else 10,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_fork_laws_hold_under_any_interleaving = ForkLaws.TestCase
