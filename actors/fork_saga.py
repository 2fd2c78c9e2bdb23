"""The durable Fork saga (seed 000 §2, §6, §7.1, §10), run inside the source's SessionActor:
where it begins (`start`: `fork.create` validated, the runtime prepared, the durable prepare
that fences the source and starts a `ForkSaga`, or answers a replay / a held boundary with the
original), its steps, and `fork.get` of an operation no saga of this process owns
(`advance_leftover`: the restart rule, never a provider call).

validate → runtime preparation → prepare (durable, fences the source) → re-attest → mark
`dispatching` (durable) → one driver fork → classify the delivery disposition → binder
evidence → `provider_accepted` (in the WAL at once, on the disk with the commit's fsync) →
commit (durable). Every checkpoint is written whether or not the caller is still waiting; a
request that may have left the host is never re-sent.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from actors.context import runtime_key
from actors.fork_host import ForkHost, PreparedRuntime
from actors.fork_workspace import in_thread, remove_failed_tree
from actors.messages import ForkAdvance, ForkCreate, ForkReply, Reply
from actors.pool import TimerHandle
from actors.ports import (
    DeliveryUnknown,
    DriverInfo,
    NotDelivered,
    ProviderCatalog,
    WorkerFailed,
)
from actors.recovery import apply_restart_rule
from actors.runtime_dirs import remove_empty_session_dir
from domain import fork_states
from domain.enums import DeliveryDisposition
from domain.errors import (
    ForkInProgress,
    ForkUnsupported,
    HostError,
    ProviderError,
    checkpoint_refusal,
)
from domain.worker_messages import (
    Attestation,
    ForkRequest,
    ForkResult,
    ForkSource,
    ForkTarget,
    MalformedMessage,
    RuntimeAttest,
)
from storage.models import (
    ChangeEvent,
    ForkOperation,
    ForkPointKind,
    ForkPrepareRequest,
    ProviderForkEvidence,
)
from storage.sqlite import host_error_of, typed_store_error

log = logging.getLogger(__name__)

TEST_DEADLINE_S = 1.0
"""The host's fork deadline while `host.fork.deadline` is armed `error` (tests only)."""

TERMINAL = fork_states.TERMINAL


_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 2.0
_LAZY_RECHECK_S = 0.05


_LAST_KEY = threading.local()
"""Each Session actor thread's last `attestation_key`: (runtime, generation, key)."""


def attestation_key(runtime: PreparedRuntime, generation: str) -> tuple[str, ...]:
    """What a passed fork re-attestation proved (kept as the Session's `attested_runtime`): the
    runtime generation and the prepared identity it was asked about (a changed cwd or settings
    re-attests too). A warm fork asks it twice of the same frozen runtime, in one actor step
    (`SessionRuntime.warm_runtime`, then `attests_again`): the thread's last answer is kept
    for that runtime object and generation, so its settings are dumped once a fork."""
    last = getattr(_LAST_KEY, "key", None)
    if last is not None and last[0] is runtime and last[1] == generation:
        key: tuple[str, ...] = last[2]
        return key
    settings = json.dumps(dict(runtime.settings), sort_keys=True, default=str)
    key = (generation, runtime.home, runtime.cwd, settings)
    _LAST_KEY.key = (runtime, generation, key)
    return key


def attests_again(host: ForkHost, runtime: PreparedRuntime) -> bool:
    """Whether a fork on `runtime` sends `runtime.attest` before `dispatching`: not when the
    runtime this fork's `session.start` found is the one this Session's last re-attestation
    proved (same generation)."""
    return not (
        runtime.generation is not None
        and runtime.verdict is not None
        and host.attested_runtime == attestation_key(runtime, runtime.generation)
    )


def verdict_error(
    result: Mapping[str, Any], driver_kind: str, driver_version: str, point_kind: str
) -> str | None:
    """What keeps a fork of this prepared identity from leaving the host on the runtime's
    verdict (a `runtime.attest` answer, or an unchanged runtime's `session.start`), or None."""
    kind, version = str(result.get("driverKind")), str(result.get("driverVersion"))
    if (kind, version) != (driver_kind, driver_version):
        return f"driver changed since prepare: {driver_kind} {driver_version} → {kind} {version}"
    if result.get("forkThroughTurn") is not True:
        # The driver's own verdict (brand, version gate, SDK pin) at dispatch time.
        return "runtime no longer attests forkThroughTurn"
    if result.get("binderAvailable") is not True:
        # Fail closed (seed 000 §6/§7): only an explicit `true` lets a fork leave the host;
        # a missing key, false or anything else is "no binder", decided before dispatch.
        return (
            f"provider-state binder unavailable (binderAvailable="
            f"{result.get('binderAvailable', '<missing>')!r})"
        )
    full = point_kind == ForkPointKind.LATEST_SETTLED
    if full and result.get("forkFullSession") is not True:
        # The driver declares full-Session fork separately (seed 000 §11 step 2).
        return "the driver does not declare forkFullSession"
    return None


@dataclass(eq=False)
class Waiter:
    """A caller waiting for this operation; answered once (202 at the budget or the end)."""

    reply: Reply
    answered: bool = False
    timer: TimerHandle | None = None

    def answer(self, operation: ForkOperation, final: bool) -> None:
        if self.answered:
            return
        self.answered = True
        if self.timer is not None:
            self.timer.cancel()
        self.reply(ForkReply(operation, final))


@dataclass(eq=False)
class ForkSaga:
    """One fork operation from its durable prepare to its terminal status, on its source's
    actor (`host`); every step is a method, every worker answer comes back through
    `host.later`, every retry through `host.after`."""

    host: ForkHost
    operation: ForkOperation
    runtime: PreparedRuntime
    info: DriverInfo
    waiters: list[Waiter] = field(default_factory=list)
    _retry_delay: float = 0.05
    # The frozen prefix's (canonical Turn id, binding JSON), from prepare.
    frozen: tuple[tuple[str, str | None], ...] | None = None
    # `prepared` was a lazy COMMIT (the warm path) and no fsync'd checkpoint of this saga has
    # followed yet: a power cut could still lose the operation, so nobody is told of it.
    prepare_lazy: bool = False
    # `attests_again`'s answer, asked by the prepare in this same actor step (no tree to make
    # between them, so nothing can have changed the Session's attested runtime): `_attest`
    # takes it once instead of asking again. None: `_attest` asks.
    attests: bool | None = None
    # An abort's record failed with an error that is not the store's transient kind: its
    # traceback is logged once, the retries after it as one line each.
    _abort_logged: bool = False
    # The dispatch step's change events, durable and not yet handed to the subscribers: they
    # go with the provider's answer (ahead of the commit's or an ending's), or with the
    # budget's 202. Owned by `_entry`: they outlive a step only while `_in_flight`.
    _held: list[ChangeEvent] = field(default_factory=list)
    # The fork request is with the worker and its answer has not come back: the only time
    # `_held` may stay held past the end of a step.
    _in_flight: bool = False

    def __post_init__(self) -> None:
        if self.frozen is None:
            self.frozen = self.operation.frozen_turns

    # -- the steps ---------------------------------------------------------------------------

    def join(self, reply: Reply) -> None:
        """Another caller of this operation: answered at the end, or 202 at the budget."""
        waiter = Waiter(reply)
        self.waiters.append(waiter)
        budget = self.host.timeouts.fork_sync_budget_s
        waiter.timer = self.host.after(budget, lambda: self._answer_accepted(waiter))

    @contextmanager
    def _entry(self) -> Iterator[None]:
        """Every way into the saga (a step, the worker's answer, a timer) runs inside this.
        Whatever the block does or raises, the held events go to the subscribers at its end
        unless the fork request is in flight: nothing a step forgets, and no exception, leaves
        a durable change unannounced. (The steps that hand them on earlier do so for order:
        ahead of their own events.)"""
        try:
            yield
        finally:
            if not self._in_flight:
                self._release_held()

    def _answer_accepted(self, waiter: Waiter) -> None:
        with self._entry():
            self._answer_budget(waiter)

    def _answer_budget(self, waiter: Waiter) -> None:
        if waiter.answered:
            return
        if self.prepare_lazy:
            # The budget ran out before `dispatching` (or an ending) was durable, e.g. a busy
            # store retrying it: a 202 now would name an operation a power cut could still
            # lose. Asked again shortly; the saga's next checkpoint settles it.
            waiter.timer = self.host.after(_LAZY_RECHECK_S, lambda: self._answer_accepted(waiter))
            return
        try:
            op = self.host.store.fork_queries.get_fork_operation(
                self.host.ws, self.operation.operation_id
            )
        except Exception:  # noqa: BLE001 - the caller is answered whatever the store does
            log.warning("fork saga %s: budget read failed", self.operation.operation_id)
            op = self.operation
        waiter.answer(op, op.status in TERMINAL)
        # A provider slower than the budget: the subscribers hear of the dispatch now, with
        # the caller (no timer of their own).
        self._release_held()

    def _step(self, fn: Any, *args: Any) -> None:
        """Run one step; any unexpected error ends the saga with what the store holds, so a
        dispatched operation is never left looking retryable. A busy or full store is not
        unexpected: the step (its provider answer already in hand, never re-sent) is run
        again with backoff until its checkpoint lands, so a verified child is not turned into
        `unknown` by store contention and the fence stays held only by a live saga."""
        with self._entry():
            self._run_step(fn, *args)

    def _run_step(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001
            busy = typed_store_error(exc)
            if busy is not None:
                # A raw transient store error (a read's, or a temp file the descriptor limit
                # refused) is the same as a busy write: retried, never an abort.
                delay = self._next_delay()
                log.warning(
                    "fork saga %s: %s deferred %.2f s: %s",
                    self.operation.operation_id,
                    fn.__name__,
                    delay,
                    busy.message,
                )
                self.host.after(delay, lambda: self._step(fn, *args))
                return
            log.exception("fork saga %s failed in %s", self.operation.operation_id, fn.__name__)
            self._abort(exc)

    def _next_delay(self) -> float:
        delay = self._retry_delay
        self._retry_delay = min(_RETRY_MAX_S, delay * 2)
        return delay

    def _hit(self, name: str) -> None:
        failpoints = self.host.failpoints
        if failpoints.armed:  # a field read: nothing armed, no call into the registry
            failpoints.hit(name)

    def _after_prepare(self) -> None:
        self._hit("host.fork.after_prepare")
        op = self.operation
        if op.workspace_mode == "worktree" and op.worktree_state == "planned":
            # The child's tree, made and recorded before anything leaves the host: a crash
            # before the record leaves no tree (recovery removes a half-made one).
            trees, plan = self.host.fork_trees, op.worktree
            if trees is None or plan is None:
                self._fail("this host keeps no workspace checkpoints to make a worktree from")
                return
            made = in_thread(lambda: trees.make(plan, self._hit), f"worktree-{op.operation_id}")
            self.host.later(made, lambda f: self._step(self._tree_made, f))
            return
        self._attest()

    def _tree_made(self, fut: Future[str]) -> None:
        try:
            fut.result()
        except Exception as exc:  # noqa: BLE001 - nothing was dispatched: the fork failed
            self._fail(f"the worktree could not be made: {exc}")
            return
        with self.host.store.db.background():
            op, _ = self.host.store.fork_workspace.record_fork_worktree(
                self.host.ws, self.operation.operation_id
            )
        self.operation = op
        self._hit("host.workspace.after_record")
        self._attest()

    def _attest(self) -> None:
        runtime = self.runtime
        again, self.attests = self.attests, None
        if again is None:
            again = attests_again(self.host, runtime)
        if not again:
            assert runtime.generation is not None and runtime.verdict is not None
            # The runtime this fork's own `session.start` found is the one this
            # Session's last re-attestation proved (same generation: the worker, its
            # app-server or CLI did not change since). That start's verdict — fresh, from the
            # same runtime — is checked exactly as an attestation's, and the fork carries the
            # generation, so the worker refuses it (`not_started`) if another runtime is live
            # by the time it arrives. No `runtime.attest` round trip.
            self._step(self._check_verdict, dict(runtime.verdict), runtime.generation)
            return
        # Re-attest the same prepared runtime identity before anything leaves the host.
        fut = self.host.workers.attest(
            runtime.provider,
            RuntimeAttest(self.host.key, runtime.home, runtime.cwd, dict(runtime.settings)),
            self.host.timeouts.control_s,
        )
        self.host.later(fut, lambda f: self._step(self._attested, f))

    def _attestation_key(self, generation: str) -> tuple[str, ...]:
        return attestation_key(self.runtime, generation)

    def _attested(self, fut: Future[Attestation]) -> None:
        try:
            result = fut.result()
        except Exception as exc:  # noqa: BLE001 - attestation failed: nothing was dispatched
            self.host.attested_runtime = None
            self._fail(f"re-attestation failed: {exc}")
            return
        self._check_verdict(result.verdict, result.stamp.generation, True)

    def _check_verdict(
        self, result: Mapping[str, Any], generation: str | None, attested: bool = False
    ) -> None:
        """The re-attestation's checks on a verdict (a `runtime.attest` answer, or the fresh
        `session.start` verdict of an unchanged runtime); then `dispatching` and the fork."""
        op = self.operation
        error = self._verdict_error(result)
        if error is not None:
            self.host.attested_runtime = None
            self._fail(error)
            return
        if attested:
            # Remembered only for a runtime with a generation; the next fork skips the round
            # trip while its session.start reports this same generation.
            self.host.attested_runtime = (
                None if generation is None else self._attestation_key(generation)
            )
        # The request is handed to the worker link before this step's change events (the
        # prepare's held ones and `dispatching`'s) wake the events thread to read them back;
        # and they are kept until the provider's answer, whose step sends them ahead of its
        # own (one burst per fast fork: each entity read back and published once), or until
        # the caller's budget answers 202 for a slow one (`_answer_accepted`). Every one of
        # them goes out, each after its COMMIT is durable.
        with self.host.store.db.events_after(into=self._held):
            fork = self._dispatch(op, generation)
        # In flight from here (a host that runs the answer at once clears it inside `later`).
        self._in_flight = True
        try:
            self.host.later(fork, lambda f: self._step(self._dispatched, f))
        except BaseException:
            self._in_flight = False  # no answer will come: the step's end hands them on
            raise

    def _release_held(self) -> None:
        """The held events to the subscribers now (or to the enclosing `events_after` block:
        ahead of its own)."""
        held, self._held = self._held, []
        if held:
            self.host.store.db.notify(held)

    def _dispatch(self, op: ForkOperation, generation: str | None) -> Future[ForkResult]:
        """`dispatching`, durable, then the one fork request to the worker. A lazy prepare
        never gets here: it is left only for a warm fork whose verdict fails, which ends
        `failed` in `_check_verdict` (a passing one is prepared at `dispatching`)."""
        if op.status is not fork_states.ForkStatus.DISPATCHING:
            with self.host.store.db.background():
                # The saga's own row: one guarded UPDATE, no read of it first.
                op, _ = self.host.store.fork_transitions.mark_fork_dispatching(
                    self.host.ws, op.operation_id, known=op
                )
        # else the warm path's prepare wrote the row at `dispatching`, fsync'd, in its own
        # transaction (`_prepare`): law 1's marker is already durable, and its change events
        # are already in this saga's hold.
        self.operation = op
        # Law 1: the dispatching marker is durable before the request can leave the host.
        self._hit("host.fork.after_dispatching")
        target_home = self.host.runtime_home(
            self.host.ws, op.target_session_id, self.runtime.provider
        )
        request = ForkRequest(
            source=ForkSource(
                agent_session_id=self.host.key,
                provider_session_id=op.source_provider_session_id,
                home=self.runtime.home,
                cwd=self.runtime.cwd,
            ),
            target=ForkTarget(
                agent_session_id=runtime_key(self.host.ws, op.target_session_id),
                home=str(target_home),
                cwd=None if op.worktree is None else str(op.worktree["childCwd"]),
            ),
            # The provider-neutral input of seed 000 §7 names the canonical boundary Turn too.
            source_turn_id=op.source_turn_id,
            provider_turn_ids=tuple(op.source_provider_turn_ids),
            # Lined up with providerTurnIds: lets a provider_owned driver cut at a known
            # checkpoint instead of re-reading the source transcript (seed 000 §7, Claude 3).
            extra=self._dispatch_extra(generation),
            title=op.target_title,
            driver_kind=op.driver_kind,
            driver_version=op.driver_version,
        )
        return self.host.workers.fork(self.runtime.provider, request, self._deadline())

    def _deadline(self) -> float:
        """The host's deadline for the fork request (`Timeouts.fork_s`). `host.fork.deadline`
        armed `error` makes it `TEST_DEADLINE_S`: a host that gives up while the worker still
        forks, in seconds, not minutes (its `kill` is a kill after `dispatching`, as
        `host.fork.after_dispatching`'s)."""
        try:
            self._hit("host.fork.deadline")
        except HostError:
            return TEST_DEADLINE_S
        return self.host.timeouts.fork_s

    def _verdict_error(self, result: Mapping[str, Any]) -> str | None:
        op = self.operation
        return verdict_error(result, op.driver_kind, op.driver_version, op.point_kind)

    def _dispatched(self, fut: Future[ForkResult]) -> None:
        """The worker's answer: this step's events (the commit's, or an ending's) go out once
        it ends, the dispatch step's held ones ahead of them, after the callers are answered."""
        self._in_flight = False
        with self.host.store.db.events_after():
            self._release_held()
            self._answered(fut)

    def _answered(self, fut: Future[ForkResult]) -> None:
        try:
            result = fut.result()
        except NotDelivered as exc:
            self._hit("host.fork.after_provider_result")
            self._fail(f"fork request never reached the worker: {exc}")
            return
        except DeliveryUnknown as exc:
            self._hit("host.fork.after_provider_result")
            self._unknown(f"fork request sent, no answer: {exc}")
            return
        except WorkerFailed as exc:
            self._hit("host.fork.after_provider_result")
            # The worker crashed inside the driver: the provider call may have started.
            self._unknown(f"driver error after dispatch: {exc}")
            return
        except MalformedMessage as exc:
            self._hit("host.fork.after_provider_result")
            # Not a ForkResult (no or an unknown disposition, `accepted` without a child or a
            # binding): the provider call may have happened.
            self._unknown(f"unverifiable provider answer: {exc}")
            return
        self._hit("host.fork.after_provider_result")
        disposition, error = result.disposition, result.error or ""
        if disposition in (DeliveryDisposition.NOT_STARTED, DeliveryDisposition.REJECTED):
            self._fail(f"{disposition}: {error}")
            return
        if disposition is not DeliveryDisposition.ACCEPTED:
            self._unknown(f"{disposition}: {error}")
            return
        evidence = self._verify(result)
        if isinstance(evidence, str):
            self._unknown(f"unverifiable provider child: {evidence}")
            return
        db = self.host.store.db
        # The reply leaves as soon as the commit is durable: the commit's change events (the
        # operation, the child, the source) reach the events thread only once the waiters
        # are answered, so its read-backs do not run ahead of the reply (design/fork-saga.md,
        # step 9).
        with db.events_after():
            with db.background():
                # Not fsync'd on its own: the commit below is, and takes this row to the disk
                # with it (a killed host keeps it either way: the restart commits the child).
                op, _ = self.host.store.fork_transitions.mark_fork_provider_accepted(
                    self.host.ws,
                    self.operation.operation_id,
                    evidence,
                    durable=False,
                    known=self.operation,
                )
                self.operation = op
                self._hit("host.fork.before_commit")
                op, _ = self.host.store.fork_commit.commit_fork(self.host.ws, op.operation_id)
            self._hit("host.fork.after_commit")
            self._finish(op)

    def _verify(self, result: ForkResult) -> ProviderForkEvidence | str:
        """`accepted` is a hard gate (seed 000 §7.1): a child id alone proves nothing."""
        op = self.operation
        child, binding = result.child, result.binding
        if child is None or binding is None:  # pragma: no cover - ForkResult's own gate
            return "no child or no binding"
        child_id = child.provider_session_id
        if not child_id:
            return "no child provider session id"
        if child_id == op.source_provider_session_id:
            return "child provider session id equals the source"
        mode = binding.mode.value
        if mode != self.info.binding_mode:
            return f"binding mode {mode!r}, expected {self.info.binding_mode!r}"
        receipt = binding.receipt
        if not receipt:
            return "no binding receipt"
        child_turns = child.provider_turn_ids
        turn_bindings: dict[str, tuple[str, str | None]] | None = None
        if mode == "host_copy":
            if child.forked_from_id != op.source_provider_session_id:
                return "forkedFromId does not name the source"
            if child_turns != tuple(op.source_provider_turn_ids):
                return "child turns are not exactly the frozen provider prefix"
        else:
            raw = binding.turn_bindings
            if not raw:
                return "no turn bindings for a provider_owned child"
            by_provider_turn = self._canonical_turns_by_provider_id()
            turn_bindings = {}
            for provider_turn_id, value in raw.items():
                canonical = by_provider_turn.get(str(provider_turn_id))
                if canonical is None or not isinstance(value, Mapping):
                    return f"turn binding for unknown provider turn {provider_turn_id!r}"
                root = str(value.get("rootProviderTurnId") or "")
                if not root:
                    return f"empty child turn id for {provider_turn_id!r}"
                binding_json = value.get("bindingJson")
                turn_bindings[canonical] = (
                    root,
                    None if binding_json is None else str(binding_json),
                )
        return ProviderForkEvidence(
            child_provider_session_id=child_id,
            provider_turn_ids=child_turns,
            binding_mode=mode,
            receipt=dict(receipt),
            turn_bindings=turn_bindings,
        )

    def _dispatch_extra(self, generation: str | None) -> dict[str, Any]:
        # providerTurnBindings, lined up with providerTurnIds: lets a provider_owned driver
        # cut at a known checkpoint instead of re-reading the source transcript (seed 000 §7,
        # Claude 3). runtimeGeneration: the runtime whose verdict let this fork leave.
        extra: dict[str, Any] = {"providerTurnBindings": self._frozen_bindings()}
        if generation is not None:
            extra["runtimeGeneration"] = generation
        return extra

    def _frozen_turns(self) -> tuple[tuple[str, str | None], ...]:
        """(canonical Turn id, binding JSON) of each Turn of the frozen prefix, lined up with
        `source_provider_turn_ids`: what `prepare_fork` froze into the snapshot, carried on the
        operation it returned, so dispatch needs no full-timeline read. The timeline is
        read only if the operation came without them (never, for a saga this process began)."""
        if self.frozen is not None:
            return self.frozen
        store, ws, sid = self.host.store, self.host.ws, self.host.sid
        turns, _ = store.history.timeline(ws, sid, after_sequence=0, limit=100_000)
        by_id = {t.root_provider_turn_id: t for t in turns}
        out: list[tuple[str, str | None]] = []
        for pid in self.operation.source_provider_turn_ids:
            turn = by_id.get(pid)
            if turn is None:
                out.append(("", None))
            else:
                out.append((turn.turn_id, turn.provider_turn_binding_json))
        return tuple(out)

    def _frozen_bindings(self) -> list[str | None]:
        return [binding for _, binding in self._frozen_turns()]

    def _canonical_turns_by_provider_id(self) -> dict[str, str]:
        return {
            pid: turn_id
            for pid, (turn_id, _) in zip(
                self.operation.source_provider_turn_ids, self._frozen_turns(), strict=True
            )
            if turn_id
        }

    # -- endings -----------------------------------------------------------------------------

    def _fail(self, error: str) -> None:
        op, _ = self.host.store.fork_transitions.mark_fork_failed(
            self.host.ws, self.operation.operation_id, error
        )
        self._finish(op)

    def _unknown(self, error: str) -> None:
        op, _ = self.host.store.fork_transitions.mark_fork_unknown(
            self.host.ws, self.operation.operation_id, error
        )
        self._finish(op)

    def _abort(self, exc: Exception) -> None:
        """An unexpected error: classify by the durable status, never re-dispatch. If the
        outcome cannot be recorded either, the saga stays alive and retries the record with
        backoff, so the source's fence is released by itself and never
        held by an operation whose saga is gone."""
        store, ws, op_id = self.host.store, self.host.ws, self.operation.operation_id
        # Anything held is durable and no answer is awaited now: it goes ahead of the
        # ending's own events.
        self._in_flight = False
        self._release_held()
        try:
            op = store.fork_queries.get_fork_operation(ws, op_id)
            # The same rule as a restart (domain.fork_states.after_restart); a verified
            # provider child (`provider_accepted`) only needs its local commit.
            op = apply_restart_rule(
                store,
                op,
                prepared_error=f"host error before dispatch: {exc}",
                dispatching_error=f"host error after dispatch: {exc}",
            )
        except Exception as record_exc:  # noqa: BLE001
            # Whatever the store says, the operation is still active: the saga stays alive
            # and retries the record with backoff, never ending with the fence still held
            # (a `provider_accepted` one only has its local commit left).
            delay = self._next_delay()
            if typed_store_error(record_exc) is None and not self._abort_logged:
                self._abort_logged = True
                log.exception(
                    "fork saga %s: could not record the abort; retrying in %.2f s", op_id, delay
                )
            else:
                log.warning(
                    "fork saga %s: could not record the abort (%r); retrying in %.2f s",
                    op_id,
                    record_exc,
                    delay,
                )
            # Callers waiting now learn the operation is still running (202); fork.get sees
            # it live and does not reclassify it. Not while its prepare may still be lost.
            if not self.prepare_lazy:
                for waiter in self.waiters:
                    waiter.answer(self.operation, False)
            self.host.after(delay, lambda: self._retry_abort(exc))
            return
        self._finish(op)

    def _target_dir(self, op: ForkOperation) -> Path:
        """The target's runtime directory: the parent of the home the fork request named."""
        home = self.host.runtime_home(self.host.ws, op.target_session_id, self.runtime.provider)
        return home.parent

    def _retry_abort(self, exc: Exception) -> None:
        with self._entry():
            self._abort(exc)

    def _finish(self, op: ForkOperation) -> None:
        # Every ending is an fsync'd write (but an abort the store refused to record: the
        # saga ends and its callers are answered all the same).
        self.prepare_lazy = False
        if op.worktree is not None:
            op = end_failed_tree(self.host, op, self._hit)
        self.operation = op
        if op.status is fork_states.ForkStatus.FAILED:
            # No provider child: the directories made ahead for it are no Session's (gone
            # before the failure is answered).
            remove_empty_session_dir(self._target_dir(op))
        # The callers first: the rest is this actor's own bookkeeping, done in this same step
        # (no message of this Session, a replay included, runs before it ends).
        for waiter in self.waiters:
            waiter.answer(op, op.status in TERMINAL)
        if op.status != fork_states.ForkStatus.COMMITTED:
            # Whatever went wrong (a refused generation among it), the next fork of this
            # source starts its runtime again instead of reusing it.
            self.host.forget_warm_runtime()
        self.host.sagas.pop(op.operation_id, None)
        self.host.live_operations.discard(op.operation_id)
        if op.status in TERMINAL:  # the fence is released: late checkpoints land now
            self.host.apply_late_bindings()


# -- where a fork begins, and where a leftover one is advanced -----------------------------


def full_session_capable(
    catalog: ProviderCatalog, provider: str, context: Mapping[str, Any]
) -> bool:
    """`lifecycleCapabilities.forkFullSession` from the persisted attestation;
    a catalog that knows nothing of it is false (never inferred from forkThroughTurn)."""
    check = getattr(catalog, "fork_full_session_capable", None)
    return bool(check is not None and check(provider, context))


def start(host: ForkHost, msg: ForkCreate) -> None:
    """`fork.create` on this source: validate, prepare the runtime, then the durable prepare
    that starts a `ForkSaga` (or answers a replay / a held boundary with the original)."""
    session = host.cached_session()
    info = host.catalog.driver_info(session.provider)
    no_binder = info.binding_mode == "host_copy" and not info.binder_available
    warm = None if no_binder else host.warm_runtime(session)
    if warm is not None:
        # The runtime this Session's last fork attested is still live, unchanged and
        # its slot held: no `session.start`, and no separate replay read — `prepare_fork`
        # answers a replay or a held boundary with the original inside its own transaction
        # (the replay read below exists so a replay never waits on a runtime to start).
        # The fork carries the runtime's generation; the worker refuses it (`not_started`,
        # so `failed`, never a provider call) if that runtime is gone by then.
        try:
            _prepare(host, msg, info, warm)
        except HostError as exc:
            msg.reply(exc)
        return
    # A replay, or a new identity on a held boundary, gets the original operation
    # without touching the provider runtime (which may be down right now).
    existing = host.store.fork_prepare.existing_fork(
        host.ws,
        source_session_id=host.sid,
        request_id=msg.request_id,
        target_session_id=msg.target_session_id,
        turn_id=msg.turn_id,
        point_kind=msg.point_kind,
        workspace=msg.workspace,
    )
    if existing is not None:
        _answer_existing(host, existing, msg.reply)
        return
    if msg.workspace == "worktree" and msg.point_kind == ForkPointKind.THROUGH_TURN:
        # A Turn without its files is refused before a runtime is started for nothing (the
        # prepare checks again, in its transaction, and decides for `latestSettled`).
        try:
            record = host.store.turns.turn_checkpoint(host.ws, host.sid, msg.turn_id)
        except HostError:
            record = {"after": "unknown Turn: the prepare answers"}
        refusal = checkpoint_refusal(record, msg.turn_id)
        if refusal is not None:
            raise refusal
    if no_binder:
        # Fail closed before any operation or dispatch (seed 000 §7).
        raise ForkUnsupported(
            f"provider {session.provider!r} needs a host_copy binder and none is available"
        )

    def _prepared(runtime: PreparedRuntime | HostError) -> None:
        if isinstance(runtime, ProviderError):
            # No operation exists yet: the typed 502 of PROTOCOL.md, nothing to recover.
            msg.reply(
                ProviderError(
                    f"fork failed before any operation: {runtime.message}",
                    reason="agent_session_fork_failed",
                )
            )
            return
        if isinstance(runtime, HostError):
            msg.reply(runtime)
            return
        try:
            _prepare(host, msg, info, runtime)
        except HostError as exc:
            msg.reply(exc)
        except Exception as exc:  # noqa: BLE001 - every request gets a typed reply
            what = f"fork.create on {host.key} before any operation"
            msg.reply(host_error_of(exc, what, logger=log))

    host.prepare_runtime(session, _prepared, fork=True)


def _answer_existing(host: ForkHost, op: ForkOperation, reply: Reply) -> None:
    live = host.sagas.get(op.operation_id)
    if live is not None:
        live.join(reply)
    else:
        reply(ForkReply(op, op.status in TERMINAL))


def _prepare(host: ForkHost, msg: ForkCreate, info: DriverInfo, runtime: PreparedRuntime) -> None:
    context = dict(runtime.runtime_context)
    # Re-resolved at execution: a capability a client cached never bypasses the server.
    full = msg.point_kind == ForkPointKind.LATEST_SETTLED
    catalog = host.catalog
    capable = (
        full_session_capable(catalog, runtime.provider, context)
        if full
        else catalog.fork_through_turn_capable(runtime.provider, context)
    )
    if not capable:
        raise ForkUnsupported(
            f"session {host.sid} ({runtime.provider} "
            f"{context.get('driverVersion', '?')}) cannot fork "
            + ("the whole session" if full else "through a turn")
        )
    request = ForkPrepareRequest(
        source_session_id=host.sid,
        request_id=msg.request_id,
        target_session_id=msg.target_session_id,
        turn_id=msg.turn_id,
        point_kind=msg.point_kind,
        workspace=msg.workspace,
        driver_kind=str(context.get("driverKind") or runtime.provider),
        driver_version=str(context.get("driverVersion") or ""),
        binding_mode=info.binding_mode,
        # Env and provider target refs are dispatch-only; never frozen (seed 000 §5).
        runtime_identity={
            "cwd": runtime.cwd,
            "settings": dict(runtime.settings),
            "runtime_context": context,
        },
    )
    provider = runtime.provider
    if host.resolves:
        # A fork.resolve moving this source's provider children is under way: a new provider
        # child written next to them now could be taken for its operation's (law 9).
        running = next(iter(host.resolves))
        raise ForkInProgress(
            f"fork.resolve of operation {running} is running on this Session; fork after it ends",
            params={"operationId": running},
        )
    trees = host.fork_trees if msg.workspace == "worktree" else None
    # The warm path: no tree to make and no `runtime.attest`, so the saga goes from this
    # prepare to the fsync'd `dispatching` in this same actor step, before the caller's
    # budget can answer 202 or an event announce the operation. Its `prepared` is a lazy
    # COMMIT (in the WAL: a killed host keeps it; a power cut may lose it, and nobody heard
    # of it). Wherever something can happen first, the prepare is fsync'd on its own.
    attests = None if trees is not None else attests_again(host, runtime)
    lazy = attests is False
    # A warm fork whose runtime's verdict passes now (it is the verdict `_check_verdict` runs
    # on, unchanged until then: the same actor step) is prepared straight at `dispatching`:
    # one fsync'd transaction where there were two (a lazy `prepared`, then `dispatching`).
    # Nothing runs between the two that a crash could tell apart: a kill before that COMMIT
    # leaves no row (nothing dispatched, nobody told), after it `dispatching` (docs/design/
    # fork-saga.md, "A warm fork's prepare is its dispatching marker"). A verdict that fails
    # takes the lazy path, so the operation ends `failed` with its reason, as before.
    dispatching = (
        lazy
        and runtime.verdict is not None
        and verdict_error(
            runtime.verdict, request.driver_kind, request.driver_version, str(msg.point_kind)
        )
        is None
    )
    held: list[ChangeEvent] = []
    with host.store.db.events_after(into=held) if dispatching else nullcontext():
        op, created = host.store.fork_prepare.prepare_fork(
            host.ws,
            request,
            turn_forkable=lambda root, binding: catalog.turn_forkable(provider, root, binding),
            plan_workspace=None if trees is None else trees.plan,
            durable=not lazy or dispatching,
            dispatching=dispatching,
        )
    if not created:
        host.store.db.notify(held)  # none: a replay writes nothing
        _answer_existing(host, op, msg.reply)
        return
    saga = ForkSaga(host, op, runtime, info, prepare_lazy=lazy and not dispatching, attests=attests)
    # The prepare's change events (the operation at `dispatching`, its source) wait in the
    # saga's hold with the dispatch step's, until the provider's answer or the budget's 202.
    saga._held = held
    host.sagas[op.operation_id] = saga
    host.live_operations.add(op.operation_id)
    saga.join(msg.reply)
    saga._step(saga._after_prepare)


def end_failed_tree(
    host: ForkHost,
    op: ForkOperation,
    hit: Callable[[str], None] | None = None,
    delay: float = _RETRY_FIRST_S,
) -> ForkOperation:
    """A failed fork's tree removed and recorded `removed` (`remove_failed_tree`); the
    operation as it stands after. A record the store refused (busy, full) is retried on the
    actor with backoff until it lands: the tree is gone, and a live daemon never keeps it
    recorded `made` (law `worktree`) until a restart. A tree git cannot remove now is handed
    to the daemon's live retries (`retry_failed_tree`), which remove it once git can."""
    retry = host.retry_failed_tree
    git_failed = None
    if retry is not None and op.worktree is not None:
        path, ws, op_id = str(op.worktree.get("path", "")), op.workspace_id, op.operation_id
        git_failed = partial(retry, ws, op_id, path)
    try:
        removed = remove_failed_tree(host.store, host.fork_trees, op, hit, git_failed)
        host.tree_records.discard(op.operation_id)
        if removed:
            return host.store.fork_queries.get_fork_operation(host.ws, op.operation_id)
    except Exception as exc:  # noqa: BLE001 - a store error is retried; the caller goes on
        _retry_failed_tree(host, op.operation_id, exc, delay)
    return op


def _retry_failed_tree(host: ForkHost, op_id: str, exc: Exception, delay: float) -> None:
    if typed_store_error(exc) is None:
        host.tree_records.discard(op_id)
        log.error("fork %s: recording its removed tree failed: %r", op_id, exc)
        return  # not the store's contention: start-up recovery tries again
    log.warning("fork %s: recording its removed tree deferred %.2f s: %r", op_id, delay, exc)
    host.tree_records.add(op_id)
    then = min(_RETRY_MAX_S, delay * 2)

    def again() -> None:
        try:
            op = host.store.fork_queries.get_fork_operation(host.ws, op_id)
        except Exception as read_exc:  # noqa: BLE001 - retried as the record is
            _retry_failed_tree(host, op_id, read_exc, then)
            return
        end_failed_tree(host, op, delay=then)

    host.after(delay, again)


def advance_leftover(host: ForkHost, msg: ForkAdvance) -> None:
    """`fork.get` on a non-terminal operation: advance `provider_accepted → committed`;
    an operation no saga of this process owns is a leftover of a dead process:
    `prepared → failed`, `dispatching → unknown` (never a live one; no provider call)."""
    op = host.store.fork_queries.get_fork_operation(host.ws, msg.operation_id)
    if op.operation_id in host.live_operations:
        msg.reply(ForkReply(op, False))
        return
    # The restart rule (domain.fork_states.after_restart); never a provider call.
    op = apply_restart_rule(host.store, op)
    if op.worktree is not None:
        op = end_failed_tree(host, op)
    if op.status in TERMINAL:
        host.apply_late_bindings()
    msg.reply(ForkReply(op, op.status in TERMINAL))
