"""The store's side of one warm fork, step by step and statement by statement (no daemon).

A real store file, a Session of `--turns` settled Turns, `--forks` forks of it run through
prepare, `dispatching`, `provider_accepted`, commit and the ACK, called as the saga and the ACK
call them (the warm path: a lazy prepare and acceptance, each move from the row the saga holds).
Prints each step's thread CPU (p50 over the forks after a warm-up) and statements per fork
(BEGIN, COMMIT and the lazy COMMITs' PRAGMAs included; a multi-row INSERT counts a statement
per row), then every SELECT of the last fork's steps timed twice, from its recorded text: with its
values bound, as the store runs it, and with the same values written into the SQL as literals.
A statement much dearer bound than literal is one SQLite re-prepares at each execution (a plan
that depends on the bound values): the barrier lookup with `ORDER BY op_seq LIMIT 1` and the
boundary's Interactions join were two (docs/performance.md, "The daemon's share of one warm
fork, fourth pass"). Timings, loaded or not: read the two columns of one run side by side.

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.fork_statements \\
        [--turns 10] [--forks 300] [--split] [--show]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apsw

from bench.fork_trees import evidence_for, fork_request
from storage.store import Store

WS = "ws-fork-statements"
STEPS = ("prepare", "dispatching", "accepted", "commit", "ack")
WARM = 20


def source(store: Store, turns: int) -> tuple[str, str]:
    """A Session with `turns` settled, provider-bound Turns: (Session id, its last Turn's id)."""
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        WS, session_id=sid, provider="tutti-agent", title="Src", cwd="/", settings={}
    )
    store.sessions.update_runtime(
        WS,
        sid,
        provider_session_id=f"prov-{sid}",
        runtime_context={"driverKind": "tutti-agent", "driverVersion": "0.0.10"},
    )
    last = ""
    for i in range(turns):
        turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), f"turn {i}")
        store.turns.bind_provider_turn(WS, sid, turn.turn_id, f"pt-{i}")
        reply = store.history.append_message(WS, sid, turn.turn_id, kind="assistant", text="ok")
        store.turns.settle_turn(
            WS, sid, turn.turn_id, outcome="completed", final_assistant_message_id=reply.message_id
        )
        last = turn.turn_id
    return sid, last


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    return "'" + str(value).replace("'", "''") + "'"


def with_literals(sql: str, bindings: Any) -> str | None:
    """`sql` with its `?` / `?N` parameters replaced by `bindings` as SQL literals."""
    if not isinstance(bindings, (list, tuple)):
        return None
    values = list(bindings)
    if re.search(r"\?\d", sql):
        return re.sub(r"\?(\d+)", lambda m: _literal(values[int(m.group(1)) - 1]), sql)
    it = iter(values)
    return re.sub(r"\?", lambda m: _literal(next(it)), sql)


def _cpu_us(conn: apsw.Connection, sql: str, bindings: Any, n: int = 500) -> float:
    list(conn.execute(sql, bindings))
    t0 = time.thread_time()
    for _ in range(n):
        list(conn.execute(sql, bindings))
    return (time.thread_time() - t0) / n * 1e6


def run(turns: int, forks: int, split: bool = False, show: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-fork-statements-") as tmp:
        store = Store.open(Path(tmp) / "store.sqlite3")
        try:
            sid, turn_id = source(store, turns)
            conn = store.db._writer_connection()
            step = ["-"]
            statements: Counter[str] = Counter()
            last: list[tuple[str, str, Any]] = []
            recording = [False]

            def trace(_cursor: Any, sql: str, bindings: Any) -> bool:
                statements[step[0]] += 1
                if recording[0]:
                    last.append((step[0], sql, bindings))
                return True

            conn.exec_trace = trace
            cpu: dict[str, list[float]] = {s: [] for s in STEPS}

            def timed(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                step[0] = name
                t0 = time.thread_time()
                out = fn(*args, **kwargs)
                cpu[name].append((time.thread_time() - t0) * 1000)
                return out

            def forkable(_root: str | None, _binding: str | None) -> bool:
                return True

            for i in range(forks):
                if i == WARM:
                    statements.clear()
                recording[0] = i == forks - 1
                request = fork_request(sid, turn_id)
                # As the saga's warm path calls them: the prepare written at `dispatching`
                # (one fsync'd transaction; `--split`: a lazy prepare, then `dispatching`),
                # each move from the row it holds (`known`), the acceptance lazy (made durable
                # by the commit's fsync).
                op, _ = timed(
                    "prepare",
                    store.fork_prepare.prepare_fork,
                    WS,
                    request,
                    turn_forkable=forkable,
                    durable=not split,
                    dispatching=not split,
                )
                oid = op.operation_id
                if split:
                    dispatch = store.fork_transitions.mark_fork_dispatching
                    op, _ = timed("dispatching", dispatch, WS, oid, known=op)
                else:
                    cpu["dispatching"].append(0.0)
                accept = store.fork_transitions.mark_fork_provider_accepted
                evidence = evidence_for(op)
                timed("accepted", accept, WS, oid, evidence, durable=False, known=op)
                timed("commit", store.fork_commit.commit_fork, WS, oid)
                timed("ack", store.fork_transitions.acknowledge_fork, WS, oid)
            conn.exec_trace = None
            counted = forks - WARM
            print(f"{forks} forks of a {turns}-Turn Session, thread CPU p50 after {WARM} warm:")
            for name in STEPS:
                p50 = statistics.median(cpu[name][WARM:])
                print(f"  {name:12s} {p50:6.3f} ms  {statements[name] / counted:5.1f} statements")
            whole = [sum(cpu[name][i] for name in STEPS) for i in range(WARM, forks)]
            total = statistics.median(whole)
            print(f"  {'total':12s} {total:6.3f} ms (p50 of each fork's five steps)")
            if show:
                print("every statement of the last fork, by step:")
                for name, sql, _ in last:
                    print(f"  {name:12s} {' '.join(sql.split())[:110]}")
            print("each SELECT of the last fork, CPU µs per execution (bound / as literals):")
            for name, sql, bindings in last:
                text = sql.strip()
                if not text.upper().startswith("SELECT"):
                    continue
                literal = with_literals(text, bindings)
                bound = _cpu_us(conn, text, bindings)
                lit = _cpu_us(conn, literal, ()) if literal else float("nan")
                flag = "  << re-prepared?" if bound > 2 * lit + 5 else ""
                shown = " ".join(text.split())[:90]
                print(f"  {name:12s} {bound:6.1f} / {lit:6.1f}  {shown}{flag}")
        finally:
            store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--forks", type=int, default=300)
    parser.add_argument(
        "--split",
        action="store_true",
        help="a lazy prepare, then dispatching (the warm path before forkstore's fold)",
    )
    parser.add_argument("--show", action="store_true", help="every statement of the last fork")
    args = parser.parse_args(argv)
    run(args.turns, max(args.forks, WARM + 1), args.split, args.show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
