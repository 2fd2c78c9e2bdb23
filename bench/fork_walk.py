"""The walk of one `fork.create`: which of the repository's files run code while one fork of a
warm tutti-agent Session goes from the client's call to its committed reply, in the client, the
daemon, its worker and the provider's app-server.

Every Python process of the daemon's tree is started with `bench/walk_site` first on its
PYTHONPATH, whose `sitecustomize` records the milliseconds at which each file of ours ran (see
it); this process records its own client side the same way. Files that also run while the
daemon is idle for as long (timers, the connection guard's poll) are counted apart, so the
figure is what the fork itself runs. Not a timing benchmark: the profiler slows every call.

Two counts. `files`: every file of ours whose code ran in any process during the fork (an
import included). `onPath`, per process: the files in which a function ran for the fork —
not a file whose module body only ran (a lazy import that defines names nobody calls yet),
not one that also runs while idle; `host` is the daemon's and worker's together (each file
once): the host's own modules a reader follows for one fork, the figure comparable across
reshapes of the code. The provider's app-server (tutti-agent, standing in for Codex or Claude
Code, whose code is not ours to count) and the client are listed apart.

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


def _record_self() -> tuple[dict[str, list[int]], dict[str, list[int]], Callable[[], None]]:
    seen: dict[str, list[int]] = defaultdict(list)
    imports: dict[str, list[int]] = defaultdict(list)
    skip = tuple(str(REPO / d) + os.sep for d in ("tests", "bench", "build"))

    def profile(frame: object, event: str, arg: object) -> None:
        if event != "call":
            return
        code = frame.f_code  # type: ignore[attr-defined]
        name: str = code.co_filename
        if name.startswith(str(REPO)) and not name.startswith(skip):
            stamps = (imports if code.co_name == "<module>" else seen)[name]
            ms = int(time.time() * 1000)
            if not stamps or stamps[-1] != ms:
                stamps.append(ms)

    def stop() -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    sys.setprofile(profile)
    threading.setprofile(profile)
    return seen, imports, stop


def _touched(files: dict[str, list[int]], start: int, end: int) -> set[str]:
    return {name for name, stamps in files.items() if any(start <= s <= end for s in stamps)}


Stamps = dict[str, list[int]]


def _read_dumps(folder: Path) -> list[tuple[list[str], Stamps, Stamps]]:
    """(argv, function calls, module bodies run) of every process that ran with the walk's
    sitecustomize, each by file."""
    dumps = []
    for path in sorted(folder.glob("*.json")):
        try:
            dump = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        dumps.append((list(dump["argv"]), dict(dump["files"]), dict(dump.get("imports", {}))))
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
            client_seen, client_imports, stop = _record_self()
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
        called: dict[str, set[str]] = defaultdict(set)
        idle: set[str] = set()
        for argv, files, imports in dumps:
            kind = _process(argv)
            called[kind] |= _touched(files, t0, t1)
            by_process[kind] |= called[kind] | _touched(imports, t0, t1)
            idle |= _touched(files, idle_start, idle_end) | _touched(imports, idle_start, idle_end)
        called["client"] = _touched(client_seen, t0, t1)
        by_process["client"] = called["client"] | _touched(client_imports, t0, t1)

    def rel(files: set[str]) -> list[str]:
        return sorted(os.path.relpath(f, REPO) for f in files)

    every = sorted({f for v in by_process.values() for f in rel(v)})
    idle_rel = set(rel(idle))
    on_path = {k: [f for f in rel(v) if f not in idle_rel] for k, v in called.items()}
    host = sorted({f for k in ("daemon", "worker") for f in on_path.get(k, [])})
    return {
        "forkMs": t1 - t0,
        "files": every,
        "byProcess": {k: rel(v) for k, v in by_process.items()},
        "alsoIdle": sorted(set(every) & idle_rel),
        "onPath": {**on_path, "host": host},
        "importedOnly": sorted(set(every) - {f for v in on_path.values() for f in v} - idle_rel),
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
    on_path: dict[str, list[str]] = result["onPath"]  # type: ignore[assignment]
    imported_only: list[str] = result["importedOnly"]  # type: ignore[assignment]
    print(
        "  on the fork's path (a function of the file ran for the fork; not only imported, "
        "not also idle): "
        + ", ".join(
            f"{k} {len(on_path.get(k, []))}" for k in ("client", "daemon", "worker", "app-server")
        )
    )
    print(
        f"  the host's own modules on the path (daemon + worker, each once): "
        f"{len(on_path['host'])}; only imported during the fork: {len(imported_only)}"
    )
    packages: dict[str, int] = defaultdict(int)
    for f in files:
        packages[f.split(os.sep)[0]] += 1
    print("  by package: " + ", ".join(f"{p} {n}" for p, n in sorted(packages.items())))
    if args.list:
        host = set(on_path["host"])
        for f in files:
            notes = [
                note
                for note, holds in (
                    ("also idle", f in also_idle),
                    ("only imported", f in imported_only),
                    ("host path", f in host),
                )
                if holds
            ]
            print(f"    {f}{'  (' + ', '.join(notes) + ')' if notes else ''}")
    print("command: build/venv/bin/python -m bench.fork_walk --list")


if __name__ == "__main__":
    main()
