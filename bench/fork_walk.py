"""The walk of one `fork.create`: which of the repository's files run code while one fork of a
warm tutti-agent Session goes from the client's call to its committed reply, in the client, the
daemon, its worker and the provider's app-server.

Every Python process of the daemon's tree is started with `bench/walk_site` first on its
PYTHONPATH, whose `sitecustomize` records the milliseconds at which each file of ours ran (see
it); this process records its own client side the same way. Files that also run while the
daemon is idle for as long (timers, the connection guard's poll) are counted apart, so the
figure is what the fork itself runs. Not a timing benchmark: the profiler slows every call.

    build/venv/bin/python -m bench.fork_walk [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from bench.common import REPO
from bench.harness import BenchDaemon, create_session, fork_until_terminal, run_turn

WALK_SITE = REPO / "bench" / "walk_site"


def _record_self() -> tuple[dict[str, list[int]], Callable[[], None]]:
    seen: dict[str, list[int]] = defaultdict(list)
    skip = tuple(str(REPO / d) + os.sep for d in ("tests", "bench", "build"))

    def profile(frame: object, event: str, arg: object) -> None:
        if event != "call":
            return
        name: str = frame.f_code.co_filename  # type: ignore[attr-defined]
        if name.startswith(str(REPO)) and not name.startswith(skip):
            stamps = seen[name]
            ms = int(time.time() * 1000)
            if not stamps or stamps[-1] != ms:
                stamps.append(ms)

    def stop() -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    sys.setprofile(profile)
    threading.setprofile(profile)
    return seen, stop


def _touched(files: dict[str, list[int]], start: int, end: int) -> set[str]:
    return {name for name, stamps in files.items() if any(start <= s <= end for s in stamps)}


def _read_dumps(folder: Path) -> list[tuple[list[str], dict[str, list[int]]]]:
    """(argv, files) of every process that ran with the walk's sitecustomize."""
    dumps = []
    for path in sorted(folder.glob("*.json")):
        try:
            dump = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        dumps.append((list(dump["argv"]), dict(dump["files"])))
    return dumps


def _process(argv: list[str]) -> str:
    text = " ".join(argv)
    if "worker" in text:
        return "worker"
    if "tutti-agent" in text or "tutti_agent" in text:
        return "app-server"
    return "daemon"


def walk() -> dict[str, object]:
    """The files of one fork, by process; this process's environment is left as it was (the
    daemon it starts inherits the walk's variables, nothing started after it does)."""
    saved = {
        k: os.environ.get(k) for k in ("AGENTHOST_WALK_DIR", "AGENTHOST_WALK_ROOT", "PYTHONPATH")
    }
    try:
        return _walk()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _walk() -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="fork-walk-") as tmp:
        trace = Path(tmp) / "trace"
        trace.mkdir()
        os.environ["AGENTHOST_WALK_DIR"] = str(trace)
        os.environ["AGENTHOST_WALK_ROOT"] = str(REPO)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(WALK_SITE), os.environ.get("PYTHONPATH", "")) if p
        )
        with BenchDaemon(Path(tmp) / "home") as daemon:
            daemon.start()
            c = daemon.client()
            sid = create_session(c)
            turn = run_turn(c, sid, "warm the runtime")
            run_turn(c, sid, "and once more")
            time.sleep(1.0)
            client_seen, stop = _record_self()
            t0 = int(time.time() * 1000)
            op = fork_until_terminal(c, sid, turn)
            t1 = int(time.time() * 1000)
            stop()
            assert op["status"] in ("committed", "acknowledged"), op
            time.sleep(1.0)  # the idle window, as long as the fork's, after it
            idle_start = t1 + 300
            idle_end = idle_start + (t1 - t0)
            time.sleep(max(0.0, (idle_end - int(time.time() * 1000)) / 1000) + 0.5)
            dumps = _read_dumps(trace)
        by_process: dict[str, set[str]] = defaultdict(set)
        idle: set[str] = set()
        for argv, files in dumps:
            by_process[_process(argv)] |= _touched(files, t0, t1)
            idle |= _touched(files, idle_start, idle_end)
        by_process["client"] = _touched(client_seen, t0, t1)
    rel = {k: sorted(os.path.relpath(f, REPO) for f in v) for k, v in by_process.items()}
    every = sorted({f for v in rel.values() for f in v})
    idle_rel = sorted(os.path.relpath(f, REPO) for f in idle)
    return {
        "forkMs": t1 - t0,
        "files": every,
        "byProcess": rel,
        "alsoIdle": sorted(set(every) & set(idle_rel)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every file, by package")
    args = parser.parse_args(argv)
    result = walk()
    files: list[str] = result["files"]  # type: ignore[assignment]
    also_idle: list[str] = result["alsoIdle"]  # type: ignore[assignment]
    by_process: dict[str, list[str]] = result["byProcess"]  # type: ignore[assignment]
    print(f"one fork.create of a warm tutti-agent Session ({result['forkMs']} ms, profiled):")
    print(
        f"  {len(files)} files of ours ran; {len(files) - len(also_idle)} only for the fork "
        f"({len(also_idle)} also run while idle)"
    )
    for kind in ("client", "daemon", "worker", "app-server"):
        print(f"  {kind}: {len(by_process.get(kind, []))}")
    packages: dict[str, int] = defaultdict(int)
    for f in files:
        packages[f.split(os.sep)[0]] += 1
    print("  by package: " + ", ".join(f"{p} {n}" for p, n in sorted(packages.items())))
    if args.list:
        for f in files:
            print(f"    {f}{'  (also idle)' if f in also_idle else ''}")
    print("command: build/venv/bin/python -m bench.fork_walk --list")


if __name__ == "__main__":
    main()
