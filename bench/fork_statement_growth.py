"""Which of the store's fork statements do more work the more often their source was forked:
SQLite's own count of virtual-machine steps per statement (`SQLITE_STMTSTATUS_VM_STEP`,
reported by `SQLITE_TRACE_PROFILE`), summed per fork, over an early window of forks of ONE
Session and a late one. Steps are counts: the same on a loaded machine as on a quiet one, so
two windows of one run compare without pairs.

Each fork runs the store's steps as `bench.fork_statements` calls them (the warm path:
prepare written at `dispatching`, a lazy acceptance, commit, ACK), every fork of the same
source through the same boundary Turn, as `bench.throughput`'s clients fork theirs. Prints the
steps a fork over each window and the statements whose steps grew most (trigger bodies marked
`T`). A statement that grows by a few steps per earlier fork reads every earlier fork of its
source: on `bench.throughput`'s first source (~3,500 earlier forks by its 16-client window)
it runs thousands of steps a fork.

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.fork_statement_growth \\
        [--forks 1500] [--window 100] [--top 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from bench.fork_statements import WS, source
from bench.fork_trees import evidence_for, fork_request
from storage.store import Store

VM_STEP = "SQLITE_STMTSTATUS_VM_STEP"


@dataclass(frozen=True, slots=True)
class Growth:
    """Steps per fork by statement text over the early and the late window."""

    early: Mapping[str, float]
    late: Mapping[str, float]

    def total(self, window: Mapping[str, float]) -> float:
        return sum(window.values())

    def grown(self) -> list[tuple[str, float, float]]:
        """(statement, early, late) steps a fork, the most grown first."""
        rows = [(sql, self.early.get(sql, 0.0), self.late.get(sql, 0.0)) for sql in self.keys()]
        return sorted(rows, key=lambda row: row[1] - row[2])

    def keys(self) -> list[str]:
        return list(dict.fromkeys([*self.early, *self.late]))


def _text(event: Mapping[str, Any]) -> str:
    return ("T " if event.get("trigger") else "") + " ".join(str(event["sql"]).split())


def measure(forks: int, window: int, turns: int = 3) -> Growth:
    """`forks` forks of one `turns`-Turn Session; steps a fork over forks [1, 1 + window) and
    over the last `window`."""
    if forks < 2 * window + 1:
        raise ValueError(f"{forks} forks hold no two windows of {window}")
    windows = {"early": range(1, 1 + window), "late": range(forks - window, forks)}
    steps: dict[str, Counter[str]] = {name: Counter() for name in windows}
    now: list[str | None] = [None]

    def profile(event: dict[str, Any]) -> None:
        name = now[0]
        if name is not None:
            status = event.get("stmt_status") or {}
            steps[name][_text(event)] += int(status.get(VM_STEP, 0))

    with tempfile.TemporaryDirectory(prefix="bench-fork-growth-") as tmp:
        store = Store.open(Path(tmp) / "store.sqlite3")
        try:
            sid, turn_id = source(store, turns)
            conn = store.db._writer_connection()
            conn.trace_v2(apsw.SQLITE_TRACE_PROFILE, profile, id="fork-growth")

            def forkable(_root: str | None, _binding: str | None) -> bool:
                return True

            try:
                for i in range(forks):
                    now[0] = next((k for k, span in windows.items() if i in span), None)
                    op, _ = store.fork_prepare.prepare_fork(
                        WS,
                        fork_request(sid, turn_id),
                        turn_forkable=forkable,
                        durable=True,
                        dispatching=True,
                    )
                    oid = op.operation_id
                    accept = store.fork_transitions.mark_fork_provider_accepted
                    accept(WS, oid, evidence_for(op), durable=False, known=op)
                    store.fork_commit.commit_fork(WS, oid)
                    store.fork_transitions.acknowledge_fork(WS, oid)
            finally:
                now[0] = None
                conn.trace_v2(0, None, id="fork-growth")
        finally:
            store.close()
    per_fork = {
        name: {sql: count / window for sql, count in counted.items()}
        for name, counted in steps.items()
    }
    return Growth(per_fork["early"], per_fork["late"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--forks", type=int, default=1500, help="forks of the one source")
    parser.add_argument("--window", type=int, default=100, help="forks in each window")
    parser.add_argument("--top", type=int, default=10, help="statements listed")
    args = parser.parse_args(argv)
    growth = measure(args.forks, args.window)
    early, late = growth.total(growth.early), growth.total(growth.late)
    print(
        f"{args.forks} forks of one source: VM steps a fork {early:.0f} over forks 1-{args.window},"
        f" {late:.0f} over the last {args.window}"
    )
    print("  early      late  statement (the most grown first)")
    for sql, before, after in growth.grown()[: args.top]:
        print(f"  {before:7.1f} {after:9.1f}  {sql[:110]}")
    print(
        "python -m bench.fork_statement_growth"
        f" --forks {args.forks} --window {args.window} --top {args.top}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
