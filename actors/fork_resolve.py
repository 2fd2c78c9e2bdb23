"""`fork.resolve`: settle an `unknown` fork operation with evidence, inside the
source Session's actor (serialised with its other mutations, like the saga).

- `inspect`: ask the provider's worker which children this operation left (never calls the
  provider's fork) → evidence + verdict `adoptable` | `absent` | `ambiguous`.
- `adopt` (only `adoptable`): durable begin → worker `fork.adopt` (the idempotent binder, then
  proof the child reads from its own home) → `unknown → provider_accepted` with the evidence
  → the ordinary commit from the frozen snapshot → `committed` (the barrier waits for ACK).
- `abandon`: durable begin → worker `fork.quarantine` (children moved aside, never deleted) →
  `abandoned`, releasing the barrier and the target reservation.

Failpoints `host.resolve.after_begin`, `host.resolve.after_bind`, `host.resolve.after_accept`,
`host.resolve.after_quarantine`, `host.resolve.after_finish`. Start-up recovery
(`Store.recover_fork_resolutions`, after the fork recovery that commits `provider_accepted`)
finishes a resolution whose operation moved on and rolls back one whose operation is still
`unknown`. A second adopt/abandon of the same operation while one runs gets 409
`agent_session_fork_resolve_in_progress`; the same request again waits for the winner's result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from actors.context import runtime_key
from actors.fork_host import ForkHost
from actors.messages import Reply
from actors.runtime_dirs import remove_empty_session_dir
from domain.enums import DeliveryDisposition
from domain.errors import (
    ForkEvidenceUnreadable,
    ForkInProgress,
    ForkResolveConflict,
    ForkResolveInProgress,
    HostError,
    InvalidArgument,
    ProviderError,
)
from domain.fork_states import ForkStatus
from domain.worker_messages import (
    ForkResult,
    ForkSource,
    ForkTarget,
    MalformedMessage,
    ResolveAdopt,
    ResolvedChild,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from storage.models import ForkOperation, ProviderForkEvidence
from storage.sqlite import host_error_of

log = logging.getLogger(__name__)

ACTIONS = ("inspect", "adopt", "abandon")

_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class ForkResolve:
    operation_id: str
    request_id: str
    action: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class ResolveReply:
    operation: ForkOperation
    evidence: Mapping[str, Any] | None


@dataclass(eq=False)
class _InFlight:
    request_id: str
    action: str
    waiters: list[Reply] = field(default_factory=list)


def verdict(children: Sequence[ResolvedChild], source_id: str) -> str:
    """`adoptable`: exactly one child, verified (lineage names the source and its turns are
    exactly the frozen prefix); `absent`: none; `ambiguous`: anything else."""
    if not children:
        return "absent"
    if len(children) == 1:
        child = children[0]
        if child.forked_from_id == source_id and child.turns_equal_prefix:
            return "adoptable"
    return "ambiguous"


def _in_flight(host: ForkHost) -> dict[str, _InFlight]:
    return host.resolves


class ForkResolver:
    """One resolution on the actor thread; every continuation comes back as a FollowUp."""

    def __init__(self, host: ForkHost, op: ForkOperation, msg: ForkResolve) -> None:
        self.host = host
        self.op = op
        self.msg = msg
        # The adopt moved the operation to `provider_accepted`: only its commit is left.
        self.accepted = False
        self._retry_delay = _RETRY_FIRST_S
        self.provider = host.session().provider
        self.info = host.catalog.driver_info(self.provider)

    # -- entry --------------------------------------------------------------------------------

    @staticmethod
    def start(host: ForkHost, msg: ForkResolve) -> None:
        if msg.action not in ACTIONS:
            raise InvalidArgument("action", "'action' must be inspect, adopt or abandon")
        store = host.resolve_store
        op = store.fork_queries.get_fork_operation(host.ws, msg.operation_id)
        if op.source_session_id != host.sid:  # pragma: no cover - routed by the source
            raise InvalidArgument("operationId", "operation of another Session")
        live = [op_id for op_id in host.sagas if op_id != op.operation_id]
        if live:
            # A running fork of this source may be writing its provider child next to the
            # source right now: evidence read or moved meanwhile could take its child (law 9).
            raise ForkInProgress(
                f"a fork of this Session is running (operation {live[0]}); resolve after it ends",
                params={"operationId": live[0]},
            )
        resolver = ForkResolver(host, op, msg)
        if msg.action == "inspect":
            resolver._inspect(lambda ev: msg.reply(ResolveReply(resolver._current(), ev)))
            return
        table = _in_flight(host)
        running = table.get(op.operation_id)
        if running is not None:
            if (running.request_id, running.action) == (msg.request_id, msg.action):
                running.waiters.append(msg.reply)
                return
            raise ForkResolveInProgress(
                f"fork operation {op.operation_id} is being resolved by request"
                f" {running.request_id}",
                params={"operationId": op.operation_id, "action": running.action},
            )
        previous = store.resolution.get_fork_resolution(host.ws, op.operation_id)
        if previous is not None and previous.state == "started":
            # No resolve of it runs in this daemon (the table above): its own rollback or
            # finish met a busy store. Ended now as start-up would end it, or every later
            # resolve would be refused "being resolved" until a restart.
            store.resolution.end_stale_resolution(host.ws, op.operation_id)
            previous = store.resolution.get_fork_resolution(host.ws, op.operation_id)
            op = store.fork_queries.get_fork_operation(host.ws, msg.operation_id)
            resolver = ForkResolver(host, op, msg)
        if (
            previous is not None
            and previous.state == "done"
            and (previous.request_id, previous.action) == (msg.request_id, msg.action)
        ):
            msg.reply(ResolveReply(op, previous.evidence))  # a replay of the winner
            return
        if op.status is not ForkStatus.UNKNOWN and previous is None:
            raise ForkResolveConflict(
                f"fork operation {op.operation_id} is {op.public_status}; only unknown is resolved",
                params={"operationId": op.operation_id, "status": op.public_status.value},
            )
        table[op.operation_id] = _InFlight(msg.request_id, msg.action, [msg.reply])
        resolver._inspect(lambda ev: resolver._guard(resolver._decide, ev))

    # -- steps --------------------------------------------------------------------------------

    def _current(self) -> ForkOperation:
        return self.host.resolve_store.fork_queries.get_fork_operation(
            self.host.ws, self.op.operation_id
        )

    def _request(self, child_ids: Sequence[str] = ()) -> ResolveRequest:
        ws, op = self.host.ws, self.op
        claimed = self.host.resolve_store.resolution.claimed_provider_children(ws, self.host.sid)
        others = self.host.resolve_store.resolution.other_fork_prefixes(
            ws, self.host.sid, op.operation_id
        )
        return ResolveRequest(
            operation_id=op.operation_id,
            source=ForkSource(
                agent_session_id=self.host.key,
                provider_session_id=op.source_provider_session_id,
                home=str(self.host.runtime_home(ws, self.host.sid, self.provider)),
                cwd=self.host.session().cwd,
            ),
            target=ForkTarget(
                agent_session_id=runtime_key(ws, op.target_session_id),
                home=str(self.host.runtime_home(ws, op.target_session_id, self.provider)),
                cwd=None if op.worktree is None else str(op.worktree["childCwd"]),
            ),
            provider_turn_ids=tuple(op.source_provider_turn_ids),
            exclude_child_ids=tuple(c for c in claimed if c != op.target_provider_session_id),
            title=op.target_title,
            # What a provider_owned driver needs to re-verify a child as its fork would.
            provider_turn_bindings=self._frozen_bindings(),
            driver_kind=op.driver_kind,
            driver_version=op.driver_version,
            other_prefixes=tuple(others),
            child_ids=tuple(child_ids),
        )

    def _frozen_bindings(self) -> tuple[str | None, ...]:
        store, ws, sid = self.host.resolve_store, self.host.ws, self.host.sid
        turns, _ = store.history.timeline(ws, sid, after_sequence=0, limit=100_000)
        by_id = {t.root_provider_turn_id: t.provider_turn_binding_json for t in turns}
        return tuple(by_id.get(pid) for pid in self.op.source_provider_turn_ids)

    def _worker(
        self,
        method: str,
        then: Callable[[Any], None],
        child_ids: Sequence[str] = (),
    ) -> None:
        """`fork.inspect` or `fork.quarantine` (`method`), its typed answer handed to `then`."""

        def call() -> Future[Any]:
            request, timeout = self._request(child_ids), self.host.timeouts.fork_s
            if method == ResolveRequest.INSPECT:
                return self.host.workers.inspect_fork(self.provider, request, timeout)
            return self.host.workers.quarantine_fork(self.provider, request, timeout)

        def done(f: Future[Any]) -> None:
            try:
                result = f.result()
            except HostError as exc:
                self._error(
                    ProviderError(f"{method} failed: {exc.message}", reason="fork_resolve_failed")
                )
                return
            except Exception as exc:  # noqa: BLE001 - the worker died or never answered
                self._error(ProviderError(f"{method} failed: {exc}", reason="fork_resolve_failed"))
                return
            self._guard(then, result)

        self._on_homes(call, done, self._error)

    def _on_homes(
        self,
        call: Callable[[], Future[Any]],
        done: Callable[[Future[Any]], None],
        fail: Callable[[HostError], None],
    ) -> None:
        """`call` (a worker call reading the source's and the target's provider homes, where
        it may start an app-server) once neither Session's runtime folder is being removed by
        a delete, and no removal of them while it runs (actors/home_uses); `done` on this
        actor once it has answered, `fail` if it could not be sent. The actor stays busy
        from here to then (`home_call_ended`), held for a removal or not."""
        sids = (self.host.sid, self.op.target_session_id)

        def go() -> None:
            try:
                fut = call()
            except Exception as exc:  # noqa: BLE001 - the use ends, the caller is answered
                self.host.homes_done(sids)
                self.host.home_call_ended()
                fail(host_error_of(exc, f"fork.resolve of {self.op.operation_id}", logger=log))
                return
            fut.add_done_callback(lambda _f: self.host.homes_done(sids))

            def answered(f: Future[Any]) -> None:
                self.host.home_call_ended()
                done(f)

            self.host.later(fut, answered)

        self.host.use_homes(sids, go)

    def _guard(self, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        except HostError as exc:
            self._error(exc)
        except Exception as exc:  # noqa: BLE001
            self._error(host_error_of(exc, f"fork.resolve of {self.op.operation_id}", logger=log))

    def _hit(self, name: str) -> None:
        failpoints = self.host.failpoints
        if failpoints.armed:  # a field read: nothing armed, no call into the registry
            failpoints.hit(name)

    def _inspect(self, then: Callable[[dict[str, Any]], None]) -> None:
        def shape(inspection: ResolveInspection) -> None:
            evidence = {
                **inspection.to_wire(),
                "verdict": verdict(inspection.children, self.op.source_provider_session_id),
            }
            then(evidence)

        if self.msg.action == "inspect":
            # Inspect is a read: its errors go straight to its caller.
            def call() -> Future[Any]:
                return self.host.workers.inspect_fork(
                    self.provider, self._request(), self.host.timeouts.fork_s
                )

            def done(f: Future[ResolveInspection]) -> None:
                try:
                    shape(f.result())
                except HostError as exc:
                    self.msg.reply(exc)
                except Exception as exc:  # noqa: BLE001
                    self.msg.reply(
                        ProviderError(f"fork.inspect failed: {exc}", reason="fork_resolve_failed")
                    )

            self._on_homes(call, done, self.msg.reply)
            return
        self._worker(ResolveRequest.INSPECT, shape)

    def _decide(self, evidence: dict[str, Any]) -> None:
        store, ws, msg = self.host.resolve_store, self.host.ws, self.msg
        op_id = self.op.operation_id
        if msg.action == "adopt" and evidence["verdict"] != "adoptable":
            raise ForkResolveConflict(
                f"fork operation {op_id} is not adoptable ({evidence['verdict']})",
                params={"operationId": op_id, "verdict": evidence["verdict"]},
            )
        if msg.action == "abandon":
            undecided = [
                str(c["providerSessionId"])
                for c in evidence["children"]
                if c.get("readError") or not (c.get("providerTurnIds") or c.get("turnsEqualPrefix"))
            ]
            if undecided and store.resolution.other_fork_prefixes(ws, self.host.sid, op_id):
                # Law 9: a child whose Turns cannot be read now may be another operation's;
                # moving it would take that operation's evidence. Retry once it reads.
                raise ForkEvidenceUnreadable(
                    f"provider child(ren) {', '.join(undecided)} of this source cannot be read"
                    " now and may belong to another fork of it; abandon again once they read",
                    params={"operationId": op_id, "children": undecided},
                )
        child = evidence["children"][0]["providerSessionId"] if msg.action == "adopt" else None
        store.resolution.begin_resolution(
            ws,
            op_id,
            request_id=msg.request_id,
            action=msg.action,
            child_id=child,
            evidence=evidence,
        )
        self.evidence = evidence
        self._hit("host.resolve.after_begin")
        if msg.action == "adopt":
            self.child_id = str(child)
            params_child = self.child_id
            self._adopt_call(params_child)
        else:
            attributed = [str(c["providerSessionId"]) for c in evidence["children"]]
            self._worker(ResolveRequest.QUARANTINE, self._quarantined, attributed)

    def _adopt_call(self, child: str) -> None:
        def call() -> Future[Any]:
            return self.host.workers.adopt_fork(
                self.provider, ResolveAdopt(self._request(), child), self.host.timeouts.fork_s
            )

        def done(f: Future[ForkResult]) -> None:
            result: ForkResult | None
            try:
                result = f.result()
            except MalformedMessage:
                result = None  # not a fork answer: nothing verified was bound
            except HostError as exc:
                self._rollback(ProviderError(exc.message, reason="fork_resolve_failed"))
                return
            except Exception as exc:  # noqa: BLE001
                self._rollback(ProviderError(str(exc), reason="fork_resolve_failed"))
                return
            self._guard(self._bound, result)

        self._on_homes(call, done, self._rollback)

    def _bound(self, adopted: ForkResult | None) -> None:
        self._hit("host.resolve.after_bind")
        store, ws, op = self.host.resolve_store, self.host.ws, self.op
        if (
            adopted is None
            or adopted.disposition is not DeliveryDisposition.ACCEPTED
            or adopted.child is None
            or adopted.binding is None
            or adopted.child.provider_session_id != self.child_id
        ):
            self._rollback(ProviderError("adopt did not bind the inspected child"))
            return
        child, binding = adopted.child, adopted.binding
        raw = binding.turn_bindings
        turn_bindings = None
        if isinstance(raw, Mapping):
            turns, _ = store.history.timeline(ws, self.host.sid, after_sequence=0, limit=100_000)
            by_provider = {
                t.root_provider_turn_id: t.turn_id for t in turns if t.root_provider_turn_id
            }
            turn_bindings = {
                by_provider[str(k)]: (
                    str(v.get("rootProviderTurnId")),
                    None if v.get("bindingJson") is None else str(v.get("bindingJson")),
                )
                for k, v in raw.items()
                if str(k) in by_provider and isinstance(v, Mapping)
            }
        evidence = ProviderForkEvidence(
            child_provider_session_id=self.child_id,
            provider_turn_ids=child.provider_turn_ids,
            binding_mode=binding.mode.value,
            receipt=dict(binding.receipt),
            turn_bindings=turn_bindings,
        )
        store.resolution.adopt_unknown_fork(ws, op.operation_id, evidence)
        # `provider_accepted` now fences the source: from here the resolution only ends by
        # committing, however long the store refuses it (never rolled back, never dropped).
        self.accepted = True
        self._hit("host.resolve.after_accept")
        self._commit_adopted()

    def _commit_adopted(self) -> None:
        """The adopted child's local commit, retried with backoff until it lands: an operation
        is never left `provider_accepted` (its source fenced) in a live daemon."""
        op_id = self.op.operation_id
        try:
            self.host.resolve_store.fork_commit.commit_fork(self.host.ws, op_id)
        except Exception as exc:  # noqa: BLE001 - only the commit is left: it is retried
            self._commit_later(repr(exc))
            return
        done = {"action": "adopt", "childId": self.child_id, "evidence": self.evidence}
        self._guard(self._finish, done)

    def _commit_later(self, why: str) -> None:
        delay = self._retry_delay
        self._retry_delay = min(_RETRY_MAX_S, delay * 2)
        log.warning("fork.resolve %s: commit deferred %.2f s: %s", self.op.operation_id, delay, why)
        self.host.after(delay, self._commit_adopted)

    def _quarantined(self, result: ResolveQuarantined) -> None:
        self._hit("host.resolve.after_quarantine")
        moved = list(result.moved)
        evidence = {**self.evidence, "quarantinedNow": moved}
        self.evidence = evidence
        self.host.resolve_store.resolution.abandon_fork(
            self.host.ws, self.op.operation_id, {"action": "abandon", "evidence": evidence}
        )
        # The target's directories made ahead for a child no Session will own; a quarantined
        # child there keeps them.
        remove_empty_session_dir(
            self.host.runtime_home(self.host.ws, self.op.target_session_id, self.provider).parent
        )
        self._finish(None)

    # -- endings ------------------------------------------------------------------------------

    def _finish(self, result: Any) -> None:
        store, ws, op_id = self.host.resolve_store, self.host.ws, self.op.operation_id
        if result is not None:
            store.resolution.finish_resolution(ws, op_id, result)
        self._hit("host.resolve.after_finish")
        self._answer(ResolveReply(self._current(), self.evidence))

    def _rollback(self, error: HostError) -> None:
        """The worker step failed: the operation is still `unknown`; let a new resolve start."""
        try:
            self.host.resolve_store.resolution.rollback_resolution(
                self.host.ws, self.op.operation_id
            )
        except HostError as exc:  # the next resolve (or start-up) ends it otherwise
            log.warning(
                "could not roll back resolution of %s: %s", self.op.operation_id, exc.message
            )
        except Exception:  # noqa: BLE001 - the next resolve (or start-up) ends it otherwise
            log.exception("could not roll back resolution of %s", self.op.operation_id)
        self._answer(error)

    def _error(self, error: HostError) -> None:
        if self.accepted:
            # After the accept nothing is rolled back: the commit is retried until it lands.
            self._commit_later(error.message)
            return
        current = self.host.resolve_store.resolution.get_fork_resolution(
            self.host.ws, self.op.operation_id
        )
        if (
            current is not None
            and current.state == "started"
            and current.request_id == self.msg.request_id
        ):
            self._rollback(error)
        else:
            self._answer(error)

    def _answer(self, outcome: Any) -> None:
        if self.msg.action == "inspect":
            self.msg.reply(outcome)
            return
        running = _in_flight(self.host).pop(self.op.operation_id, None)
        for reply in running.waiters if running is not None else [self.msg.reply]:
            reply(outcome)
