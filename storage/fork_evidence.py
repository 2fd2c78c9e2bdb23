"""Seed 000 §7: the provider evidence that moves an operation to `provider_accepted`, its
validation, and the one write that records it (the saga's dispatch and `fork.resolve`'s adopt)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.enums import ProviderStateBindingMode
from domain.errors import ForkEvidenceRejected
from domain.fork_states import ForkStatus
from storage.models import ForkOperation, ForkOperationChanged, ProviderForkEvidence
from storage.sqlite import Tx, dumps


def record_accepted(
    tx: Tx, ws: str, op_id: str, evidence: ProviderForkEvidence, *, from_status: ForkStatus
) -> None:
    """Writes `from_status → provider_accepted` with the provider's evidence (the saga's
    dispatch, or `fork.resolve` adopting an `unknown` operation, which also clears its outcome)."""
    bindings = None
    if evidence.turn_bindings is not None:
        bindings = {k: [v[0], v[1]] for k, v in evidence.turn_bindings.items()}
    clear = ", error = NULL, completed_at_ms = NULL" if from_status is ForkStatus.UNKNOWN else ""
    tx.execute(
        "UPDATE fork_operations SET status = 'provider_accepted', accepted_at_ms = ?,"
        " target_provider_session_id = ?, target_provider_turn_ids = ?,"
        f" target_turn_bindings = ?, binding_receipt = ?{clear}"
        " WHERE workspace_id = ? AND operation_id = ? AND status = ?",
        (
            tx.now_ms,
            evidence.child_provider_session_id,
            dumps(list(evidence.provider_turn_ids)),
            None if bindings is None else dumps(bindings),
            dumps(dict(evidence.receipt)),
            ws,
            op_id,
            from_status.value,
        ),
    )
    tx.emit(ForkOperationChanged(ws, op_id))


def validate_evidence(op: ForkOperation, ev: ProviderForkEvidence) -> None:
    """Seed 000 §7: `accepted` only with typed evidence that proves an independent child."""

    def reject(why: str) -> None:
        raise ForkEvidenceRejected(f"provider evidence rejected: {why}", params={"why": why})

    if not ev.child_provider_session_id:
        reject("no child provider session id")
    if ev.child_provider_session_id == op.source_provider_session_id:
        reject("child provider session id equals the source")
    if ev.binding_mode != op.binding_mode:
        reject(f"binding mode {ev.binding_mode!r} differs from frozen {op.binding_mode!r}")
    if not isinstance(ev.receipt, Mapping) or not ev.receipt:
        reject("no binding receipt")
    forked_from = receipt_forked_from(ev.receipt)
    if forked_from is not None and forked_from != op.source_provider_session_id:
        reject("receipt forkedFromId does not name the source provider session")
    if ev.binding_mode == ProviderStateBindingMode.HOST_COPY:
        if tuple(ev.provider_turn_ids) != op.source_provider_turn_ids:
            reject("child provider turns are not exactly the frozen ordered prefix")
    else:
        if not ev.turn_bindings or op.source_turn_id not in ev.turn_bindings:
            reject("provider_owned evidence lacks a binding for the selected turn")
    for source_turn, value in (ev.turn_bindings or {}).items():
        if (
            not isinstance(value, (tuple, list))
            or len(value) != 2
            or not isinstance(value[0], str)
            or not value[0]
            or not (value[1] is None or isinstance(value[1], str))
        ):
            reject(f"malformed binding for turn {source_turn!r}")


def receipt_forked_from(receipt: Mapping[str, Any]) -> str | None:
    for key in ("forkedFromId", "forked_from_id", "sourceProviderSessionId"):
        value = receipt.get(key)
        if isinstance(value, str):
            return value
    return None
