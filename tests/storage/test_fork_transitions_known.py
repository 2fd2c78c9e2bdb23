"""A saga's status moves on the row it already holds: one guarded UPDATE each, no read of the
operation row first, the same answer as the reading path, and a stale copy still answered
from the row."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import apsw
import pytest
from store_builders import WS, new_session, settled_turn

from domain.errors import ForkEvidenceRejected, InvalidTransition
from domain.fork_states import ForkStatus
from storage.models import ForkOperation, ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store

pytestmark = pytest.mark.timeout(30)


class OpReads:
    """SELECTs of `fork_operations` the store's connections run while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.reads = 0
        self.updates = 0

    def hook(self, conn: apsw.Connection) -> None:
        conn.exec_trace = self._exec

    def _exec(self, cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if self.on and "fork_operations" in sql:
            head = sql.lstrip().upper()
            self.reads += head.startswith("SELECT")
            self.updates += head.startswith("UPDATE")
        return True


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[tuple[Store, OpReads]]:
    counter = OpReads()
    apsw.connection_hooks.append(counter.hook)
    try:
        store = Store.open(tmp_path / "store.db")
        try:
            yield store, counter
        finally:
            store.close()
    finally:
        apsw.connection_hooks.remove(counter.hook)


def _prepared(store: Store) -> ForkOperation:
    sid = new_session(store, title="src")
    turns = [
        settled_turn(store, sid, text=f"t{i}", provider_turn_id=f"p{i}").turn_id for i in (1, 2)
    ]
    op, created = store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id=f"req-{uuid.uuid4()}",
            target_session_id=str(uuid.uuid4()),
            turn_id=turns[-1],
            driver_kind="tutti-agent",
            driver_version="0.0.10",
            binding_mode="host_copy",
            runtime_identity={},
        ),
    )
    assert created and op.status is ForkStatus.PREPARED
    return op


def _evidence(op: ForkOperation, **over: Any) -> ProviderForkEvidence:
    fields: dict[str, Any] = {
        "child_provider_session_id": f"child-{op.operation_id}",
        "provider_turn_ids": op.source_provider_turn_ids,
        "binding_mode": op.binding_mode,
        "receipt": {"forkedFromId": op.source_provider_session_id, "sha256": "ab"},
        "turn_bindings": None,
    }
    fields.update(over)
    return ProviderForkEvidence(**fields)


def test_known_row_moves_with_one_update_and_no_read(counted: tuple[Store, OpReads]) -> None:
    store, counter = counted
    op = _prepared(store)
    moves = store.fork_transitions
    counter.on = True
    dispatching, changed = moves.mark_fork_dispatching(WS, op.operation_id, known=op)
    assert changed and (counter.reads, counter.updates) == (0, 1)
    accepted, changed = moves.mark_fork_provider_accepted(
        WS, op.operation_id, _evidence(op), durable=False, known=dispatching
    )
    assert changed and (counter.reads, counter.updates) == (0, 2)
    counter.on = False
    # The answers are the rows as a read returns them.
    assert accepted == store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert dispatching.status is ForkStatus.DISPATCHING
    assert dispatching.dispatched_at_ms == accepted.dispatched_at_ms


def test_stale_known_row_is_answered_from_the_row(counted: tuple[Store, OpReads]) -> None:
    store, _ = counted
    op = _prepared(store)
    moves = store.fork_transitions
    dispatching, _ = moves.mark_fork_dispatching(WS, op.operation_id)
    # A repeat on a copy still at `prepared`: no second move, the row's own answer.
    again, changed = moves.mark_fork_dispatching(WS, op.operation_id, known=op)
    assert not changed and again == dispatching
    accepted, _ = moves.mark_fork_provider_accepted(WS, op.operation_id, _evidence(op))
    # A copy still at `dispatching`: the same evidence is a repeat, another child a conflict.
    same, changed = moves.mark_fork_provider_accepted(
        WS, op.operation_id, _evidence(op), known=dispatching
    )
    assert not changed and same == accepted
    with pytest.raises(InvalidTransition):
        moves.mark_fork_provider_accepted(
            WS, op.operation_id, _evidence(op, child_provider_session_id="other"), known=dispatching
        )
    with pytest.raises(InvalidTransition):
        moves.mark_fork_dispatching(WS, op.operation_id, known=op)  # accepted → dispatching
    assert store.fork_queries.get_fork_operation(WS, op.operation_id) == accepted


def test_known_row_still_checks_the_evidence(counted: tuple[Store, OpReads]) -> None:
    store, _ = counted
    op = _prepared(store)
    moves = store.fork_transitions
    dispatching, _ = moves.mark_fork_dispatching(WS, op.operation_id, known=op)
    with pytest.raises(ForkEvidenceRejected):
        moves.mark_fork_provider_accepted(
            WS,
            op.operation_id,
            _evidence(op, child_provider_session_id=op.source_provider_session_id),
            known=dispatching,
        )
    row = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert row.status is ForkStatus.DISPATCHING and row == dispatching


@pytest.mark.parametrize(
    "value",
    [
        ["t1", "t2", "ü"],
        (),
        {"b": "x", "a": 1, "c": None, "d": True},
        {"z": 1.5, "a": "x"},
        {"nested": {"b": 1, "a": [1, (2, 3)]}, "a": "x"},
        {"a": (1, 2)},
        [1.0, "x"],
        [True, None, 10**30],
    ],
)
def test_the_accepted_row_is_what_a_read_decodes(value: Any) -> None:
    """`provider_accepted`'s row is built without a re-read: each JSON column as the read
    would give it back, equal and in the same key order."""
    from storage.fork_transitions import _as_read
    from storage.sqlite import dumps, loads

    built, read = _as_read(value), loads(dumps(value))
    assert built == read and type(built) is type(read)
    if isinstance(read, dict):
        assert list(built) == list(read)
        assert all(type(built[k]) is type(read[k]) for k in read)


def test_the_commit_and_the_ack_build_their_operation_once(
    counted: tuple[Store, OpReads], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed row and the ACKed row are each decoded once as written, not decoded and
    then copied by `dataclasses.replace` (two `ForkOperation`s each before forkprof's cut),
    and each answer is the row a read returns."""
    store, _ = counted
    op = _prepared(store)
    moves = store.fork_transitions
    dispatching, _ = moves.mark_fork_dispatching(WS, op.operation_id, known=op)
    moves.mark_fork_provider_accepted(WS, op.operation_id, _evidence(op), known=dispatching)
    built: list[str] = []
    init = ForkOperation.__init__

    def counting(self: ForkOperation, *args: Any, **kwargs: Any) -> None:
        built.append(kwargs.get("status", args[19] if len(args) > 19 else "?"))
        init(self, *args, **kwargs)

    monkeypatch.setattr(ForkOperation, "__init__", counting)
    committed, changed = store.fork_commit.commit_fork(WS, op.operation_id)
    assert changed and built == [ForkStatus.COMMITTED]
    built.clear()
    acked, changed = moves.acknowledge_fork(WS, op.operation_id)
    assert changed and built == [ForkStatus.COMMITTED]
    monkeypatch.setattr(ForkOperation, "__init__", init)
    assert committed == replace(
        store.fork_queries.get_fork_operation(WS, op.operation_id), client_observed_at_ms=None
    )
    assert acked.client_observed_at_ms is not None
    assert acked == store.fork_queries.get_fork_operation(WS, op.operation_id)
    again, changed = moves.acknowledge_fork(WS, op.operation_id)
    assert not changed and again == acked


@pytest.mark.parametrize(
    "receipt",
    [
        {"forkedFromId": "src", "proof": {"sha256": "ab", "lines": [1, (2, 3)]}, "n": 1.5},
        {"forkedFromId": "src", "sha256": "ab"},
    ],
)
def test_the_accepted_receipt_is_dumped_once(
    counted: tuple[Store, OpReads], monkeypatch: pytest.MonkeyPatch, receipt: dict[str, Any]
) -> None:
    """`provider_accepted` from the saga's row dumps the evidence's receipt once, for the row it
    writes, and builds its answer's receipt from that same text (forkhops: a nested receipt was
    dumped again for `_as_read`'s round trip); the answer is still the row a read returns."""
    import storage.fork_transitions as transitions

    store, _ = counted
    op = _prepared(store)
    moves = store.fork_transitions
    dispatching, _ = moves.mark_fork_dispatching(WS, op.operation_id, known=op)
    receipt = {**receipt, "forkedFromId": op.source_provider_session_id}
    dumped: list[Any] = []
    real = transitions.dumps

    def counting(value: Any) -> str:
        dumped.append(value)
        return real(value)

    monkeypatch.setattr(transitions, "dumps", counting)
    accepted, changed = moves.mark_fork_provider_accepted(
        WS, op.operation_id, _evidence(op, receipt=receipt), durable=False, known=dispatching
    )
    assert changed
    assert sum(1 for value in dumped if value == receipt) == 1
    monkeypatch.setattr(transitions, "dumps", real)
    read = store.fork_queries.get_fork_operation(WS, op.operation_id)
    assert accepted == read
    assert list(accepted.binding_receipt) == list(read.binding_receipt)
