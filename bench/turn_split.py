"""Where a host Turn's time goes, hop by hop: reads the stamps `bench/turn_stamp_site` wrote
during one `bench.turn_overhead --json` run (the client's submit and settled Turn, the
daemon's and the worker's points) and that run's JSON (each host Turn's "the model has the
request" and "its last delta", from the fake model's own stamps), and prints the median over
the timed host Turns of each stage's length, beside the bare provider's `before` and `after`.

    mkdir /tmp/stamps
    AGENTHOST_TURN_STAMPS=/tmp/stamps AGENTHOST_BENCH_PROVIDERS=tutti-agent \\
      PYTHONPATH=$PWD/bench/turn_stamp_site:$PWD build/venv/bin/python -m bench.turn_overhead \\
      --quick --json /tmp/stamps/bench.json
    build/venv/bin/python -m bench.turn_split /tmp/stamps [provider]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

STAGES = (
    ("c.submit", "d.submit", "client → Session actor"),
    ("d.submit", "d.claim.end", "actor: the start's reads + the claim's COMMIT"),
    ("d.cap.before", "d.cap.end.before", "  beside it: the `before` capture"),
    ("d.claim.end", "d.start_turn", "claim durable → `turn.start` to the worker"),
    ("d.start_turn", "w.start_turn", "→ the worker's driver"),
    ("w.start_turn", "M.request", "driver → the model has the request (provider)"),
    ("M.last", "w.n.item/completed#last", "the model's last delta → reply item at the worker"),
    ("w.n.item/completed#last", "w.n.turn/completed", "→ `turn/completed` at the worker"),
    ("w.n.turn/completed", "d.ev.turn.completed", "→ the daemon's sink"),
    ("d.ev.turn.completed", "d.cap.after", "→ the capture thread"),
    ("d.cap.after", "d.cap.end.after", "the `after` capture"),
    ("d.cap.end.after", "d.batch#last", "→ the actor's settlement batch"),
    ("d.batch#last", "d.batch.end#last", "the batch (reply + settlement, one COMMIT)"),
    ("d.batch.end#last", "d.pub#last", "→ the publisher"),
    ("d.pub#last", "d.pubmany#last", "projection → the transport"),
    ("d.pubmany#last", "c.done", "→ the client has the settled Turn"),
    ("c.submit", "M.request", "total before the model"),
    ("M.last", "c.done", "total after the model"),
)
REPEATED = (
    "d.pub",
    "d.pub.end",
    "d.pubmany",
    "d.ev.message.delta",
    "d.batch",
    "d.batch.end",
    "w.n.item/completed",
    "d.api",
)


def main() -> None:
    folder = Path(sys.argv[1])
    provider = sys.argv[2] if len(sys.argv) > 2 else "tutti-agent"
    stamps: list[tuple[float, str]] = []
    for tsv in folder.glob("*.tsv"):
        for line in tsv.read_text().splitlines():
            if line and not line.startswith("#"):
                point, ms = line.split("\t")
                stamps.append((float(ms), point))
    stamps.sort()
    fig = json.loads((folder / "bench.json").read_text())["figures"][provider]
    before = fig["hostBeforeModel"]["samples"]
    after = fig["hostAfterModel"]["samples"]
    starts = [t for t, p in stamps if p == "c.submit"][-len(before) :]
    ends = [t for t, p in stamps if p == "c.done"][-len(before) :]
    per_turn: list[dict[str, float]] = []
    for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
        seen: dict[str, float] = {}
        for t, p in stamps:
            if s <= t <= e + 0.001:
                if p in REPEATED:
                    seen.setdefault(p + "#first", t)
                    seen[p + "#last"] = t
                else:
                    seen.setdefault(p, t)
        seen["M.request"] = s + before[i]
        seen["M.last"] = e - after[i]
        seen["c.done"] = e
        per_turn.append(seen)
    print(f"{provider}: {len(per_turn)} host Turns, median ms of each stage")
    for a, b, label in STAGES:
        spans = [t[b] - t[a] for t in per_turn if a in t and b in t]
        if spans:
            print(f"  {statistics.median(spans):7.2f}  {label}")
    bare_b, bare_a = fig["bareBeforeModel"]["p50"], fig["bareAfterModel"]["p50"]
    print(f"  bare: before the model {bare_b:.2f}, after it {bare_a:.2f} (p50)")


if __name__ == "__main__":
    main()
