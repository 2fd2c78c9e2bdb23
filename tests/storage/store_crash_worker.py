"""Crash-test workload: fenced writes and fork transitions on one store file, forever.

Run as `python store_crash_worker.py STORE SEED`; it first recovers leftovers like the daemon
does (prepared → failed, dispatching → unknown, provider_accepted → commit), prints `ready`,
then writes until the test SIGKILLs it.
"""

from __future__ import annotations

import contextlib
import random
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from domain.errors import HostError  # noqa: E402
from domain.fork_states import ForkStatus
from storage.models import ForkPrepareRequest, ProviderForkEvidence
from storage.store import Store
from tests.support.store_reads import recoverable_fork_operations

WS = "crash-ws"


def recover(store: Store) -> None:
    cursor = None
    while True:
        ops, cursor = recoverable_fork_operations(store, after=cursor, limit=100)
        for op in ops:
            if op.status is ForkStatus.PREPARED:
                store.fork_transitions.mark_fork_failed(op.workspace_id, op.operation_id, "restart")
            elif op.status is ForkStatus.DISPATCHING:
                store.fork_transitions.mark_fork_unknown(
                    op.workspace_id, op.operation_id, "restart"
                )
            else:
                store.fork_commit.commit_fork(op.workspace_id, op.operation_id)
        if cursor is None:
            return


def pick(store: Store, sql: str, rng: random.Random) -> tuple[str, ...] | None:
    rows = store.db.connection().execute(sql, (WS,)).fetchall()
    return tuple(rng.choice(rows)) if rows else None


def new_source(store: Store, rng: random.Random) -> None:
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        WS, session_id=sid, provider="p", title="src", cwd="/", settings={}
    )
    store.sessions.update_runtime(WS, sid, provider_session_id=f"ps-{sid}")
    for _ in range(rng.randint(1, 3)):
        run_turn(store, sid)


def run_turn(store: Store, sid: str) -> None:
    turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), "hi")
    store.turns.bind_provider_turn(WS, sid, turn.turn_id, f"pt-{turn.turn_id}")
    reply = store.history.append_message(WS, sid, turn.turn_id, kind="assistant", text="echo: hi")
    store.turns.settle_turn(
        WS, sid, turn.turn_id, outcome="completed", final_assistant_message_id=reply.message_id
    )


def step(store: Store, rng: random.Random) -> None:
    live = "SELECT session_id FROM sessions WHERE workspace_id = ? AND deleted = 0"
    action = rng.choice(
        [
            "source",
            "turn",
            "settings",
            "prepare",
            "prepare",
            "advance",
            "advance",
            "advance",
            "ack",
            "delete",
        ]
    )
    if action == "source":
        new_source(store, rng)
    elif action in ("turn", "settings", "delete"):
        row = pick(store, live, rng)
        if row is None:
            return
        if action == "turn":
            run_turn(store, row[0])
        elif action == "settings":
            store.sessions.update_settings(WS, row[0], {"n": rng.random()})
        elif rng.random() < 0.2:
            store.sessions.delete_session(WS, row[0])
    elif action == "prepare":
        row = pick(
            store,
            "SELECT t.session_id, t.turn_id FROM turns t JOIN sessions s USING (workspace_id,"
            " session_id) WHERE t.workspace_id = ? AND s.deleted = 0 AND t.phase = 'settled'",
            rng,
        )
        if row is None:
            return
        store.fork_prepare.prepare_fork(
            WS,
            ForkPrepareRequest(
                source_session_id=row[0],
                request_id=str(uuid.uuid4()),
                target_session_id=str(uuid.uuid4()),
                turn_id=row[1],
                driver_kind="p",
                driver_version="1",
                binding_mode="host_copy",
            ),
        )
    elif action == "advance":
        row = pick(
            store,
            "SELECT operation_id, status FROM fork_operations WHERE workspace_id = ?"
            " AND status IN ('prepared', 'dispatching', 'provider_accepted')",
            rng,
        )
        if row is None:
            return
        op_id, status = row
        roll = rng.random()
        if status == "prepared":
            if roll < 0.8:
                store.fork_transitions.mark_fork_dispatching(WS, op_id)
            else:
                store.fork_transitions.mark_fork_failed(WS, op_id, "not started")
        elif status == "dispatching":
            if roll < 0.7:
                op = store.fork_queries.get_fork_operation(WS, op_id)
                store.fork_transitions.mark_fork_provider_accepted(
                    WS,
                    op_id,
                    ProviderForkEvidence(
                        child_provider_session_id=f"child-{op_id}",
                        provider_turn_ids=op.source_provider_turn_ids,
                        binding_mode="host_copy",
                        receipt={"forkedFromId": op.source_provider_session_id},
                    ),
                )
            elif roll < 0.85:
                store.fork_transitions.mark_fork_unknown(WS, op_id, "lost")
            else:
                store.fork_transitions.mark_fork_failed(WS, op_id, "rejected")
        else:
            store.fork_commit.commit_fork(WS, op_id)
    elif action == "ack":
        row = pick(
            store,
            "SELECT operation_id FROM fork_operations WHERE workspace_id = ?"
            " AND status = 'committed' AND client_observed_at_ms IS NULL",
            rng,
        )
        if row is not None:
            store.fork_transitions.acknowledge_fork(WS, row[0])


def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    store = Store.open(path)
    recover(store)
    print("ready", flush=True)
    while True:
        # Fenced, busy, boundary: expected outcomes of a random workload.
        with contextlib.suppress(HostError):
            step(store, rng)


if __name__ == "__main__":
    main()
