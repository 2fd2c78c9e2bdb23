"""The worker's bind and readability proof of a fork child whose copied lines the binder has
validated before (`drivers.binder.ParsedSpans`), against the same work with no span kept:
children of one source, each forked through its last Turn by tutti_agent's own `ForkService`
as the app-server forks them (`loaded: false`, lean turns), bound into a fresh target home and
proven there by `drivers.tutti_agent.prove_tutti_child`, alternating `off` (a binder keeping no
span: every line decoded, lines built and reduced again) and `on` (the default binder) child
by child. Per side: CPU ms of the bind and of the proof, and the wall of bind + proof + the
names' round (medians; each side's first fork left out: `on`'s keeps the span then).

The source: `--rollout PATH` (copied into a temporary home, never touched in place), else the
10,000-Turn Session's rollout of `bench.months`' cached store (`--scale`, built on first use),
else (`--turns N`) a generated source of N Turns.

    build/venv/bin/python -m bench.bind_spans [--children 8] [--rollout PATH | --turns 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import cpu_probe_ms


def _source(tmp: Path, rollout: Path | None, turns: int, scale: float) -> tuple[Path, str]:
    """(home, thread id) of the source, in `tmp`."""
    home = tmp / "source"
    if rollout is None and not turns:
        from bench.harness import WS
        from bench.months import SESSION, Size, _id, cached_home

        cache = cached_home(Size.of(scale))
        rollout = next((cache / "runtimes" / WS / _id(SESSION, 0)).rglob("rollout-*.jsonl"))
    if rollout is not None:
        dest = home / "sessions" / "2026" / "01" / "01" / rollout.name
        dest.parent.mkdir(parents=True)
        shutil.copyfile(rollout, dest)
        return home, rollout.name[-len(".jsonl") - 36 : -len(".jsonl")]
    from tests.tutti_agent.items import explicit_turn
    from tests.tutti_agent.storeutil import write_root
    from tutti_agent.store import ThreadStore

    items = [it for i in range(turns) for it in explicit_turn(f"t{i}", "u " * 40, "a " * 100)]
    return home, write_root(ThreadStore(home), items)


def measure(home: Path, thread_id: str, children: int, tmp: Path) -> dict[str, list[float]]:
    import tutti_agent
    from drivers.binder import ParsedSpans, RolloutBinder
    from drivers.tutti_agent import prove_tutti_child
    from tutti_agent.fork import ForkOptions, ForkService, ThroughTurn
    from tutti_agent.history import build_turns
    from tutti_agent.rollout import gc_paused
    from tutti_agent.store import ThreadStore

    store = ThreadStore(home)
    prefix = [str(t.id) for t in build_turns(store.load(thread_id).items, with_items=False)]
    options = ForkOptions(
        boundary=ThroughTurn(prefix[-1]), turn_items=False, keep_child_parse=False
    )
    kids = []
    for _ in range(2 * children):
        forked = ForkService(store).fork(thread_id, options)
        child = forked.child.thread_id if forked.child is not None else None
        if child is None and forked.head is not None:
            child = forked.head.thread_id
        assert child is not None
        kids.append(child)
    del store
    sides = {"off": RolloutBinder(spans=ParsedSpans(max_bytes=0)), "on": RolloutBinder()}
    out: dict[str, list[float]] = {f"{s} {k}": [] for s in sides for k in ("bind", "proof", "wall")}
    for i in range(children):
        order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        for n, side in enumerate(order):
            child = kids[2 * i + n]
            target = tmp / f"{side}-{i}"
            with gc_paused():
                t0, c0 = time.perf_counter(), time.thread_time()
                receipt, names = sides[side].begin(home, target, child)
                c1 = time.thread_time()
                problem = prove_tutti_child(
                    target, child, thread_id, prefix, tutti_agent.__version__, receipt.parsed
                )
                c2 = time.thread_time()
                names.wait()
                wall = time.perf_counter() - t0
            if problem is not None:
                raise RuntimeError(f"the proof refused a good child: {problem}")
            if i:  # the first of each side left out
                out[f"{side} bind"].append((c1 - c0) * 1000)
                out[f"{side} proof"].append((c2 - c1) * 1000)
                out[f"{side} wall"].append(wall * 1000)
            del receipt
            shutil.rmtree(target)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.bind_spans", description=__doc__)
    ap.add_argument("--children", type=int, default=8, help="forks per side")
    ap.add_argument("--rollout", type=Path, default=None)
    ap.add_argument("--turns", type=int, default=0, help="a generated source of N Turns")
    ap.add_argument("--scale", type=float, default=1.0, help="bench.months' store, scaled")
    args = ap.parse_args(argv)
    import os

    load, probe = os.getloadavg()[0], cpu_probe_ms()
    with tempfile.TemporaryDirectory(prefix="bench-bind-spans-") as text:
        tmp = Path(text)
        home, thread_id = _source(tmp, args.rollout, args.turns, args.scale)
        got = measure(home, thread_id, max(2, args.children), tmp)
    print(
        f"bind + proof of a fork child, spans off vs on (load {load:.1f}, CPU probe {probe:.0f} ms)"
    )
    for side in ("off", "on"):
        bind, proof, wall = (
            statistics.median(got[f"{side} {k}"]) for k in ("bind", "proof", "wall")
        )
        n = len(got[f"{side} bind"])
        print(
            f"  {side:3}: bind CPU {bind:8.2f} ms   proof CPU {proof:8.2f} ms   "
            f"bind + proof + names' round wall {wall:8.2f} ms   (medians of {n})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
