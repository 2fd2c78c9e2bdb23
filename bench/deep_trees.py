"""`session.lineage` of deep and wide fork trees through a real daemon: time and memory.

Two stores are built through the public store API before the daemon starts (one real fork
saga, its rows replicated: `bench.fork_trees`): a chain of 600 forks, each a fork of the one
before, and a Session with 5,000 forks. For each, a fresh `agenthost serve` is started on it and
`session.lineage` is read: the first read after start (cold caches) and the best and median of
the next `rounds`, for the reads a client makes: the chain from its top (the default page of
100 levels, and the widest allowed, 300), from its leaf (600 ancestors), the wide Session whole
(5,000 nodes) and in pages of 1,000. Each row gives the reply's msgpack bytes, and the daemon's
RSS before the reads and after, and its peak (VmHWM). Nothing is asserted; figures are printed
with the command that reproduces them (quoted in docs/performance.md, "Deep and wide fork trees").

    build/venv/bin/python -m bench.deep_trees [--chain 600] [--fan 5000] [--rounds 5]
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
from typing import Any

import msgpack

from bench.fork_trees import build_tree
from bench.harness import WS, BenchDaemon, sample
from storage.store import Store
from transport.client import Client


def _read(c: Client, sid: str, **extra: Any) -> tuple[float, int, dict[str, Any]]:
    started = time.perf_counter()
    result = c.call("session.lineage", {"workspaceId": WS, "agentSessionId": sid, **extra})
    took = time.perf_counter() - started
    return took, len(msgpack.packb(result, use_bin_type=True)), dict(result)


def _case(
    base: Path, shape: str, size: int, rounds: int, reads: list[tuple[str, str, dict[str, Any]]]
) -> list[list[str]]:
    home = base / shape / "home"
    home.mkdir(parents=True)
    store = Store.open(home / "store.sqlite3")
    started = time.perf_counter()
    root, forks = build_tree(store, WS, shape, size)
    built = time.perf_counter() - started
    store.close()
    print(f"# {shape}: {size} forks built through the store API in {built:.2f} s", flush=True)
    rows: list[list[str]] = []
    daemon = BenchDaemon(home).start()
    try:
        c = daemon.client(timeout=120)
        before = sample(daemon.pid)
        for name, which, extra in reads:
            sid = {"root": root, "leaf": forks[-1]}[which]
            first, size_bytes, result = _read(c, sid, **extra)
            times = [_read(c, sid, **extra)[0] for _ in range(rounds)]
            cut = result.get("truncated")
            rows.append(
                [
                    name,
                    f"{first * 1000:.1f}",
                    f"{min(times) * 1000:.1f}",
                    f"{statistics.median(times) * 1000:.1f}",
                    f"{size_bytes / 1024:.0f}",
                    "-" if cut is None else str(cut["reason"]),
                ]
            )
        after = sample(daemon.pid)
        assert before is not None and after is not None
        rows.append(
            [
                f"daemon RSS (MB): {before.rss_mb:.0f} before the reads, {after.rss_mb:.0f}"
                f" after, peak {after.hwm_mb:.0f}",
                "",
                "",
                "",
                "",
                "",
            ]
        )
    finally:
        daemon.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chain", type=int, default=600)
    parser.add_argument("--fan", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="ah-trees-"))
    try:
        rows = _case(
            base,
            "chain",
            args.chain,
            args.rounds,
            [
                ("chain from its top (default page: 100 levels)", "root", {}),
                ("chain from its top, maxDepth 300", "root", {"maxDepth": 300}),
                (f"chain from its leaf ({args.chain} ancestors)", "leaf", {}),
            ],
        )
        rows += _case(
            base,
            "fan",
            args.fan,
            args.rounds,
            [
                (f"Session with {args.fan} forks, whole", "root", {}),
                ("the same, a page of 1,000 (maxNodes)", "root", {"maxNodes": 1000}),
            ],
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    head = ["read", "first ms", "best ms", "median ms", "reply KiB", "truncated"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    command = "build/venv/bin/python -m bench.deep_trees " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items()
    )
    print(f"\nreproduce: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
