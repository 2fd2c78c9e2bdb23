"""Where a fork begins and where a leftover one is advanced, on the source's SessionActor:
`fork.create` validated, the provider runtime prepared, the durable prepare that fences the
source and starts a `ForkSaga` (or answers a replay / a held boundary with the original); and
`fork.get` of an operation no saga of this process owns (the restart rule, never a provider
call)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from actors.fork_host import ForkHost, PreparedRuntime
from actors.fork_saga import TERMINAL, ForkSaga, attests_again
from actors.fork_workspace import remove_failed_tree
from actors.messages import ForkAdvance, ForkCreate, ForkReply, Reply
from actors.ports import (
    DriverInfo,
    ProviderCatalog,
)
from actors.recovery import apply_restart_rule
from domain.errors import (
    ForkInProgress,
    ForkUnsupported,
    HostError,
    ProviderError,
    checkpoint_refusal,
)
from storage.models import (
    ForkOperation,
    ForkPointKind,
    ForkPrepareRequest,
)
from storage.sqlite import host_error_of

log = logging.getLogger(__name__)


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
    lazy = trees is None and not attests_again(host, runtime)
    op, created = host.store.fork_prepare.prepare_fork(
        host.ws,
        request,
        turn_forkable=lambda root, binding: catalog.turn_forkable(provider, root, binding),
        plan_workspace=None if trees is None else trees.plan,
        durable=not lazy,
    )
    if not created:
        _answer_existing(host, op, msg.reply)
        return
    saga = ForkSaga(host, op, runtime, info, prepare_lazy=lazy)
    host.sagas[op.operation_id] = saga
    host.live_operations.add(op.operation_id)
    saga.join(msg.reply)
    saga._step(saga._after_prepare)


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
    if op.worktree is not None and remove_failed_tree(host.store, host.fork_trees, op):
        op = host.store.fork_queries.get_fork_operation(host.ws, op.operation_id)
    if op.status in TERMINAL:
        host.apply_late_bindings()
    msg.reply(ForkReply(op, op.status in TERMINAL))
