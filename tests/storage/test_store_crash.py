"""SIGKILL a real writer process at random moments, 100 times in `make test` (400 in `make
soak`); after each kill the store file must be intact and every fork invariant must hold (laws
2 and 3, reservation rule)."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from domain.errors import ForkInProgress
from storage.fork_snapshot import decode_frozen
from storage.history_links import visible_rows
from storage.store import Store
from tests.support.invariants import (
    frozen_message_count,
    history_copy_problem,
    kept_digest_problems,
)

WORKER = Path(__file__).with_name("store_crash_worker.py")
WS = "crash-ws"


def check_invariants(store: Store) -> dict[str, int]:
    conn = store.db.connection()
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    # Every boundary digest a prepare kept is still the rows' (schema v17).
    assert kept_digest_problems(conn) == []
    ops = conn.execute(
        "SELECT operation_id, source_session_id, target_session_id, source_turn_id, status,"
        " client_observed_at_ms, snapshot_json FROM fork_operations LEFT JOIN fork_snapshots"
        " USING (op_seq) WHERE workspace_id = ?",
        (WS,),
    ).fetchall()
    counts: dict[str, int] = {}
    active_sources: set[str] = set()
    barriers: set[tuple[str, str]] = set()
    for op_id, source, target, turn, status, observed, snapshot in ops:
        counts[status] = counts.get(status, 0) + 1
        child = conn.execute(
            "SELECT COUNT(*) FROM sessions WHERE workspace_id = ? AND session_id = ?", (WS, target)
        ).fetchone()[0]
        lineage = conn.execute(
            "SELECT COUNT(*) FROM fork_lineage WHERE workspace_id = ? AND operation_id = ?",
            (WS, op_id),
        ).fetchone()[0]
        reserved = conn.execute(
            "SELECT COUNT(*) FROM session_reservations WHERE workspace_id = ? AND operation_id = ?",
            (WS, op_id),
        ).fetchone()[0]
        # Child iff committed (with its lineage row); reservation iff not failed.
        assert (child, lineage) == ((1, 1) if status == "committed" else (0, 0)), op_id
        assert reserved == (0 if status == "failed" else 1), op_id
        # A snapshot iff the operation did not end without a child (schema v27).
        assert (snapshot is None) == (status == "failed"), op_id
        if status == "committed":
            document = decode_frozen(snapshot)
            frozen = document["turns"]
            turns = conn.execute(
                "SELECT COUNT(*) FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND sequence_provenance = 'fork_clone'",
                (WS, target),
            ).fetchone()[0]
            # The Messages the child shows (own and read through its history link) of its
            # cloned Turns (numbered 1..n, as the source's).
            messages = len(visible_rows(conn, WS, target, turns))
            # Never half-applied: the child's cloned history is exactly the frozen one
            # (it may have run turns of its own since).
            assert (turns, messages) == (len(frozen), frozen_message_count(document))
            # Row by row, the source's boundary as prepare froze it (snapshot version 4).
            names = {
                "operation_id": op_id,
                "source_session_id": source,
                "target_session_id": target,
            }
            assert history_copy_problem(conn, WS, names, document) is None, op_id
        if status in ("prepared", "dispatching", "provider_accepted"):
            assert source not in active_sources, "two active forks on one source"
            active_sources.add(source)
        holds = status in ("prepared", "dispatching", "provider_accepted", "unknown") or (
            status == "committed" and observed is None
        )
        if holds:
            assert (source, turn) not in barriers, "two operations hold one barrier"
            barriers.add((source, turn))
    # Fence iff active: try a real fenced write on fenced and unfenced live sessions.
    live = [
        r[0]
        for r in conn.execute(
            "SELECT session_id FROM sessions WHERE workspace_id = ? AND deleted = 0", (WS,)
        )
    ]
    fenced = [s for s in live if s in active_sources][:2]
    free = [s for s in live if s not in active_sources][:2]
    for sid in fenced:
        with pytest.raises(ForkInProgress):
            store.sessions.update_settings(WS, sid, {"probe": True})
    for sid in free:
        assert store.sessions.update_settings(WS, sid, {"probe": True}).settings == {"probe": True}
    return counts


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kills", [100, pytest.param(400, marks=pytest.mark.long)])
def test_store_survives_repeated_sigkills_with_every_invariant_intact(
    tmp_path: Path, kills: int
) -> None:
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    rng = random.Random(20261129)
    totals: dict[str, int] = {}
    for kill in range(kills):
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(path), str(rng.randrange(1 << 30))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", (line, proc.stderr.read() if proc.stderr else "")
            time.sleep(rng.uniform(0.0, 0.03))
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -9, f"worker died on its own at kill {kill}"
        store = Store.open(path)
        try:
            totals = check_invariants(store)
        finally:
            store.close()
    print("fork operation statuses after the last kill:", totals)
    # The workload must actually have exercised the saga, not idled.
    assert totals.get("committed", 0) > 0 and totals.get("failed", 0) > 0
    assert totals.get("unknown", 0) > 0
