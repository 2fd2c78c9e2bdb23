"""Where a streamed delta waits between the model and the client, syscall by syscall: one
`bench.turn_overhead --quick` run of an app-server provider (tutti-agent, Codex), stamped by
`bench/turn_stamp_site`, with `perf` recording the provider processes' `write(2)` calls and the
readers' `read(2)` returns; then each delta's legs, host and bare:

- the model's emission → the provider's write of the notification to its stdout (the provider);
- that write → the reader's `read()` returns (the pipe and the reader thread's wake-up: the
  worker's `app-server-reader` on the host side, the bench's own reader on the bare side);
- → the driver has the line (the worker's `TurnEvents.on_notification`: parsing, the GIL);
- → the client has the `message.delta` (the worker's link, the daemon, the transport).

    build/venv/bin/python -m bench.turn_pipe record OUT [--provider codex]   # needs perf, root
    build/venv/bin/python -m bench.turn_pipe show OUT

`record` attaches `perf record -k CLOCK_MONOTONIC` (the clock of `time.perf_counter`, so the
stamps and the syscalls line up) to the bench, the daemon, the worker and both app-servers once
all of them run (a node shim is replaced by the native process it runs), so the first timed
Turn may precede it; `show` leaves out the Turns before the first traced write. The tracing
costs each traced syscall a few microseconds: the daemon's and the worker's many small ones
make the legs after the driver slower than untraced (compare `bench.turn_split`'s delta lines).
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DELTAS = 20
"""Deltas per Turn (`bench.turn_overhead.DELTAS`)."""
DRIVER_POINT = "w.n.item/agentMessage/delta"
LEGS = (
    "the model's emission → the provider's write",
    "the write → the reader's read() returns",
    "read() → the driver has it",
    "the driver → the client has it",
)
_PERF_LINE = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+(?:\[\d+\]\s+)?([\d.]+):\s+(\S+):\s*(.*)$")


@dataclass(frozen=True, slots=True)
class Syscall:
    """One traced event of `perf script -F comm,pid,tid,cpu,time,event,trace`."""

    pid: str
    tid: str
    ms: float
    event: str
    args: str


def parse_perf(lines: Sequence[str]) -> list[Syscall]:
    """The `sys_enter_write` / `sys_exit_read` events of a `perf script` dump, in ms of the
    monotonic clock."""
    out: list[Syscall] = []
    for line in lines:
        m = _PERF_LINE.match(line)
        if m is None:
            continue
        _comm, pid, tid, seconds, event, args = m.groups()
        name = event.rstrip(":").rsplit(":", 1)[-1]
        if name in ("sys_enter_write", "sys_exit_read"):
            out.append(Syscall(pid, tid, float(seconds) * 1000.0, name, args.strip()))
    return out


def stdout_writes(calls: Sequence[Syscall], pid: str) -> list[float]:
    """When process `pid` wrote to its stdout (fd 1), sorted."""
    return sorted(
        c.ms
        for c in calls
        if c.pid == pid and c.event == "sys_enter_write" and c.args.startswith("fd: 0x00000001,")
    )


def reader_reads(calls: Sequence[Syscall], pid: str, writes: Sequence[float]) -> list[float]:
    """The `read()` returns of the thread of `pid` that reads the pipe those writes went to:
    the thread whose reads most often return within 1 ms after one of them."""
    by_tid: dict[str, list[float]] = {}
    for c in calls:
        if c.pid == pid and c.event == "sys_exit_read" and not c.args.startswith("0xfff"):
            by_tid.setdefault(c.tid, []).append(c.ms)
    score: Counter[str] = Counter()
    for tid, times in by_tid.items():
        times.sort()
        for w in writes:
            i = bisect.bisect_left(times, w)
            if i < len(times) and times[i] - w < 1.0:
                score[tid] += 1
    if not score:
        return []
    return by_tid[score.most_common(1)[0][0]]


@dataclass(frozen=True, slots=True)
class Turn:
    """One timed Turn's deltas: the model's emissions and the client's arrivals, and (host) the
    worker's driver stamps; bare Turns have none (their client is the reader)."""

    emitted: list[float]
    arrived: list[float]
    driver: list[float]

    @property
    def host(self) -> bool:
        return bool(self.driver)


def turns(stamps: Sequence[tuple[str, float]], deltas: int = DELTAS) -> list[Turn]:
    """The timed Turns of a stamped run, host and bare told apart by whether the worker's
    driver stamped deltas inside them (the bench records both sides' samples alike). A host
    Turn whose driver stamps are incomplete (the worker's last second is not written) is left
    out."""
    emitted = [ms for p, ms in stamps if p == "M.emit"]
    arrived = [ms for p, ms in stamps if p == "c.delta"]
    driver = sorted(ms for p, ms in stamps if p == DRIVER_POINT)
    out: list[Turn] = []
    for i in range(min(len(emitted), len(arrived)) // deltas):
        e = emitted[i * deltas : (i + 1) * deltas]
        a = arrived[i * deltas : (i + 1) * deltas]
        d = driver[bisect.bisect_left(driver, e[0] - 0.1) : bisect.bisect_right(driver, a[-1])]
        if d and len(d) != deltas:
            continue
        out.append(Turn(e, a, d))
    return out


def legs(turn: Turn, writes: Sequence[float], reads: Sequence[float]) -> list[tuple[float, ...]]:
    """Each delta's lag and its four legs (`LEGS`), ms. The read is the reader's last `read()`
    return before the driver had the delta (bare: before the client had it), the write the
    provider's last write before that read; a bare delta's driver is its client."""
    rows: list[tuple[float, ...]] = []
    handled = turn.driver if turn.host else turn.arrived
    for e, d, a in zip(turn.emitted, handled, turn.arrived, strict=True):
        r = reads[max(0, bisect.bisect_right(reads, d) - 1)]
        w = writes[max(0, bisect.bisect_right(writes, r) - 1)]
        rows.append((a - e, w - e, r - w, d - r, a - d))
    return rows


def _q(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(rows: Sequence[tuple[float, ...]], label: str, late_ms: float = 5.0) -> list[str]:
    """The lag and each leg's p50 / p99 / max and how many deltas it held over `late_ms`."""
    if not rows:
        return [f"{label}: no deltas"]
    lines = [f"{label}: {len(rows)} deltas"]
    for i, name in enumerate(("lag", *LEGS)):
        v = [r[i] for r in rows]
        lines.append(
            f"  {name:45} p50 {statistics.median(v):6.2f}  p99 {_q(v, 0.99):6.2f}"
            f"  max {max(v):6.1f}  > {late_ms:g} ms: {sum(x > late_ms for x in v)}"
        )
    return lines


def _stamps(folder: Path) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for tsv in folder.glob("*.tsv"):
        for line in tsv.read_text().splitlines():
            if line and not line.startswith("#"):
                point, ms = line.split("\t")
                out.append((point, float(ms)))
    return out


def show(out: Path) -> None:
    pids = dict(line.split("=", 1) for line in (out / "pids").read_text().split())
    calls = parse_perf((out / "perf.txt").read_text().splitlines())
    stamps = _stamps(out / "stamps")
    for side, app, reader in (("host", "hostapp", "worker"), ("bare", "bareapp", "bench")):
        writes = stdout_writes(calls, pids[app])
        reads = reader_reads(calls, pids[reader], writes)
        rows: list[tuple[float, ...]] = []
        if writes and reads:
            for turn in turns(stamps):
                if turn.host == (side == "host") and turn.emitted[0] >= writes[0]:
                    rows += legs(turn, writes, reads)
        print("\n".join(report(rows, side)))


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone meanwhile


def _native(pid: int) -> int:
    """An npm `node` shim's child: the process that writes the protocol."""
    kids = _children(pid)
    return kids[0] if _cmdline(pid).startswith(b"node") and kids else pid


def record(out: Path, provider: str) -> None:
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("perf is not installed")
    (out / "stamps").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "AGENTHOST_TURN_STAMPS": str(out / "stamps"),
        "AGENTHOST_BENCH_PROVIDERS": provider,
        "PYTHONPATH": f"{REPO / 'bench' / 'turn_stamp_site'}:{REPO}",
    }
    argv = [sys.executable, "-m", "bench.turn_overhead", "--quick"]
    argv += ["--json", str(out / "stamps" / "bench.json")]
    with open(out / "bench.out", "wb") as log:
        bench = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    pids: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and bench.poll() is None:
        time.sleep(0.1)
        kids = _children(bench.pid)
        daemons = [k for k in kids if b"agenthost" in _cmdline(k)]
        workers = [w for d in daemons for w in _children(d) if b"drivers.worker" in _cmdline(w)]
        apps = [w for w in workers if _children(w)]
        bare = [k for k in kids if k not in daemons]
        if daemons and apps and bare and _children(apps[0]):
            found = {
                "bench": bench.pid,
                "daemon": daemons[0],
                "worker": apps[0],
                "hostapp": _native(_children(apps[0])[0]),
                "bareapp": _native(bare[0]),
            }
            if found == pids:
                break  # the same for a second: not an app-server started for a moment
            pids = found
            time.sleep(1.0)
    else:
        pids = {}
    if not pids:
        bench.wait()
        raise SystemExit("the bench's processes were not found (see bench.out)")
    (out / "pids").write_text(" ".join(f"{k}={v}" for k, v in pids.items()) + "\n")
    events = "syscalls:sys_enter_write,syscalls:sys_exit_read,sched:sched_switch"
    tracer = subprocess.Popen(
        [perf, "record", "-k", "CLOCK_MONOTONIC", "-e", events, "-o", str(out / "perf.data")]
        + ["-p", ",".join(str(p) for p in pids.values())],
        stderr=subprocess.DEVNULL,
    )
    bench.wait()
    tracer.send_signal(signal.SIGINT)
    tracer.wait()
    script = [perf, "script", "-i", str(out / "perf.data")]
    script += ["-F", "comm,pid,tid,cpu,time,event,trace"]
    with open(out / "perf.txt", "wb") as dump:
        subprocess.run(script, stdout=dump, stderr=subprocess.DEVNULL, check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.turn_pipe", description=__doc__)
    parser.add_argument("action", choices=("record", "show"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--provider", default="codex", choices=("codex", "tutti-agent"))
    args = parser.parse_args(argv)
    if args.action == "record":
        record(args.out, args.provider)
    show(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
