"""Deep and wide fork trees built fast through the public store API, for reading them back
through a real daemon (tests/daemon/test_deep_trees.py, bench/deep_trees.py): a fork goes
through the whole durable saga (prepare, dispatching, provider accepted, commit, ACK) with the
evidence a provider that copies the prefix gives; `replicate` copies one such fork's rows to
make trees of thousands of nodes in one transaction."""

from __future__ import annotations

import uuid
from typing import Any

from storage.models import ForkOperation, ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store


def root_with_turn(store: Store, ws: str, title: str = "Deep") -> tuple[str, str]:
    """A Session with one settled, provider-bound Turn: (Session id, Turn id)."""
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        ws, session_id=sid, provider="tutti-agent", title=title, cwd="/", settings={}
    )
    store.sessions.update_runtime(
        ws,
        sid,
        provider_session_id=f"prov-{sid}",
        runtime_context={"driverKind": "tutti-agent", "driverVersion": "0.0.10"},
    )
    turn, _ = store.turns.claim_submit(ws, sid, str(uuid.uuid4()), "hello")
    store.turns.bind_provider_turn(ws, sid, turn.turn_id, f"pt-{uuid.uuid4().hex[:8]}")
    reply = store.history.append_message(ws, sid, turn.turn_id, kind="assistant", text="hi")
    store.turns.settle_turn(
        ws, sid, turn.turn_id, outcome="completed", final_assistant_message_id=reply.message_id
    )
    return sid, turn.turn_id


def build_tree(store: Store, ws: str, shape: str, size: int) -> tuple[str, list[str]]:
    """A root and `size` forks: `chain` (each a fork of the one before) or `fan` (all forks
    of the root). One real fork, replicated. (root, the forks in order)."""
    root, turn_id = root_with_turn(store, ws)
    first, _ = committed_fork(store, ws, root, turn_id)
    lineage = store.lineage.lineage_tree(ws, first).session.lineage
    assert lineage is not None
    parents: list[str | None] = [None if shape == "chain" else root] * (size - 1)
    return root, [first, *replicate(store, ws, lineage.operation_id, parents)]


def fork_request(sid: str, turn_id: str) -> ForkPrepareRequest:
    """A tutti-agent `host_copy` fork of `sid` through `turn_id`, fresh request and child ids."""
    return ForkPrepareRequest(
        source_session_id=sid,
        request_id=f"req-{uuid.uuid4()}",
        target_session_id=str(uuid.uuid4()),
        turn_id=turn_id,
        driver_kind="tutti-agent",
        driver_version="0.0.10",
        binding_mode="host_copy",
        runtime_identity={},
    )


def evidence_for(op: ForkOperation) -> ProviderForkEvidence:
    """What a provider's fork of `op` would report: a child id of its own, the frozen Turns."""
    return ProviderForkEvidence(
        child_provider_session_id=f"child-{op.operation_id}",
        provider_turn_ids=op.source_provider_turn_ids,
        binding_mode=op.binding_mode,
        receipt={"forkedFromId": op.source_provider_session_id},
        turn_bindings=None,
    )


def committed_fork(store: Store, ws: str, sid: str, turn_id: str) -> tuple[str, str]:
    """Fork `sid` through `turn_id` to commit and ACK; (child id, the child's copy of the
    Turn, through which the child can be forked in turn)."""
    op, _ = store.fork_prepare.prepare_fork(ws, fork_request(sid, turn_id))
    store.fork_transitions.mark_fork_dispatching(ws, op.operation_id)
    store.fork_transitions.mark_fork_provider_accepted(ws, op.operation_id, evidence_for(op))
    committed, _ = store.fork_commit.commit_fork(ws, op.operation_id)
    store.fork_transitions.acknowledge_fork(ws, op.operation_id)
    assert committed.target_turn_id is not None
    return committed.target_session_id, committed.target_turn_id


def chain(store: Store, ws: str, root: str, turn_id: str, depth: int) -> list[str]:
    """`depth` forks, each of the previous child: the Session ids from the top down."""
    ids = []
    sid, turn = root, turn_id
    for _ in range(depth):
        sid, turn = committed_fork(store, ws, sid, turn)
        ids.append(sid)
    return ids


def fan(store: Store, ws: str, root: str, turn_id: str, width: int) -> list[str]:
    """`width` forks of `root` itself, in order."""
    return [committed_fork(store, ws, root, turn_id)[0] for _ in range(width)]


def replicate(store: Store, ws: str, template_op_id: str, parents: list[str | None]) -> list[str]:
    """Copies of one committed fork, made in one transaction for trees too big to fork one by
    one in a test: copy `i` is a fork of `parents[i]` (None: of the copy before it, making a
    chain), with its own Session, operation, snapshot, reservation and lineage rows, the rest
    of each row as the template's. Returns the new Session ids in order."""
    conn = store.db._writer_connection()
    op_cols, op = _row(conn, "fork_operations", "operation_id", ws, template_op_id)
    child = op["target_session_id"]
    s_cols, session = _row(conn, "sessions", "session_id", ws, child)
    l_cols, lin = _row(conn, "fork_lineage", "target_session_id", ws, child)
    snapshot = _one(conn, "SELECT snapshot_json FROM fork_snapshots WHERE op_seq = ?", op["op_seq"])
    top = _one(conn, "SELECT coalesce(max(op_seq), 0) FROM fork_operations")
    rows: dict[str, list[list[Any]]] = {t: [] for t in ("s", "o", "snap", "res", "l")}
    made: list[str] = []
    previous = child
    for i, parent in enumerate(parents):
        source = previous if parent is None else parent
        sid, op_id, seq = str(uuid.uuid4()), f"op-copy-{uuid.uuid4()}", top + 1 + i
        copy = dict(session, session_id=sid, title=f"{session['title']} #{i + 1}")
        rows["s"].append([copy[c] for c in s_cols])
        copy = dict(
            op,
            op_seq=seq,
            operation_id=op_id,
            request_id=f"req-{op_id}",
            source_session_id=source,
            target_session_id=sid,
        )
        rows["o"].append([copy[c] for c in op_cols])
        rows["snap"].append([seq, snapshot])
        rows["res"].append([ws, sid, op_id])
        copy = dict(lin, target_session_id=sid, source_session_id=source, operation_id=op_id)
        rows["l"].append([copy[c] for c in l_cols])
        made.append(sid)
        previous = sid
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, cols, key in (
            ("sessions", s_cols, "s"),
            ("fork_operations", op_cols, "o"),
            ("fork_snapshots", ["op_seq", "snapshot_json"], "snap"),
            ("session_reservations", ["workspace_id", "session_id", "operation_id"], "res"),
            ("fork_lineage", l_cols, "l"),
        ):
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                rows[key],
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return made


def _one(conn: Any, sql: str, *args: Any) -> Any:
    found = conn.execute(sql, args).fetchone()
    assert found is not None, sql
    return found[0]


def _row(conn: Any, table: str, key: str, ws: str, value: str) -> tuple[list[str], dict[str, Any]]:
    cols = [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]
    found = conn.execute(
        f"SELECT {', '.join(cols)} FROM {table} WHERE workspace_id = ? AND {key} = ?", (ws, value)
    ).fetchone()
    assert found is not None, (table, value)
    return cols, dict(zip(cols, found, strict=True))
