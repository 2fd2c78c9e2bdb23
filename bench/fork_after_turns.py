"""A warm fork's store CPU when Turns ran since the last fork (issue 36 targets 3 and 4).

A real store file (no daemon): a 3-Turn source, then `--forks` rounds of `--turns` Turns on
another Session (claim, reply, settlement, as tests/storage/test_statement_reuse.py writes them)
followed by one fork of the source through prepare, `dispatching`, `provider_accepted`, commit
and ACK (as bench/fork_statements.py calls them). Prints the fork's thread CPU (p50, p10 after
a warm-up) and the writer's statement-cache misses per fork: apsw's cache is a ring each
execution re-enters, so a fork's statements are compiled again when more than the cache's size
of executions ran since the last fork (docs/design/store.md "Statements compiled once").

This file runs with the code of whichever tree leads PYTHONPATH, so one copy measures two:

    PYTHONPATH=<tree> build/venv/bin/python <this checkout>/bench/fork_after_turns.py \\
        [--turns 3] [--forks 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from bench.common import cpu_probe_ms
from bench.fork_statements import WS, source
from bench.fork_trees import evidence_for, fork_request
from storage.store import Store

WARM = 10


def turn(store: Store, sid: str, i: int) -> None:
    t, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), f"hello {i}")
    with store.db.write_batch():
        reply = store.history.append_message(
            WS, sid, t.turn_id, kind="assistant", text="reply", payload={}
        )
        store.turns.record_settlement(
            WS, sid, t.turn_id, outcome="completed",
            final_assistant_message_id=reply.message_id,
            checkpoint_json='{"state":"unavailable"}',
            turn=replace(t, messages=(*t.messages, reply)),
        )  # fmt: skip


def fork(store: Store, sid: str, turn_id: str) -> None:
    def forkable(_root: str | None, _binding: str | None) -> bool:
        return True

    op, _ = store.fork_prepare.prepare_fork(
        WS, fork_request(sid, turn_id), turn_forkable=forkable, durable=False
    )
    oid = op.operation_id
    op, _ = store.fork_transitions.mark_fork_dispatching(WS, oid, known=op)
    accept = store.fork_transitions.mark_fork_provider_accepted
    accept(WS, oid, evidence_for(op), durable=False, known=op)
    store.fork_commit.commit_fork(WS, oid)
    store.fork_transitions.acknowledge_fork(WS, oid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--forks", type=int, default=200)
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"load {load} probe {cpu_probe_ms():.1f} ms")
    with tempfile.TemporaryDirectory(prefix="bench-fork-after-turns-") as tmp:
        store = Store.open(Path(tmp) / "store.sqlite3")
        try:
            sid, turn_id = source(store, 3)
            other, _ = source(store, 1)
            conn = store.db._writer_connection()
            cpu: list[float] = []
            misses: list[int] = []
            for _ in range(args.forks):
                for j in range(args.turns):
                    turn(store, other, j)
                before = conn.cache_stats()["misses"]
                t0 = time.thread_time()
                fork(store, sid, turn_id)
                cpu.append((time.thread_time() - t0) * 1000)
                misses.append(conn.cache_stats()["misses"] - before)
            cpu, misses = cpu[WARM:], misses[WARM:]
            deciles = statistics.quantiles(cpu, n=10)
            print(
                f"fork after {args.turns} Turns: CPU p50 {statistics.median(cpu):.3f} ms"
                f" p10 {deciles[0]:.3f} ms; writer cache misses"
                f" {sum(misses) / len(misses):.2f} a fork ({len(cpu)} forks)"
            )
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
