"""Crash workload for group commit: 8 threads write through one store; each prints
`ack <id>` only after its write returned (was acknowledged), and `group <n>` whenever the
largest group commit grows. Run as `python group_crash_worker.py STORE`; the test SIGKILLs it.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from storage.store import Store

WS = "group-crash"
THREADS = 8


def main() -> None:
    store = Store.open(sys.argv[1])
    out = threading.Lock()
    tag = sys.argv[2]
    largest = 0

    def say(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def work(n: int) -> None:
        nonlocal largest
        i = 0
        while True:
            i += 1
            sid = f"{tag}-{n}-{i}"
            store.sessions.create_session(
                WS, session_id=sid, provider="p", title=sid, cwd="/", settings={}
            )
            say(f"ack {sid}")
            grown = store.db.write_stats.largest_group
            if grown > largest:
                largest = grown
                say(f"group {grown}")

    say("ready")
    for n in range(THREADS):
        threading.Thread(target=work, args=(n,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
