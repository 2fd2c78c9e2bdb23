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

One provider per folder (`AGENTHOST_BENCH_PROVIDERS` naming one). Beside the stages it prints
tutti-agent's app-server's own start of a Turn under the host and bare (its own stamps: the
launch is the same, what differs is what runs beside it), and where the host's deltas waited:
the model's emission → the worker's driver has the delta → the client has it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

DROPPED = (
    (
        "d.batch",
        "TurnWrites._drain_batch: a settlement carries its one-reply Turn's reply, so a Turn"
        " has no batch; its write is stamped d.write.settle",
    ),
)

STAGES = (
    ("c.submit", "d.submit", "client → Session actor"),
    ("c.submit", "d.api#first", "  client → the transport thread (`ApiServer._handle`)"),
    ("d.api#first", "d.recv.Submit", "  → the Session actor's slice (a pool hand-off)"),
    ("d.submit", "d.claim.end", "actor: the start's reads + the claim's COMMIT"),
    ("d.read", "d.read.end", "  the start's reads (Session row, an unbound settled Turn?)"),
    ("d.claim", "d.commit#first", "  the claim's statements"),
    ("d.commit#first", "d.commit.end#first", "  the claim's COMMIT"),
    ("d.cap.before", "d.cap.end.before", "  beside it: the `before` capture (on the pool)"),
    (
        "d.here.before",
        "d.here.end.before",
        "  the `before` capture on the actor, ahead of the claim (or its check)",
    ),
    ("d.claim.end", "d.start_turn", "claim durable → `turn.start` to the worker"),
    ("d.reply", "d.reply.end", "  of which the submit's answer handed to the transport"),
    ("d.start_turn", "d.send.turn.start", "→ the supervisor loop's link send"),
    ("d.send.turn.start", "w.server", "→ the worker's request lane (`turn.start`)"),
    ("w.server", "w.start_turn", "→ the worker's driver"),
    ("d.claim.end", "w.start_turn", "claim durable → the worker's driver"),
    ("d.submit", "w.start_turn", "the actor has the submit → the worker's driver"),
    ("w.start_turn", "M.request", "driver → the model has the request (provider)"),
    ("w.start_turn", "a.dispatch.turn/start", "  → the app-server has `turn/start`"),
    ("a.dispatch.turn/start", "a.post", "  the app-server's own start (rollout appends, notices)"),
    ("a.post", "M.request", "  its model client → the model has the request"),
    ("M.last", "w.n.item/completed#last", "the model's last delta → reply item at the worker"),
    ("w.n.item/completed#last", "w.n.turn/completed", "→ `turn/completed` at the worker"),
    ("w.n.turn/completed", "w.send.turn.completed", "→ the worker's link send"),
    ("w.send.turn.completed", "d.lhand.evt.turn.completed", "→ the supervisor loop reads it"),
    ("d.lhand.evt.turn.completed", "d.ev.turn.completed", "→ the daemon's sink"),
    ("d.ev.turn.completed", "d.recv.DriverEvent.TurnCompleted", "→ the Session actor's slice"),
    ("d.recv.DriverEvent.TurnCompleted", "d.settle", "→ `settle` on the actor"),
    ("d.settle", "d.write.settle", "→ the settlement's write begins"),
    (
        "d.here.after",
        "d.here.end.after",
        "  of which the `after` capture on the actor (or its check)",
    ),
    ("d.cap.after", "d.cap.end.after", "  (the `after` capture on the pool, when it went there)"),
    ("d.write.settle", "d.commit#last", "  the settlement's statements (reply carried)"),
    ("d.commit#last", "d.commit.end#last", "  the settlement's COMMIT"),
    ("d.commit.end#last", "d.pub#last", "COMMIT → the publisher"),
    ("d.pub#last", "d.pubmany#last", "projection → the transport"),
    ("d.pubmany#last", "c.done", "XPUB → the client has the settled Turn"),
    ("w.n.turn/completed", "d.ev.turn.completed", "`turn/completed` at the worker → the daemon"),
    ("d.ev.turn.completed", "d.commit.end#last", "→ the settlement durable"),
    ("d.ev.turn.completed", "c.done", "→ the client has the settled Turn"),
    ("c.submit", "M.request", "total before the model"),
    ("M.last", "c.done", "total after the model"),
)
# Legs a Turn stamps only some of the time.
# A Turn's `before` is taken on the actor ahead of the claim when its folder is quiet, else on
# the pool beside the claim's COMMIT: each Turn stamps one of the two (the check always).
OPTIONAL = (("d.cap.after", "d.cap.end.after"), ("d.cap.before", "d.cap.end.before"))
REPEATED = (
    "d.pub",
    "d.pub.end",
    "d.pubmany",
    "d.ev.message.delta",
    "d.commit",
    "d.commit.end",
    "w.n.item/completed",
    "d.api",
)


def legs(per_turn: list[dict[str, float]]) -> list[tuple[str, list[float], bool]]:
    """Each stage's spans over the Turns that stamped both its ends (empty: no stamps), and
    whether a Turn may lack it."""
    return [
        (label, [t[b] - t[a] for t in per_turn if a in t and b in t], (a, b) in OPTIONAL)
        for a, b, label in STAGES
    ]


def _app_servers(folder: Path) -> dict[str, list[tuple[float, str]]]:
    """The stamps of each tutti-agent app-server process (none for Codex, which is not
    Python), by pid."""
    found: dict[str, list[tuple[float, str]]] = {}
    for tsv in folder.glob("*.tsv"):
        lines = tsv.read_text().splitlines()
        if lines and "app-server" in lines[0]:
            rows = [line.split("\t") for line in lines[1:] if line]
            found[tsv.stem] = sorted((float(row[1]), row[0]) for row in rows)
    return found


def _own_start(stamps: list[tuple[float, str]], spans: list[tuple[float, float]]) -> list[float]:
    """Per window: an app-server's `turn/start` dispatch → its model request (`a.post`)."""
    out: list[float] = []
    for s, e in spans:
        t0 = next((t for t, p in stamps if s <= t <= e and p == "a.dispatch.turn/start"), None)
        t1 = next((t for t, p in stamps if t0 is not None and t0 <= t <= e and p == "a.post"), None)
        if t0 is not None and t1 is not None:
            out.append(t1 - t0)
    return out


def _appends(stamps: list[tuple[float, str]], spans: list[tuple[float, float]]) -> list[float]:
    """Each rollout append (written and fsynced) inside the windows, ms."""
    out: list[float] = []
    opened: float | None = None
    for t, p in stamps:
        if not any(s <= t <= e for s, e in spans):
            continue
        if p == "a.append":
            opened = t
        elif p == "a.append.end" and opened is not None:
            out.append(t - opened)
            opened = None
    return out


def compare_app_servers(folder: Path, starts: list[float], ends: list[float]) -> None:
    """tutti-agent's own start of a Turn under the host (inside host Turns) and bare (between
    them: each bare Turn follows a host Turn), from the app-servers' own stamps."""
    servers = _app_servers(folder)
    if not servers:
        return
    host_spans = list(zip(starts, ends, strict=True))
    bare_spans = [(e, s) for e, s in zip(ends, [*starts[1:], ends[-1] + 10_000], strict=True)]
    for label, spans in (("host", host_spans), ("bare", bare_spans)):
        own: list[float] = []
        appends: list[float] = []
        for stamps in servers.values():
            own += _own_start(stamps, spans)
            appends += _appends(stamps, spans)
        if own:
            print(
                f"  app-server under the {label}: `turn/start` → model request p50"
                f" {statistics.median(own):.2f} ms ({len(own)} Turns); a rollout append p50"
                f" {statistics.median(appends):.2f} ms ({len(appends)})"
            )


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def delta_holds(stamps: list[tuple[float, str]], starts: list[float], ends: list[float]) -> None:
    """Where the host's deltas waited: for each delta of the host Turns, the model's emission
    → the worker's driver has it (the provider and the worker's reader) and → the client has
    it (the worker's link, the daemon, the transport); beside it the bare Turns' emission →
    client. The deltas late by more than 4 ms beyond the bare p50, and which leg held them."""
    host: list[tuple[float, float]] = []
    bare: list[float] = []
    spans = list(zip(starts, ends, strict=True))
    emits = [t for t, p in stamps if p == "M.emit"]
    arrivals = [t for t, p in stamps if p == "c.delta"]
    received = [t for t, p in stamps if p == "w.n.item/agentMessage/delta"]
    for e, a in zip(emits, arrivals, strict=False):
        if not starts[0] <= a <= ends[-1] + 1000:
            continue  # another provider's run
        if any(s <= a <= t for s, t in spans):
            w = next((r for r in received if e <= r <= a), None)
            if w is not None:
                host.append((w - e, a - w))
        else:
            bare.append(a - e)
    if not host or not bare:
        return
    base = statistics.median(bare)
    late = [(up, down) for up, down in host if up + down - base > 4.0]
    ups, downs = [u for u, _ in host], [d for _, d in host]
    print(
        f"  deltas: model → worker p50/p99/max {_q(ups, 0.5):.2f}/{_q(ups, 0.99):.2f}/"
        f"{max(ups):.1f} ms; worker → client {_q(downs, 0.5):.2f}/{_q(downs, 0.99):.2f}/"
        f"{max(downs):.1f}; bare model → client {_q(bare, 0.5):.2f}/{_q(bare, 0.99):.2f}/"
        f"{max(bare):.1f} ({len(host)} host, {len(bare)} bare deltas)"
    )
    if late:
        before = sum(1 for up, down in late if up - base >= down)
        print(
            f"  {len(late)} host deltas late by > 4 ms beyond the bare p50: {before} held mostly"
            f" before the worker's driver had them, {len(late) - before} after it"
        )


def read_stamps(folder: Path) -> list[tuple[float, str]]:
    """Every process's stamps, (ms, point), in time order."""
    stamps: list[tuple[float, str]] = []
    for tsv in folder.glob("*.tsv"):
        for line in tsv.read_text().splitlines():
            if line and not line.startswith("#"):
                row = line.split("\t")
                stamps.append((float(row[1]), row[0]))
    stamps.sort()
    return stamps


def per_turn_stamps(folder: Path, provider: str) -> tuple[list[dict[str, float]], Any]:
    """Each timed host Turn's first stamp of each point (`#first` / `#last` for the repeated
    ones), with the fake model's request and last delta; and the run's figures."""
    stamps = read_stamps(folder)
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
    return per_turn, (fig, stamps, starts, ends)


def main() -> None:
    folder = Path(sys.argv[1])
    provider = sys.argv[2] if len(sys.argv) > 2 else "tutti-agent"
    per_turn, (fig, stamps, starts, ends) = per_turn_stamps(folder, provider)
    print(f"{provider}: {len(per_turn)} host Turns, median ms of each stage")
    for label, spans, optional in legs(per_turn):
        if spans:
            print(f"  {statistics.median(spans):7.2f}  {label}")
        else:
            print(f"  {'-':>7}  {label}  ({'none this run' if optional else 'no stamps'})")
    for point, why in DROPPED:
        print(f"  gone: {point} ({why})")
    bare_b, bare_a = fig["bareBeforeModel"]["p50"], fig["bareAfterModel"]["p50"]
    print(f"  bare: before the model {bare_b:.2f}, after it {bare_a:.2f} (p50)")
    compare_app_servers(folder, starts, ends)
    delta_holds(stamps, starts, ends)


if __name__ == "__main__":
    main()
