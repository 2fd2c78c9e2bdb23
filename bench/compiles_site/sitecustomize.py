"""Loaded by a daemon whose PYTHONPATH this folder is on (e.g. under `bench.mutations`): every
store connection watched as bench/statement_compiles.py watches it (compilations by the
authorizer and `trace_v2`, apsw's `cache_stats()`), by connection kind. Inert unless
`AGENTHOST_COMPILES_OUT` names a file, and then only in the daemon (`serve`): each second the
cumulative counts by kind, `[wall, {kind: [connections, compiles, hits, misses, evictions,
too_big, no_cache]}, {kind: SQL compiled: times}]`, appended to that file as a JSON line.

    AGENTHOST_COMPILES_OUT=/tmp/c.jsonl PYTHONPATH=$TREE/bench/compiles_site \\
        build/venv/bin/python -m bench.mutations --quick
    build/venv/bin/python -m bench.statement_compiles --series /tmp/c.jsonl
"""

from __future__ import annotations

import os
import sys

_OUT = os.environ.get("AGENTHOST_COMPILES_OUT")

if _OUT and "serve" in sys.argv:
    import importlib.util
    import json
    import threading
    import time
    from pathlib import Path

    # By its path beside this folder: the daemon's tree (which leads PYTHONPATH) may have none.
    _spec = importlib.util.spec_from_file_location(
        "_statement_compiles", Path(__file__).resolve().parent.parent / "statement_compiles.py"
    )
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    CACHE_KEYS, WATCHED = _mod.CACHE_KEYS, _mod.WATCHED
    _mod.install()

    def _dump() -> None:
        while True:
            time.sleep(1.0)
            totals: dict[str, list[int]] = {}
            sql: dict[str, int] = {}
            for w in list(WATCHED):
                for text, n in w.snapshot()[2].items():
                    sql[f"{w.kind}: {text}"] = sql.get(f"{w.kind}: {text}", 0) + n
                row = totals.setdefault(w.kind, [0] * (2 + len(CACHE_KEYS)))
                compiles, stats, _ = w.snapshot()
                row[0] += 1
                row[1] += compiles
                for i, k in enumerate(CACHE_KEYS):
                    row[2 + i] += stats[k]
            with open(_OUT, "a") as f:
                f.write(json.dumps([time.time(), totals, sql]) + "\n")

    threading.Thread(target=_dump, name="compiles-dump", daemon=True).start()
