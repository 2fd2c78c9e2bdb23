"""Helpers that build realistic canonical histories through the public store API only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw

from domain.fork_states import ForkStatus, holds_barrier, stage_of
from storage.models import Turn
from storage.schema import SCHEMA_VERSION, migrate
from storage.store import Store

WS = "ws-test"

TRANSACTION_STATEMENTS = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK", "PRAGMA")
"""The statements of a transaction's own (and the lazy write's `PRAGMA synchronous`)."""


@contextmanager
def writer_statements(store: Store, *, skip: tuple[str, ...] = ()) -> Iterator[list[str]]:
    """The statements the store's writer connection runs inside the block, each on one line,
    but those whose first word is in `skip` (e.g. `TRANSACTION_STATEMENTS`)."""
    conn = store.db._writer_connection()
    ran: list[str] = []

    def trace(_cursor: object, sql: str, _bindings: object) -> bool:
        if not skip or sql.split(None, 1)[0].upper() not in skip:
            ran.append(" ".join(sql.split()))
        return True

    conn.exec_trace = trace
    try:
        yield ran
    finally:
        conn.exec_trace = None


def new_session(
    store: Store,
    ws: str = WS,
    *,
    title: str = "Task",
    provider_session_id: str | None = "prov-src",
    session_id: str | None = None,
    provider: str = "tutti-agent",
) -> str:
    sid = session_id or str(uuid.uuid4())
    store.sessions.create_session(
        ws, session_id=sid, provider=provider, title=title, cwd="/work", settings={"m": 1}
    )
    if provider_session_id is not None:
        store.sessions.update_runtime(
            ws,
            sid,
            provider_session_id=provider_session_id,
            runtime_context={"driverKind": provider, "driverVersion": "0.0.10"},
        )
    return sid


def settled_turn(
    store: Store,
    sid: str,
    ws: str = WS,
    *,
    text: str = "hello",
    provider_turn_id: str | None = None,
    extra: list[tuple[str, str, dict[str, Any]]] | None = None,
    outcome: str = "completed",
    binding_json: str | None = None,
) -> Turn:
    """A Turn through claim, bind, assistant reply and settle, as the actors will write it."""
    turn, _ = store.turns.claim_submit(ws, sid, str(uuid.uuid4()), text)
    store.turns.bind_provider_turn(
        ws, sid, turn.turn_id, provider_turn_id or f"pt-{uuid.uuid4().hex[:8]}", binding_json
    )
    for kind, body, payload in extra or []:
        store.history.append_message(ws, sid, turn.turn_id, kind=kind, text=body, payload=payload)
    reply = store.history.append_message(
        ws, sid, turn.turn_id, kind="assistant", text=f"echo: {text}"
    )
    settled, _ = store.turns.settle_turn(
        ws, sid, turn.turn_id, outcome=outcome, final_assistant_message_id=reply.message_id
    )
    return settled


def fork_evidence(op: Any) -> Any:
    """A verified provider child for `op`: its turns are exactly the frozen prefix."""
    from storage.models import ProviderForkEvidence

    return ProviderForkEvidence(
        child_provider_session_id=f"child-{op.operation_id}",
        provider_turn_ids=op.source_provider_turn_ids,
        binding_mode=op.binding_mode,
        receipt={"forkedFromId": op.source_provider_session_id, "sha256": "ab"},
        turn_bindings=None,
    )


def operations_only(path: Path, version: int = SCHEMA_VERSION) -> apsw.Connection:
    """A store file at `version` that takes `fork_operations` rows with no Sessions."""
    conn = apsw.Connection(str(path))
    migrate(conn, version)
    conn.execute("PRAGMA foreign_keys = OFF")  # operation rows alone, no Sessions
    return conn


def bare_operation(
    conn: apsw.Connection,
    n: int,
    status: str,
    observed: int | None = None,
    *,
    ws: str,
    source: str,
    turn_id: str | None = None,
) -> None:
    """Operation `op-{n}` of `source` through `turn_id` (`turn-{n}` unless given), at
    `status`, its result observed at `observed` (ms) or not."""
    # Schema v22's flag and v23's stage, as their CHECKs want them (a store before has no
    # such column).
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(fork_operations)")}
    flagged = "barrier" in columns
    staged = "stage" in columns
    conn.execute(
        "INSERT INTO fork_operations (workspace_id, operation_id, request_id, request_hash,"
        " source_session_id, target_session_id, point_kind, source_turn_id,"
        " source_provider_session_id, source_provider_turn_id, source_provider_turn_ids,"
        " target_title, driver_kind, driver_version, binding_mode, snapshot_hash, status,"
        f" created_at_ms, client_observed_at_ms{', barrier' if flagged else ''}"
        f"{', stage' if staged else ''})"
        " VALUES (?, ?, ?, 'h', ?, ?, 'throughTurn', ?, 'p', 'pt', '[]', 't', 'd', '1',"
        f" 'host_copy', 's', ?, 0, ?{', ?' if flagged else ''}{', ?' if staged else ''})",
        (
            ws,
            f"op-{n}",
            f"req-{n}",
            source,
            f"child-{n}",
            turn_id or f"turn-{n}",
            status,
            observed,
            *([int(holds_barrier(ForkStatus(status), observed is not None))] if flagged else []),
            *([stage_of(ForkStatus(status))] if staged else []),
        ),
    )
