"""The store's WAL checkpoint alone, without the daemon: whether a checkpoint holds the GIL
(`gil`), and what eight writers that never pause do to the WAL and their COMMITs (`writers`),
tree against tree.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall_wal gil
    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall_wal rename main=/tmp/base \
        branch=$TREE --order main,branch,main,branch
    PYTHONPATH=$TREE build/venv/bin/python -m bench.stall_wal writers main=/tmp/base \\
        branch=$TREE --order main,branch,main,branch [--seconds 3] [--dir /tmp]

`gil`: a WAL of ~2,000 frames checkpointed (PASSIVE, the store's own `open_connection`) on one
thread while another spins in Python; the spinner's longest gap is how long the checkpoint kept
the GIL. `writers`: each tree's `Store` in a fresh file, eight threads renaming their own Session
with a 3,000-character title and two threads reading, for `--seconds`; the renames, the COMMITs
that overlapped a checkpoint pass against the others, and the WAL's greatest length (the WAL
hook's count after each COMMIT) and its file's size at the end. `rename`: one thread renaming
one Session 20,000 times on /dev/shm (no disk wait), tree against tree: the process CPU per
rename and the statements the writer connection ran for one (SQLite's exec trace).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FRAME = 4096 + 24


def _spin(stop: threading.Event, worst: list[float]) -> None:
    """Python work in a loop, keeping its longest gap between two iterations."""
    last = time.perf_counter()
    while not stop.is_set():
        now = time.perf_counter()
        worst[0] = max(worst[0], now - last)
        last = now


def gil_probe(rounds: int = 5) -> None:
    import apsw

    from storage.sqlite import open_connection

    with tempfile.TemporaryDirectory(prefix="stall-wal-") as tmp:
        path = str(Path(tmp) / "probe.sqlite3")
        writer = open_connection(path)
        writer.set_wal_hook(lambda _c, _d, _p: apsw.SQLITE_OK)  # no auto-checkpoint
        writer.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        for r in range(rounds):
            with writer:
                for i in range(2000):
                    writer.execute(
                        "INSERT OR REPLACE INTO t VALUES (?, randomblob(3000))", (r * 2000 + i,)
                    )
            conn = open_connection(path)
            stop = threading.Event()
            worst = [0.0]

            spinner = threading.Thread(target=_spin, args=(stop, worst))
            spinner.start()
            time.sleep(0.02)
            t0, c0 = time.perf_counter(), time.thread_time()
            row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            took, cpu = time.perf_counter() - t0, time.thread_time() - c0
            time.sleep(0.005)
            stop.set()
            spinner.join()
            conn.close()
            # The control: the same spinner as long without a checkpoint (on a busy machine
            # its gaps are the kernel's preemptions, not the GIL).
            stop, control = threading.Event(), [0.0]
            spinner = threading.Thread(target=_spin, args=(stop, control))
            spinner.start()
            time.sleep(took + 0.025)
            stop.set()
            spinner.join()
            print(
                f"round {r}: PASSIVE checkpoint of {row[2]} frames {took * 1000:.1f} ms (its"
                f" thread's CPU {cpu * 1000:.1f} ms); the Python spinner's longest gap"
                f" {worst[0] * 1000:.2f} ms, {control[0] * 1000:.2f} ms in as long without one"
            )
        writer.close()


def writers(directory: str, seconds: float) -> dict[str, Any]:
    """One tree's run (this process imports the tree on its PYTHONPATH)."""
    from storage.base import Database
    from storage.store import Store

    commits: list[tuple[float, float]] = []
    passes: list[tuple[float, float]] = []
    longest = [0]
    inner_end = Database._end_group

    def end_group(self: Any, group: Any, conn: Any) -> None:
        t0 = time.perf_counter()
        inner_end(self, group, conn)
        commits.append((t0, time.perf_counter()))

    Database._end_group = end_group  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(dir=directory, prefix="stall-wal-") as tmp:
        path = Path(tmp) / "store.sqlite3"
        store = Store.open(path)
        db = store.db
        inner_grew = db._wal_grew

        def grew(conn: Any, name: str, pages: int) -> int:
            longest[0] = max(longest[0], pages)
            return inner_grew(conn, name, pages)

        db._wal_grew = grew  # type: ignore[method-assign]  # bound at the first write
        if hasattr(Database, "_checkpoint_pass"):
            inner_pass = db._checkpoint_pass

            def timed_pass(conn: Any) -> tuple[int, int]:
                t0 = time.perf_counter()
                got = inner_pass(conn)
                passes.append((t0, time.perf_counter()))
                return got

            db._checkpoint_pass = timed_pass  # type: ignore[method-assign]
        else:  # a tree from before the pass was a method: its loop, timed

            def loop() -> None:
                while True:
                    db._checkpoint_due.wait()
                    db._checkpoint_due.clear()
                    if db._closed:
                        return
                    with db.lease() as conn:
                        t0 = time.perf_counter()
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                        passes.append((t0, time.perf_counter()))

            db._checkpoint_loop = loop  # type: ignore[method-assign]
        for i in range(8):
            store.sessions.create_session(
                "ws", session_id=f"s{i}", provider="p", title="t", cwd="/", settings={}
            )
        stop_at = time.monotonic() + seconds
        latencies: list[float] = []

        def rename(i: int) -> None:
            n = 0
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                store.sessions.update_title("ws", f"s{i}", f"{n:06d}" + "x" * 3000)
                latencies.append(time.perf_counter() - t0)
                n += 1

        def read() -> None:
            while time.monotonic() < stop_at:
                db.rows("SELECT session_id, title FROM sessions")
                time.sleep(0.002)

        threads = [threading.Thread(target=rename, args=(i,)) for i in range(8)]
        threads += [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wal_file = os.path.getsize(f"{path}-wal") // FRAME
        stats = db.write_stats.snapshot()
        store.close()

    def ms(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return (
            round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)
            if values
            else 0.0
        )

    beside = [b - a for a, b in commits if any(p0 < b and a < p1 for p0, p1 in passes)]
    others = [b - a for a, b in commits if not any(p0 < b and a < p1 for p0, p1 in passes)]
    return {
        "renamesPerS": round(len(latencies) / seconds),
        "renameP50": ms(latencies, 0.5),
        "renameP99": ms(latencies, 0.99),
        "commitsBeside": [len(beside), ms(beside, 0.5), ms(beside, 0.99)],
        "commitsOther": [len(others), ms(others, 0.5), ms(others, 0.99)],
        "checkpointPasses": len(passes),
        "walRestarts": stats.get("wal_restarts", 0),
        "walLongest": longest[0],
        "walFile": wal_file,
    }


def rename_cost(n: int = 20_000) -> dict[str, Any]:
    """One tree's single-threaded renames (this process imports the tree on its PYTHONPATH)."""
    from storage.store import Store

    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="stall-wal-") as tmp:
        store = Store.open(Path(tmp) / "store.sqlite3")
        try:
            store.sessions.create_session(
                "ws", session_id="s0", provider="p", title="t", cwd="/", settings={}
            )
            for i in range(500):
                store.sessions.update_title("ws", "s0", f"warm {i}")
            statements: list[str] = []
            writer = store.db._writer_connection()
            writer.set_exec_trace(lambda _c, sql, _b: statements.append(sql.split()[0]) or True)
            store.sessions.update_title("ws", "s0", "traced")
            writer.set_exec_trace(None)
            c0 = time.process_time()
            for i in range(n):
                store.sessions.update_title("ws", "s0", f"title {i}")
            cpu_us = (time.process_time() - c0) / n * 1e6
        finally:
            store.close()
    return {"cpuUsPerRename": round(cpu_us, 1), "statements": statements}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=("gil", "writers", "rename", "one", "one-rename"))
    p.add_argument("trees", nargs="*", help="NAME=PATH of each tree (writers)")
    p.add_argument("--order", default="", help="the names, comma-separated, run in order")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    args = p.parse_args(argv)
    if args.what == "gil":
        gil_probe()
        return 0
    if args.what == "one":  # one tree's run, in the process its PYTHONPATH made
        print(json.dumps(writers(args.dir, args.seconds)))
        return 0
    if args.what == "one-rename":
        print(json.dumps(rename_cost()))
        return 0
    trees = dict(t.split("=", 1) for t in args.trees)
    for name in args.order.split(","):
        tree = Path(trees[name]).resolve()
        # This file run in a process whose PYTHONPATH is the tree alone (a base tree may not
        # have this module): the store it measures is the tree's.
        code = (
            "import runpy, sys; sys.argv = sys.argv[1:];"
            " runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                __file__,
                "one-rename" if args.what == "rename" else "one",
                "--seconds",
                str(args.seconds),
                "--dir",
                args.dir,
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"{name}: {out.stdout.strip().splitlines()[-1]}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
