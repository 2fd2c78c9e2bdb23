"""One `session.timeline` page (limit 20, no `afterSequence`: bench.mutations' read) of a
Session of bench-shaped Turns, in this process: what it runs and its CPU.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.timeline_page [--turns 60] [--pages 2000]

The Turns are the ones a bench.mutations client leaves: a user Message, an assistant reply
with its provider item payload, a provider binding and a workspace checkpoint record. Counts
(the same on any machine): Python calls (cProfile), the standard library's `json.loads` calls,
statements (apsw's exec trace) and the reply's msgpack bytes. CPU (this thread's, best and
median of 5 rounds of `--pages` pages): the page read again and again (SQLite's page cache
warm), and the page read right after another connection's commit (as in the daemon, where
every commit drops the readers' page caches).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from agenthost.api import timeline_result
from agenthost.catalog import Catalog
from bench.common import cpu_probe_ms
from protocol.envelope import encode_result
from storage.store import Store

WS = "ws-bench"
CHECKPOINT = {
    "cwd": "/tmp/bench/home-work",
    "before": "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    "after": "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    "changedFiles": [],
    "headCommit": None,
    "repoRoot": None,
    "tooLarge": [],
}


def bench_session(store: Store, turns: int) -> str:
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        WS, session_id=sid, provider="tutti-agent", title="t", cwd="/w", settings={}
    )
    for i in range(turns):
        turn, _ = store.turns.claim_submit(WS, sid, str(uuid.uuid4()), f"mutation {i}")
        store.turns.record_provider_turn(WS, sid, turn.turn_id, str(uuid.uuid4()))
        payload = {"providerItemId": f"msg_{uuid.uuid4()}", "providerItemType": "agentMessage"}
        reply = store.history.append_message(
            WS, sid, turn.turn_id, kind="assistant", text=f"echo: mutation {i}", payload=payload
        )
        store.turns.record_settlement(
            WS,
            sid,
            turn.turn_id,
            outcome="completed",
            final_assistant_message_id=reply.message_id,
            checkpoint_json=json.dumps(CHECKPOINT),
        )
    return sid


def _cpu_us(
    fn: Callable[[], object], pages: int, between: Callable[[], None] | None
) -> list[float]:
    rounds = []
    for _ in range(5):
        spent = 0.0
        for _ in range(pages):
            if between is not None:
                between()
            c0 = time.thread_time()
            fn()
            spent += time.thread_time() - c0
        rounds.append(spent / pages * 1e6)
    return sorted(rounds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--pages", type=int, default=1000)
    args = parser.parse_args(argv)
    print(
        f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.2f},"
        f" cpu probe {cpu_probe_ms():.1f} ms"
    )
    with tempfile.TemporaryDirectory(prefix="timeline-page-") as tmp:
        store = Store.open(Path(tmp) / "store.sqlite3")
        try:
            sid = bench_session(store, args.turns)
            other = str(uuid.uuid4())
            store.sessions.create_session(
                WS, session_id=other, provider="tutti-agent", title="o", cwd="/w", settings={}
            )
            catalog = Catalog()

            def page() -> bytes:
                return encode_result("r", 200, timeline_result(store, catalog, WS, sid, 0, 20))

            frame = page()
            statements: list[str] = []

            def trace(_cursor: object, sql: str, _bindings: object) -> bool:
                statements.append(sql.split(None, 1)[0])
                return True

            conn = store.db.connection()
            conn.exec_trace = trace
            page()
            conn.exec_trace = None
            profile = cProfile.Profile()
            profile.enable()
            page()
            profile.disable()
            decoded = 0
            standard = json.loads

            def counting(text: object, *a: object, **k: object) -> object:
                nonlocal decoded
                decoded += 1
                return standard(text, *a, **k)  # type: ignore[arg-type]

            json.loads = counting  # type: ignore[assignment]
            try:
                page()
            finally:
                json.loads = standard
            calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
            print(
                f"a page: {len(frame)} bytes, {len(statements)} statements"
                f" ({' '.join(statements)}), {calls} Python calls, {decoded} json.loads"
            )
            writes = iter(range(10**9))

            def commit_elsewhere() -> None:  # the writer's connection, on its own thread
                title = f"t{next(writes)}"
                t = threading.Thread(target=store.sessions.update_title, args=(WS, other, title))
                t.start()
                t.join()

            for _ in range(200):
                page()
            warm = _cpu_us(page, args.pages, None)
            cold = _cpu_us(page, max(1, args.pages // 4), commit_elsewhere)
            print(f"CPU µs a page, warm: best {warm[0]:.0f}, median {warm[2]:.0f}")
            print(
                f"CPU µs a page after a commit elsewhere: best {cold[0]:.0f}, median {cold[2]:.0f}"
            )
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
