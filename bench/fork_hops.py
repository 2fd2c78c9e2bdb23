"""One warm fork stamped end to end, daemon and worker on one clock, against the bare provider
fork interleaved (issue 36 target 1: what the host adds over its floor, stretch by stretch).

A `BenchDaemon` of one provider (tutti-agent or claude-code) with `bench/stamp_site` loaded in
the daemon *and* its driver worker (`AGENTHOST_STAMPS`, `AGENTHOST_STAMPS_WORKER=1`; the
worker's stamps go to `<file>.w<pid>`): N forks one at a time of a warm source, each followed
by one bare provider fork (`bench.providers`' harness, as `bench.fork_overhead` times it),
then for each stamp its median offset from the client's send and the stretches between
consecutive stamps of the fork's path, in the order they happened. Not a benchmark of record
(the stamps cost a few µs each); the split, not the sum, is what it is for.

    PYTHONPATH=<tree> build/venv/bin/python <this checkout>/bench/fork_hops.py \\
        --provider tutti-agent --forks 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import cpu_probe_ms
from bench.fork_daemon import _drain_events
from bench.harness import (
    BenchDaemon,
    acknowledge,
    create_session,
    fork_until_terminal,
    last_settled_turn,
    run_turn,
)
from bench.loadgen import now_ms

PATH = (
    "loop.handle",
    "fork.start",
    "prepare.begin",
    "prepare.end",
    "disp.begin",
    "disp.end",
    "workers.fork",
    "sup.send",
    "w.recv",
    "w.fork",
    "w.fork_on",
    "w.dirs",
    "w.dirs.end",
    "w.answer",
    "w.answered",
    "w.dirs.ready",
    "w.bind",
    "w.bind.end",
    "w.proof",
    "w.proof.end",
    "w.names",
    "w.names.end",
    "w.fork_on.end",
    "c.plan",
    "c.plan.end",
    "c.sdk_fork",
    "c.sdk_fork.end",
    "c.relocate",
    "c.relocate.end",
    "c.verify",
    "c.verify.end",
    "w.nsync",
    "w.nsync.end",
    "w.send",
    "w.sent",
    "sup.complete",
    "dispatched",
    "accepted.begin",
    "accepted.end",
    "commit.begin",
    "commit.end",
    "responder.result",
    "loop.send_reply",
)
"""The stamps of a fork's path (first occurrence of each within the fork's window); its
stretches are taken between them in the order they happened."""

SITE = Path(__file__).resolve().parent / "stamp_site"
"""This checkout's stamp site, whichever tree leads PYTHONPATH (one copy measures two trees)."""


def _site_env(**extra: str) -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ.update(extra)


def _await_worker_stamps(base: Path, point: str, count: int, wait_s: float = 5.0) -> None:
    """Until the worker's stamp files hold `count` of `point` (one a fork), and its next two
    writes: it writes them every 0.2 s and leaves by `os._exit` at a stop that takes a tenth
    of that, so the last forks' stamps would be lost with a stop right after them."""
    deadline = time.monotonic() + wait_s
    while sum(1 for p, _ in _stamps(base) if p == point) < count:
        if time.monotonic() >= deadline:
            return  # counted as they are: a fork without them is left out of its medians
        time.sleep(0.05)
    time.sleep(0.45)  # two more of its writes: the rest of the last fork's stamps


def _stamps(base: Path) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for f in [base, *sorted(base.parent.glob(base.name + ".w*"))]:
        if f.exists():
            for line in f.read_text().splitlines():
                point, ms = line.split("\t")
                out.append((point, float(ms)))
    out.sort(key=lambda x: x[1])
    return out


def run(provider: str, forks: int, turns: int) -> dict[str, Any]:
    from bench.providers import PROVIDERS

    entry = next(e for e in PROVIDERS if e.name == provider)
    why = entry.unavailable()
    if why is not None:
        raise SystemExit(f"{provider}: {why}")
    with tempfile.TemporaryDirectory(prefix="bench-fork-hops-") as tmp_text:
        tmp = Path(tmp_text)
        stamps_file = tmp / "stamps.tsv"
        _site_env(AGENTHOST_STAMPS=str(stamps_file), AGENTHOST_STAMPS_WORKER="1")
        ops: list[tuple[float, float]] = []
        bare_ms: list[float] = []
        probe = cpu_probe_ms()
        with entry.environment() as config:
            daemon = BenchDaemon(
                tmp / "home", providers={entry.name: config} if config else {}
            ).start()
            bare = None
            try:
                c = daemon.client()
                _drain_events(daemon.events)
                sid = create_session(c, "hops", provider=entry.name)
                for i in range(turns):
                    run_turn(c, sid, f"turn {i}")
                boundary = last_settled_turn(c, sid)
                bare = entry.bare(tmp / "bare-home", turns, config)
                for _ in range(5):
                    acknowledge(c, fork_until_terminal(c, sid, boundary)["operationId"])
                    bare.fork_once()
                for _ in range(forks):
                    t0 = now_ms()
                    op = fork_until_terminal(c, sid, boundary)
                    ops.append((t0, now_ms()))
                    if op["status"] != "committed":
                        raise RuntimeError(f"fork did not commit: {op}")
                    acknowledge(c, op["operationId"])
                    bare_ms.append(bare.fork_once())
                _await_worker_stamps(stamps_file, "w.fork", 5 + forks)
            finally:
                if bare is not None:
                    bare.close()
                daemon.stop()
        stamps = _stamps(stamps_file)
    return _split(provider, ops, stamps, bare_ms, probe)


def _split(
    provider: str,
    ops: list[tuple[float, float]],
    stamps: list[tuple[str, float]],
    bare_ms: list[float],
    probe: float,
) -> dict[str, Any]:
    offsets: dict[str, list[float]] = {}
    stretches: dict[str, list[float]] = {}
    host: list[float] = []
    # The reply's leg (its encoding and hand-over, the loop's wake-up, its send), and whether
    # the events thread began its batch before the loop sent the reply (the two race for
    # the interpreter once the Session's thread lets it go).
    reply_leg: list[float] = []
    events_first = 0
    j = 0
    for t0, t1 in ops:
        while j < len(stamps) and stamps[j][1] < t0:
            j += 1
        first: dict[str, float] = {}
        k = j
        while k < len(stamps) and stamps[k][1] <= t1:
            point, t = stamps[k]
            # The worker's points of this fork follow this fork's send: a message sent
            # before the window (a previous fork's) may be received inside it; and the
            # supervisor's completion of this fork follows the worker's answer to it.
            if point == "sup.complete" and "w.send" not in first:
                pass  # another request's answer (a previous fork's follow-up) inside the window
            elif "sup.send" in first or not point.startswith(("w.", "c.")):
                first.setdefault(point, t)
            k += 1
        host.append(t1 - t0)
        if "responder.result" in first and "loop.send_reply" in first:
            reply_leg.append(first["loop.send_reply"] - first["responder.result"])
            batch = first.get("events.batch")
            events_first += batch is not None and batch < first["loop.send_reply"]
        for point, t in first.items():
            offsets.setdefault(point, []).append(t - t0)
        # In the order they happened (one clock for the daemon and the worker).
        seen = sorted((t, p) for p, t in first.items() if p in PATH)
        prev, prev_t = "send", t0
        for t, point in seen:
            stretches.setdefault(f"{prev} → {point}", []).append(t - prev_t)
            prev, prev_t = point, t
        stretches.setdefault(f"{prev} → client", []).append(t1 - prev_t)
    half = len(ops) // 2
    med_off = {k: statistics.median(v) for k, v in offsets.items() if len(v) >= half and k in PATH}
    med_str = {k: statistics.median(v) for k, v in stretches.items() if len(v) >= half}
    counts = Counter(p for p, _ in stamps)
    out = {
        "provider": provider,
        "forks": len(ops),
        "cpuProbeMs": probe,
        "hostP50Ms": statistics.median(host),
        "bareP50Ms": statistics.median(bare_ms) if bare_ms else None,
        "offsetsP50Ms": dict(sorted(med_off.items(), key=lambda kv: kv[1])),
        "stretchesP50Ms": med_str,
        "stampCounts": dict(counts),
        "replyLegP50Ms": statistics.median(reply_leg) if reply_leg else None,
        "replyLegs": len(reply_leg),
        "eventsBeforeReply": events_first,
        # Every stamp of the run counts (the warm-up's forks and Turns too): for A/B only.
        "loopDrainsPerFork": counts["loop.drain"] / len(ops) if ops else None,
    }
    print(
        f"{provider}: {len(ops)} forks, host p50 {out['hostP50Ms']:.2f} ms, bare p50"
        f" {out['bareP50Ms']:.2f} ms, CPU probe {probe:.1f} ms"
    )
    if reply_leg:
        print(
            f"  reply leg p50 {out['replyLegP50Ms']:.3f} ms (responder.result → loop.send_reply,"
            f" {len(reply_leg)} forks), events batch before the reply's send in {events_first};"
            f" loop drains {out['loopDrainsPerFork']:.2f} a fork (the whole run's)"
        )
    for point, ms in out["offsetsP50Ms"].items():
        print(f"  {point:18s} {ms:8.3f}")
    print("  stretches (p50 of each fork's own stretch):")
    for name, ms in med_str.items():
        print(f"  {name:34s} {ms:8.3f}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default="tutti-agent")
    ap.add_argument("--forks", type=int, default=60)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = run(args.provider, args.forks, args.turns)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
