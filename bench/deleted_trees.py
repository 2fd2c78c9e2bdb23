"""`session.create` against a store holding many deleted worktree fork children's trees.

Each `session.create` asks, in its write transaction, whether its `cwd` lies in the tree of a
deleted fork child (`storage.fork_workspace.deleted_tree_at`: refused there). A store of
months keeps every such tree's row (`removed`) for good. The store is built with N committed
worktree forks whose trees are `removed` (plain SQL, the rows a `session.delete {worktree:
"remove"}` leaves: the tree's plan, its state, and — from schema v25 — its path beside), then
a real `agenthost serve` on it answers `session.create` calls one after another over its
socket: the client's wall time per call (p50, p90) and the daemon process's CPU per call.

`build/venv/bin/python -m bench.deleted_trees [--trees 0,2000] [--creates 400] [--json F]`.

`--migrate STORE`: a copy of STORE (e.g. `bench.months`' cached store of an older schema)
brought to this build's schema by `storage.schema.migrate`, timed: what the first start of a
daemon on it spends migrating (`bench.months` reuses an older schema's cache, so its first
start pays this). The copy is made beside it in `--scratch` and removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import apsw

from bench.common import Latency
from bench.harness import WS, BenchDaemon, sample
from storage.schema import migrate, user_version
from storage.sqlite import open_connection
from storage.store import Store


def build(home: Path, trees: int) -> None:
    """The store with `trees` committed worktree forks whose trees are `removed`."""
    home.mkdir(parents=True)
    Store.open(home / "store.sqlite3").close()
    conn = apsw.Connection(str(home / "store.sqlite3"))
    conn.execute("PRAGMA foreign_keys = OFF")  # operation rows alone, no Sessions
    columns = {str(r[1]) for r in conn.execute("PRAGMA table_info(fork_operations)")}
    path_column = "deleted_tree_path" in columns
    conn.execute("BEGIN")
    conn.execute("INSERT OR IGNORE INTO workspaces VALUES (?, 1)", (WS,))
    for n in range(trees):
        short = uuid.uuid4().hex[:8]
        path = f"/srv/projects/p{n % 40}.agenthost/{short}"
        plan = {
            "path": path,
            "childCwd": path,
            "branch": f"agenthost/bench-{short}",
            "repoRoot": f"/srv/projects/p{n % 40}",
            "headCommit": "0" * 40,
        }
        conn.execute(
            "INSERT INTO fork_operations (workspace_id, operation_id, request_id, request_hash,"
            " source_session_id, target_session_id, point_kind, source_turn_id,"
            " source_provider_session_id, source_provider_turn_id, source_provider_turn_ids,"
            " target_title, driver_kind, driver_version, binding_mode, snapshot_hash, status,"
            " created_at_ms, client_observed_at_ms, barrier, stage, workspace_mode,"
            " workspace_json, workspace_state"
            + (", deleted_tree_path" if path_column else "")
            + ") VALUES (?, ?, ?, 'h', 'src', ?, 'throughTurn', 't', 'p', 'pt', '[]', 't', 'd',"
            " '1', 'host_copy', 's', 'committed', 1, 2, 0, 1, 'worktree', ?, 'removed'"
            + (", ?" if path_column else "")
            + ")",
            (
                WS,
                f"op-{n}",
                f"req-{n}",
                f"child-{n}",
                json.dumps(plan, sort_keys=True, separators=(",", ":")),
                *([path] if path_column else []),
            ),
        )
    conn.execute("COMMIT")
    conn.close()


def measure(trees: int, creates: int, root: Path) -> dict[str, Any]:
    home = root / f"home-{trees}"
    build(home, trees)
    with BenchDaemon(home).start() as d:
        c = d.client()
        for _ in range(30):  # warm: statement caches, the actor threads
            c.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})
        before = sample(d.pid)
        walls: list[float] = []
        for _ in range(creates):
            t0 = time.perf_counter()
            c.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})
            walls.append((time.perf_counter() - t0) * 1000)
        after = sample(d.pid)
    assert before is not None and after is not None
    lat = Latency.of(walls)
    return {
        "trees": trees,
        "creates": creates,
        "p50_ms": round(lat.p50, 3),
        "p90_ms": round(lat.p90, 3),
        "daemon_cpu_ms_per_create": round((after.cpu_s - before.cpu_s) * 1000 / creates, 3),
    }


def migrate_copy(store: Path, scratch: Path) -> dict[str, Any]:
    """A copy of `store` migrated to this build's schema: the migration's wall and CPU time."""
    scratch.mkdir(parents=True, exist_ok=True)
    copy = scratch / "store.sqlite3"
    shutil.copyfile(store, copy)
    os.sync()  # the copy written back first: the migration's own commit does not wait on it
    try:
        conn = open_connection(str(copy))
        wall, cpu = time.perf_counter(), time.process_time()
        found = migrate(conn)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        version = user_version(conn)
        conn.close()
    finally:
        for leftover in scratch.glob("store.sqlite3*"):
            leftover.unlink()
    return {
        "store": str(store),
        "bytes": store.stat().st_size,
        "from": found,
        "to": version,
        "migrate_wall_s": round(wall, 3),
        "migrate_cpu_s": round(cpu, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default="0,2000", help="deleted trees, comma-separated")
    parser.add_argument("--creates", type=int, default=400)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--migrate", type=Path, help="time migrating a copy of this store")
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    if args.migrate:
        print(json.dumps(migrate_copy(args.migrate, args.scratch / "bench-migrate")), flush=True)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-deleted-trees-") as tmp:
        for trees in (int(t) for t in args.trees.split(",")):
            row = measure(trees, args.creates, Path(tmp))
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
