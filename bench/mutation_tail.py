"""The tail of a phase's mutations attributed (A alone, B beside the forks): each mutation's
interval (the client's `t0`/`t1`) lined up against every suspect `bench/stall_site` stamped on
the same clock, the slowest 2 % (by kind) compared with the middle band (p40–p60) of its kind.

For a suspect kind, its overlap with a request is the time of the request's interval covered by
at least one stamp of that kind (the union, so two overlapping collections count once). Its
share of the tail's excess is (mean overlap over the tail − mean overlap over the middle band)
/ (mean latency of the tail − p50): the time the tail spent beside that suspect beyond what a
typical request spends beside it. Overlap is coincidence, not proof of cause: a suspect that
holds the GIL (a collection, a timer) or a CPU stalls every request it overlaps; one that only
runs beside them (a checkpoint on its own connection) may not. Shares need not sum to 100 %
(suspects overlap each other; queueing for the 2 cores is in none of them but `lag`).

`lag` is the daemon probe's late wake-ups (`AGENTHOST_STALL_LAG_MS`), split by its schedstat
into `lag: no CPU` (the probe's thread on a run queue) and `lag: GIL` (the rest: another thread
of the daemon held the interpreter).

    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall --quick --out DIR   # stamp a run
    PYTHONPATH=$TREE build/venv/bin/python -m bench.mutation_tail DIR [DIR ...] [--tail 0.02]
    PYTHONPATH=$TREE build/venv/bin/python -m bench.mutation_tail DIR --phase B   # beside forks

Phase B adds the fork saga's suspects (its bodies under the store's baton — the commit
transaction apart from its other steps —, its actor messages, its requests' dispatch) and
counts the store's queue from the mutations' writes: the fork bodies each ran behind and the
COMMITs that ended inside it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.stall import _SWITCH, MUTATIONS, _kind_of, load

Span = tuple[float, float]


def _category(row: dict[str, Any]) -> list[tuple[str, Span]]:
    """The suspect kinds a stamp row counts for, each with the span it covers."""
    kind, proc = row["kind"], str(row["proc"]).split(":", 1)[0]
    t0, t1 = float(row["t0"]), float(row["t1"])
    if kind == "gc":
        gen = str(row["detail"]).split()[0]
        if proc == "daemon":
            return [(f"gc {gen} (daemon)", (t0, t1))]
        return [(f"gc (other: {proc})", (t0, t1))]
    if proc != "daemon":
        return []
    if kind == "lag":
        ran = max(0.0, min(float(row["detail"] or 0.0), t1 - t0))
        # The run-queue part and the GIL part are not ordered within the late wake-up: split
        # its span in proportion (the run queue's first).
        cut = t0 + ran
        return [("lag: no CPU", (t0, cut)), ("lag: GIL", (cut, t1))]
    if kind in ("wal_checkpoint", "wal_restart", "capture", "spawn", "timer", "log"):
        return [(kind, (t0, t1))]
    if kind == "janitor_sweep":
        return [("janitor sweep", (t0, t1))]
    if kind == "commit":
        return [("group COMMIT", (t0, t1))]
    detail = str(row["detail"])
    if kind == "body" and _is_fork(detail):
        # A fork's body under the baton: the fork's commit transaction apart from its other
        # steps (prepare, the transitions, the ACK's write).
        name = "fork commit body" if "commit_fork" in detail else "fork step body"
        return [(name, (t0, t1))]
    if kind == "actor_message" and detail.startswith("Fork"):
        return [("fork saga actor message", (t0, t1))]
    if kind == "request" and detail.startswith("fork."):
        return [("fork request dispatch", (t0, t1))]
    return []


def _is_fork(body_name: str) -> bool:
    """Whether a `submit_write` body (by its qualified name) is one of the fork saga's."""
    return "fork" in body_name.lower()


def store_waits(rows: Iterable[dict[str, Any]], lo: float, hi: float) -> dict[str, float]:
    """The mutations' writes in [lo, hi] (every `write` stamp whose body is not a fork's): the
    fork bodies each ran behind (a fork body wholly inside the write's wait, before its own
    body) and the group COMMITs that ended inside it — counts, the store's queue seen from the
    caller, with no request-to-write matching needed."""
    rows = list(rows)
    writes = [r for r in rows if r["kind"] == "write" and not _is_fork(str(r["detail"]))]
    writes = [r for r in writes if lo <= r["t0"] <= hi]
    own = sorted(
        (r["t0"], r["t1"]) for r in rows if r["kind"] == "body" and not _is_fork(str(r["detail"]))
    )
    forks = sorted(
        (r["t0"], r["t1"]) for r in rows if r["kind"] == "body" and _is_fork(str(r["detail"]))
    )
    commit_rows = [r for r in rows if r["kind"] == "commit" and lo <= r["t0"] <= hi]
    commits = sorted(r["t1"] for r in rows if r["kind"] == "commit")
    after: list[float] = []
    behind: list[int] = []
    behind_ms: list[float] = []
    waited_commits: list[int] = []
    for w in writes:
        w0, w1 = w["t0"], w["t1"]
        # Its own body: the first non-fork body starting inside the wait (close enough with
        # 8 writers; only the count of fork bodies before it is used).
        mine = next((b for b in own if w0 <= b[0] <= w1), (w1, w1))
        before = [(a, b) for a, b in forks if a >= w0 and b <= mine[0]]
        behind.append(len(before))
        behind_ms.append(sum(b - a for a, b in before))
        after.append(w1 - mine[1])
        waited_commits.append(sum(1 for c in commits if w0 <= c <= w1))
    walls = sorted(w["t1"] - w["t0"] for w in writes)
    n = max(1, len(writes))
    commit_ms = sorted(r["ms"] for r in commit_rows)
    after.sort()
    return {
        "commits": float(len(commit_rows)),
        "membersMean": sum(int(r["detail"]) for r in commit_rows) / max(1, len(commit_rows)),
        "commitP50": _pct(commit_ms, 0.5),
        "commitP99": _pct(commit_ms, 0.99),
        "afterBodyP50": _pct(after, 0.5),
        "afterBodyP99": _pct(after, 0.99),
        "writes": float(len(writes)),
        "wallP50": _pct(walls, 0.5),
        "wallP99": _pct(walls, 0.99),
        "forkBodiesBehind": sum(behind) / n,
        "forkBodyMsBehind": sum(behind_ms) / n,
        "behindAny": sum(1 for b in behind if b) / n,
        "commitsWaited": sum(waited_commits) / n,
        "commitsWaited2": sum(1 for c in waited_commits if c >= 2) / n,
    }


def _union_overlap(spans: list[Span], lo: float, hi: float) -> float:
    """Time of [lo, hi] covered by the (start-sorted) spans."""
    covered = 0.0
    cur_lo = cur_hi = None
    for a, b in spans:
        if b <= lo:
            continue
        if a >= hi:
            break
        a, b = max(a, lo), min(b, hi)
        if cur_hi is None or a > cur_hi:
            if cur_hi is not None and cur_lo is not None:
                covered += cur_hi - cur_lo
            cur_lo, cur_hi = a, b
        else:
            cur_hi = max(cur_hi, b)
    if cur_hi is not None and cur_lo is not None:
        covered += cur_hi - cur_lo
    return covered


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def attribute(
    records: list[dict[str, Any]], rows: Iterable[dict[str, Any]], tail: float = 0.02
) -> dict[str, Any]:
    """Per suspect kind: mean overlap over the tail and over the middle band, and its share of
    the tail's excess over p50 (both mutations pooled, each judged against its own kind)."""
    spans: dict[str, list[Span]] = defaultdict(list)
    for row in rows:
        for name, span in _category(row):
            spans[name].append(span)
    for name in spans:
        spans[name].sort()
    tail_rows: list[tuple[dict[str, Any], float]] = []
    mid_rows: list[dict[str, Any]] = []
    p50s: dict[str, float] = {}
    for kind in MUTATIONS:
        mine = sorted(
            (r for r in records if r["kind"] == kind and r["status"] < 400),
            key=lambda r: r["t1"] - r["t0"],
        )
        if not mine:
            continue
        ms = [r["t1"] - r["t0"] for r in mine]
        p50s[kind] = _pct(ms, 0.5)
        n_tail = max(1, round(tail * len(mine)))
        tail_rows += [(r, p50s[kind]) for r in mine[-n_tail:]]
        mid_rows += mine[int(0.4 * len(mine)) : int(0.6 * len(mine)) + 1]
    excess = sum(r["t1"] - r["t0"] - p50 for r, p50 in tail_rows) / max(1, len(tail_rows))
    table: list[dict[str, Any]] = []
    for name, kind_spans in sorted(spans.items()):
        t_mean = sum(_union_overlap(kind_spans, r["t0"], r["t1"]) for r, _ in tail_rows) / max(
            1, len(tail_rows)
        )
        m_mean = sum(_union_overlap(kind_spans, r["t0"], r["t1"]) for r in mid_rows) / max(
            1, len(mid_rows)
        )
        hit = sum(1 for r, _ in tail_rows if _union_overlap(kind_spans, r["t0"], r["t1"]) > 0)
        table.append(
            {
                "cause": name,
                "tailMs": t_mean,
                "midMs": m_mean,
                "share": (t_mean - m_mean) / excess if excess > 0 else 0.0,
                "tailHit": hit,
                "count": len(kind_spans),
            }
        )
    table.sort(key=lambda row: -row["share"])
    return {
        "p50": p50s,
        "tailN": len(tail_rows),
        "midN": len(mid_rows),
        "tailMeanMs": sum(r["t1"] - r["t0"] for r, _ in tail_rows) / max(1, len(tail_rows)),
        "excessMs": excess,
        "table": table,
        "tailRows": [r for r, _ in tail_rows],
        "midRows": mid_rows,
        "slowest": sorted(
            ((r["kind"], r["t1"] - r["t0"], r["t0"]) for r, _ in tail_rows),
            key=lambda x: -x[1],
        )[:8],
    }


def report(out: Path, tail: float, skip_s: float = 0.0, phase: str = "A") -> dict[str, Any]:
    records, rows = load(out)
    a = records[phase]
    start, end = min(r["t0"] for r in a), max(r["t1"] for r in a)
    if skip_s > 0:
        # The phase's first requests start in step (8 clients at once): the steady state's
        # tail without them.
        a = [r for r in a if r["t0"] >= start + 1000 * skip_s]
    rows = [r for r in rows if r["t1"] >= start and r["t0"] <= end]
    got = attribute(a, rows, tail)
    waits = store_waits(rows, start, end)
    got["store"] = waits
    print(
        f"{out}: phase {phase} from +{skip_s:g} s, p50 "
        + ", ".join(f"{k} {v:.1f}" for k, v in got["p50"].items())
    )
    print(
        f"  tail: slowest {tail:.0%} of each mutation, {got['tailN']} requests, mean"
        f" {got['tailMeanMs']:.1f} ms, excess over p50 {got['excessMs']:.1f} ms; middle band"
        f" {got['midN']} requests"
    )
    print(f"  {'cause':<28} {'tail ms':>8} {'mid ms':>8} {'share':>7} {'tail hit':>9} {'n':>6}")
    for row in got["table"]:
        print(
            f"  {row['cause']:<28} {row['tailMs']:8.2f} {row['midMs']:8.2f}"
            f" {row['share']:7.1%} {row['tailHit']:>4}/{got['tailN']:<4} {row['count']:6d}"
        )
    start_s = start
    print(
        "  slowest: "
        + "; ".join(
            f"{k} {ms:.1f} ms at +{(t0 - start_s) / 1000:.2f} s" for k, ms, t0 in got["slowest"]
        )
    )
    print(
        f"  store: {waits['writes']:.0f} mutation writes, wall p50 / p99 {waits['wallP50']:.1f}"
        f" / {waits['wallP99']:.1f} ms; per write: fork bodies run before its own"
        f" {waits['forkBodiesBehind']:.2f} ({waits['forkBodyMsBehind']:.2f} ms; any in"
        f" {waits['behindAny']:.1%} of writes), COMMITs ended inside it"
        f" {waits['commitsWaited']:.2f} (two or more in {waits['commitsWaited2']:.1%}),"
        f" wait after its body p50 / p99 {waits['afterBodyP50']:.1f} / {waits['afterBodyP99']:.1f}"
        f" ms; {waits['commits']:.0f} group COMMITs of {waits['membersMean']:.1f} members,"
        f" {waits['commitP50']:.1f} / {waits['commitP99']:.1f} ms"
    )
    cpu_split(out, got["tailRows"], got["midRows"])
    return got


def _runs(out: Path) -> tuple[dict[str, list[Span]], dict[int, str]] | None:
    """With `bench.stall --sched`: each thread's spans on a CPU from the kernel's switches,
    grouped by process kind (daemon, app-server, worker, bench/client, other)."""
    sched = out / "sched.txt"
    if not sched.exists():
        return None
    import json

    offset = float((out / "offset.txt").read_text())
    kinds: dict[int, str] = {}
    for f in out.glob("*.jsonl"):
        with contextlib.suppress(ValueError, OSError):
            first = f.read_text().split("\n", 1)[0]
            kinds[int(f.stem)] = _kind_of(json.loads(first))
    group: dict[int, int] = {}
    since: dict[int, float] = {}
    spans: dict[int, list[Span]] = defaultdict(list)
    with open(sched) as fh:
        for line in fh:
            m = _SWITCH.match(line)
            if m is None:
                continue
            pid, tid, t, prev, _state, nxt = m.groups()
            at = float(t) * 1000 + offset
            group[int(tid)] = int(pid)
            began = since.pop(int(prev), None)
            if began is not None and int(prev) != 0:
                spans[int(prev)].append((began, at))
            since[int(nxt)] = at
    by_kind: dict[str, list[Span]] = defaultdict(list)
    for tid, tid_spans in spans.items():
        pid = group.get(tid, -1)
        kind = kinds.get(pid, "other")
        if kind == "bench/client" and pid not in kinds:
            kind = "other"
        by_kind[kind] += tid_spans
    for kind in by_kind:
        by_kind[kind].sort()
    return by_kind, kinds


def _cpu_in(spans: list[Span], lo: float, hi: float) -> float:
    """CPU time (all threads, summed; may exceed the window on 2 cores) inside [lo, hi]."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans if b > lo and a < hi)


def cpu_split(out: Path, tail_rows: list[dict[str, Any]], mid_rows: list[dict[str, Any]]) -> None:
    got = _runs(out)
    if got is None:
        return
    by_kind, _ = got
    print(
        "  CPU inside the requests' windows by process kind: ms of CPU per request, and cores"
        " (CPU / the window's length; 2 cores)"
    )
    print(
        f"  {'process kind':<16} {'tail ms':>8} {'mid ms':>8} {'tail cores':>11} {'mid cores':>10}"
    )
    t_len = sum(r["t1"] - r["t0"] for r in tail_rows) or 1.0
    m_len = sum(r["t1"] - r["t0"] for r in mid_rows) or 1.0
    for kind, spans in sorted(by_kind.items()):
        t = sum(_cpu_in(spans, r["t0"], r["t1"]) for r in tail_rows)
        m = sum(_cpu_in(spans, r["t0"], r["t1"]) for r in mid_rows)
        print(
            f"  {kind:<16} {t / max(1, len(tail_rows)):8.2f} {m / max(1, len(mid_rows)):8.2f}"
            f" {t / t_len:11.2f} {m / m_len:10.2f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dirs", type=Path, nargs="+", help="`bench.stall --out` folders")
    p.add_argument("--tail", type=float, default=0.02, help="the slowest fraction (0.02)")
    p.add_argument("--skip-s", type=float, default=0.0, help="leave out phase A's first seconds")
    p.add_argument(
        "--phase", choices=("A", "B"), default="A", help="A: the mutations alone; B: beside forks"
    )
    args = p.parse_args(argv)
    for out in args.dirs:
        report(out, args.tail, args.skip_s, args.phase)
    return 0


if __name__ == "__main__":
    sys.exit(main())
