"""A Codex fork's read of its source's Turns, two ways, against the real pinned `codex
app-server` (the model faked): one `thread/read` with the Turns (`Runtimes.thread_turns`, as a
fork read them) and `thread/turns/list` page by page (`Runtimes.list_turns`, as the history
reads them, and a fork now). On a warm server whose thread holds `TURNS` Turns, batches of
`N` reads each way, alternating (A, B, A, B, …: `PAIRS` pairs); prints per batch the CPU a
read of the app-server (its threads' `/proc/PID/task/*/schedstat` run time) and of this
process (the client's request, its reader's decode), µs.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.codex_fork_read [TURNS] [N] [PAIRS]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from bench.providers import BareAppServer, _codex_bare, _codex_environment
from drivers.app_server.runtimes import Runtimes
from drivers.app_server.state import Runtime


def server_ns(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except OSError:
            continue
    return total


class _Shim:
    """What `Runtimes.list_turns` uses of a `Runtime`: its process."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc


def main(argv: list[str]) -> int:
    turns = int(argv[0]) if argv else 5
    n = int(argv[1]) if len(argv) > 1 else 50
    pairs = int(argv[2]) if len(argv) > 2 else 8
    with _codex_environment() as config, tempfile.TemporaryDirectory(prefix="fork-read-") as tmp:
        bare = cast(BareAppServer, _codex_bare(Path(tmp) / "home", turns, config))
        try:
            proc, thread = bare.proc, bare.thread_id
            from drivers.codex.driver import CodexProvider

            runtimes = Runtimes(CodexProvider({}), 60.0)
            shim = cast(Runtime, _Shim(proc))

            def read() -> int:
                return len(runtimes.thread_turns(shim, thread))

            def listed() -> int:
                return len(runtimes.list_turns(shim, thread))

            assert read() == listed() == turns, (read(), listed())
            pid = proc.pid
            assert pid is not None
            for i in range(pairs):
                for name, fn in (("read", read), ("list", listed)):
                    s0, c0 = server_ns(pid), time.process_time_ns()
                    for _ in range(n):
                        fn()
                    server = (server_ns(pid) - s0) / n / 1000
                    client = (time.process_time_ns() - c0) / n / 1000
                    print(
                        f"pair={i} {name} turns={turns} app-server={server:.0f}us "
                        f"client={client:.0f}us",
                        flush=True,
                    )
        finally:
            bare.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
