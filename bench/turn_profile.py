"""A warm streamed Turn's self-CPU by function, in the daemon and in the driver worker (issue
36 target 2): where the host's Python goes on one Turn, function by function.

`bench.turn_structure`'s window (an in-process daemon, `tests.support.in_process`, every
thread under its own `cProfile.Profile(time.thread_time)` from its first instruction, on
`bench.turn_overhead`'s timed fake model: the same reply in `--deltas` deltas 2 ms apart) and
`bench.fork_structure`'s worker (started with `bench/structure_site` first on its PYTHONPATH:
the same profilers in the worker's threads, their stats taken on SIGUSR1). `--warm` Turns, then
`--turns` Turns through `turn_overhead.host_turn`, between two snapshots of every profiler.
Printed per Turn, for each side: the `--top` functions by self time (cProfile's `inlinetime`,
which inflates Python ~2-3x: shares, not timings), their calls, and the thread that ran most
of it. Not a benchmark of record.

    cd $TREE && PYTHONPATH=$TREE build/venv/bin/python -m bench.turn_profile [--turns 200]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import fork_structure as fs

SKIP = ("process_request_thread", "responses-server", "agenthost-client")


def table(side: str, stats: fs.Stats, turns: int, top: int, only: str = "") -> None:
    own: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    where: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    total = 0.0
    for th, d in stats.items():
        if any(x in th for x in SKIP) or not th.startswith(only):
            continue
        for k, (c, it, _tt) in d.items():
            name = fs._name(k).replace(str(fs.REPO) + "/", "")
            name = re.sub(r"^(\S+) .*/(site-packages|python3\.\d+)/", r"\1 ", name)
            own[name] += it
            calls[name] += c
            where[name][th] += it
            total += it
    per_thread = {
        th: sum(v[1] for v in d.values())
        for th, d in stats.items()
        if th.startswith(only) and not any(x in th for x in SKIP)
    }
    shares = ", ".join(
        f"{th} {1000 * v / turns:.2f}"
        for th, v in sorted(per_thread.items(), key=lambda x: -x[1])
        if v / turns >= 2e-5
    )
    label = f"{side} {only}" if only else side
    print(f"\n{label}: profiled self CPU {1000 * total / turns:.3f} ms a Turn")
    print(f"  by thread, ms: {shares}; top {top}:")
    print(f"  {'ms/Turn':>8} {'%':>5} {'calls':>7}  function [thread]")
    for name, it in sorted(own.items(), key=lambda x: -x[1])[:top]:
        th = max(where[name].items(), key=lambda x: x[1])[0]
        print(
            f"  {1000 * it / turns:8.4f} {100 * it / total:5.1f} {calls[name] / turns:7.1f}"
            f"  {name} [{th}]"
        )


def callers(side: str, raw: fs.Stats, pattern: str, turns: int) -> None:
    """Who calls the functions whose name matches `pattern`, per Turn (the profiles' edges)."""
    rx = re.compile(pattern)
    by: dict[tuple[str, str], int] = defaultdict(int)
    for d in raw.values():
        for k, (c, _it, _tt) in d.items():
            if k[0] == "EDGE" and rx.search(fs._name(k[2])):
                by[(fs._name(k[2]), fs._name(k[1]))] += c
    print(f"\n{side}: callers of /{pattern}/ per Turn")
    for (callee, caller), c in sorted(by.items(), key=lambda x: -x[1])[:25]:
        short = str(fs.REPO) + "/"
        print(f"  {c / turns:7.1f}  {caller.replace(short, '')} -> {callee.replace(short, '')}")


def edges(_stats: fs.Stats) -> fs.Stats:
    """Each thread's (caller, callee) edges as ("EDGE", caller, callee) keys."""
    out: fs.Stats = {}
    for name, prof in list(fs._PROFS):
        d = out.setdefault(re.sub(r"[_-]?\d+$", "", name), {})
        for e in prof.getstats():
            for sub in e.calls or ():
                ek: Any = ("EDGE", fs._key(e.code), fs._key(sub.code))
                c, it, tt = d.get(ek, (0, 0.0, 0.0))
                d[ek] = (c + sub.callcount, it + sub.inlinetime, tt + sub.totaltime)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--deltas", type=int, default=20)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--thread", default="", help="a thread name's start: its own table too")
    ap.add_argument("--callers", default="", help="a pattern: the callers of those functions")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="turnprof-"))
    (tmp / "user-home").mkdir()
    os.environ["HOME"] = str(tmp / "user-home")
    out = str(tmp / "w")
    os.environ["FORKSTRUCT_OUT"] = out
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(fs.SITE), os.environ.get("PYTHONPATH") or str(fs.REPO)]
    )
    fs._profile_threads()
    import bench.turn_overhead as turns
    from bench.common import cpu_probe_ms
    from bench.harness import WS, create_session, run_turn
    from tests.support.in_process import in_process_daemon
    from transport.client import EventSubscriber

    turns.REPLY = "".join(f"d{i:02d} " for i in range(args.deltas))
    print(f"load {os.getloadavg()[0]:.2f} probe {cpu_probe_ms():.0f} ms", flush=True)
    with turns.side_by_side("tutti-agent", tmp) as (_server, config, _bare):
        home = tmp / "home"
        home.mkdir(mode=0o700)
        lines = ['[providers."tutti-agent"]'] + [
            f"{k} = {json.dumps(v)}" for k, v in config.items()
        ]
        (home / "agenthost.toml").write_text("\n".join(lines) + "\n")
        with in_process_daemon(home, timeout=120) as (daemon, c):
            work = home.parent / f"{home.name}-work"
            for i in range(5):
                (work / f"f{i}.txt").write_text(f"file {i}\n")
            sub = EventSubscriber(daemon.events_endpoint, [WS])
            sid = create_session(c, "turnprof", provider="tutti-agent")
            for i in range(args.warm):
                run_turn(c, sid, f"warm {i}")
            time.sleep(0.3)
            worker = fs._worker_pid()
            a, wa_raw = fs._snap(), fs.worker_raw(worker, out)
            wa = fs.without_edges(wa_raw)
            ea = edges(a)
            for i in range(args.turns):
                _ms, arrivals = turns.host_turn(c, sub, sid, f"turn {i}")
                assert len(arrivals) == args.deltas, len(arrivals)
            time.sleep(0.2)
            b, wb_raw = fs._snap(), fs.worker_raw(worker, out)
            wb = fs.without_edges(wb_raw)
            eb = edges(b)
            sub.close()
    n = args.turns
    print(f"{n} warm Turns of {args.deltas} deltas")
    table("daemon", fs._diff(a, b), n, args.top)
    table("worker", fs._diff(wa, wb), n, args.top)
    if args.thread:
        table("daemon", fs._diff(a, b), n, args.top, args.thread)
        table("worker", fs._diff(wa, wb), n, args.top, args.thread)
    if args.callers:
        callers("daemon", fs._diff(ea, eb), args.callers, n)
        callers("worker", fs._diff(wa_raw, wb_raw), args.callers, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
