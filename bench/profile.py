"""Profiles of the daemon's process tree while a benchmark runs: py-spy (sampling, every
subprocess, on-CPU only) when it is installed, summarised into top self/inclusive frames per
process kind, plus exact per-kind CPU seconds from /proc (which needs no profiler at all).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import cpu_by_kind, cpu_delta, descendants, sample, tree


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def _kind_of(process_frame: str) -> str:
    if "agenthost.cli" in process_frame or process_frame.rstrip('"').endswith(" serve"):
        return "daemon"  # `-m agenthost.cli … serve` then, `-m agenthost … serve` now
    if "drivers.worker" in process_frame:
        return "worker"
    if "app-server" in process_frame:
        return "app-server"
    return "other"


def _short(frame: str) -> str:
    """`fn (path/to/file.py:12)` → `fn (file.py)`: lines vary, the function is what counts."""
    name, _, loc = frame.partition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


@dataclass(slots=True)
class ProfileSummary:
    samples: dict[str, int] = field(default_factory=dict)
    top_self: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    top_inclusive: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "topSelf": {k: [list(x) for x in v] for k, v in self.top_self.items()},
            "topInclusive": {k: [list(x) for x in v] for k, v in self.top_inclusive.items()},
        }

    def lines(self, per_kind: int = 5) -> list[str]:
        out = []
        total = sum(self.samples.values()) or 1
        for kind, n in sorted(self.samples.items(), key=lambda kv: -kv[1]):
            out.append(f"{kind}: {n} on-CPU samples ({100 * n / total:.0f}%)")
            for frame, count in self.top_self.get(kind, [])[:per_kind]:
                out.append(f"    self {100 * count / n:4.0f}%  {frame}")
            for frame, count in self.top_inclusive.get(kind, [])[:per_kind]:
                out.append(f"    incl {100 * count / n:4.0f}%  {frame}")
        return out


def summarise(raw: str, top: int = 12) -> ProfileSummary:
    """Summarise py-spy `--format raw` output (collapsed stacks: `a;b;c count`)."""
    samples: Counter[str] = Counter()
    selfs: dict[str, Counter[str]] = {}
    incl: dict[str, Counter[str]] = {}
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        code = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not code:
            continue
        kind = _kind_of(procs[-1]) if procs else "other"
        samples[kind] += count
        selfs.setdefault(kind, Counter())[_short(code[-1])] += count
        seen = set()
        for f in code:
            s = _short(f)
            if s not in seen and not s.startswith("<module>") and "bootstrap" not in s:
                seen.add(s)
                incl.setdefault(kind, Counter())[s] += count
    # Inclusive frames that cover everything (thread run loops) say nothing: drop the top ones
    # that are present in over 90 % of a kind's samples.
    summary = ProfileSummary(samples=dict(samples))
    for kind, counter in selfs.items():
        summary.top_self[kind] = counter.most_common(top)
    for kind, counter in incl.items():
        n = samples[kind]
        summary.top_inclusive[kind] = [
            (f, c) for f, c in counter.most_common(top * 4) if c < 0.9 * n
        ][:top]
    return summary


MECHANISMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "msgpack",
        ("msgpack/", "code (transport/worker_link.py)", "(transport/wire.py)", "(protocol/"),
    ),
    ("zmq", ("zmq/", "sugar/", "ZMQ")),
    ("logging", ("logging/",)),
    ("json", ("json/",)),
    (
        "the binder's syncs",
        tuple(f"{f} (drivers/binder.py)" for f in ("fsync_dir", "fsync_dirs", "sync_together")),
    ),
    ("the binder", ("drivers/binder.py",)),
    ("the group commit", ("Baton.", "Submission.", "(storage/base.py)")),
    ("SQLite statements", ("(storage/sqlite.py)", "apsw")),
    ("the store's fork code", ("(storage/",)),
    ("pykka / actor pool", ("pykka/", "(actors/pool.py)", "(actors/session_base.py)")),
    ("the fork saga", ("(actors/fork_saga.py)",)),
    ("the actors", ("(actors/",)),
    ("events thread", ("(agenthost/publisher.py)", "(agenthost/projection.py)")),
    ("the request plumbing", ("(agenthost/", "(transport/")),
    ("the worker's supervisor loop", ("(drivers/supervisor.py)",)),
    ("the worker's app-server driver", ("(drivers/app_server/", "app_server/")),
    ("the worker's loop", ("(drivers/worker.py)", "(drivers/")),
    ("the app-server's fork", ("(tutti_agent/",)),
    ("threads, queues, futures", ("threading.py", "futures/", "queue.py")),
    (
        "dataclasses, uuid, enum, pathlib",
        ("<string>", "dataclasses.py", "uuid.py", "enum.py", "pathlib.py", "posixpath"),
    ),
)
"""Mechanisms a sample is charged to: the first whose pattern is in the innermost frame that
matches any (so a statement run inside the saga is SQLite's, the saga's own code the saga's)."""


def by_mechanism(raw: str) -> dict[str, Counter[str]]:
    """py-spy `--format raw` samples per process kind, each charged to one mechanism
    (`MECHANISMS`; "other" when no frame matches)."""
    out: dict[str, Counter[str]] = {}
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        code = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not code:
            continue
        kind = _kind_of(procs[-1]) if procs else "other"
        out.setdefault(kind, Counter())[_mechanism(code)] += int(count_text)
    return out


def _mechanism(frames: list[str]) -> str:
    for frame in map(_short, reversed(frames)):
        for name, patterns in MECHANISMS:
            if any(p in frame for p in patterns):
                return name
    return "other"


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(x) for x in fh.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return float(sum(values) - idle), float(sum(values))


def cores_busy_between(start: tuple[float, float], end: tuple[float, float]) -> float:
    """Cores busy machine-wide between two `machine_busy()` readings."""
    total = end[1] - start[1]
    return (os.cpu_count() or 1) * (end[0] - start[0]) / total if total > 0 else 0.0


def busy_cores(window_s: float) -> float:
    """Cores busy machine-wide over the next `window_s` seconds (ours and anyone else's)."""
    start = machine_busy()
    time.sleep(window_s)
    return cores_busy_between(start, machine_busy())


QUIET_TIMEOUT_S = {"full": 30.0, "quick": 10.0, "smoke": 0.0}
"""How long a benchmark of each mode waits for a quiet machine (smoke runs in test suites,
where the machine is never quiet and the figures are not read)."""


def wait_until_quiet(
    limit_cores: float = 0.3, window_s: float = 0.5, timeout_s: float = 30.0
) -> float:
    """Wait (at most `timeout_s`) until less than `limit_cores` of the machine is busy over a
    window: what a previous benchmark left behind (its daemon's tree exiting, the page cache's
    write-back of its stores) must not be measured as this one's cost. Returns the busy cores
    of the last window, which the caller reports beside its figures either way."""
    deadline = time.monotonic() + timeout_s
    busy = busy_cores(window_s)
    while busy >= limit_cores and time.monotonic() < deadline:
        busy = busy_cores(window_s)
    return busy


def load_generator_cpu(daemon_pid: int) -> float:
    """CPU seconds of this benchmark process and its other children (load clients, py-spy),
    counting the reaped ones: what measuring costs, outside the daemon's tree."""
    daemon_tree = set(descendants(daemon_pid))
    total = 0.0
    for pid in descendants(os.getpid()):
        if pid in daemon_tree:
            continue
        s = sample(pid)
        if s is not None:
            total += s.cpu_s + s.children_cpu_s
    return total


class TreeProfile:
    """Wraps a measured window: CPU seconds per process kind from /proc, and (if available)
    a py-spy recording of the whole tree, stopped with SIGINT at the end."""

    def __init__(self, pid: int, out: Path, *, rate: int = 100, use_py_spy: bool = True):
        self.pid = pid
        self.out = out
        self.rate = rate
        self.use_py_spy = use_py_spy and py_spy() is not None
        self._proc: subprocess.Popen[bytes] | None = None
        self._cpu0: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._machine0 = (0.0, 0.0)
        self.machine_busy_cores = 0.0
        self._load0 = 0.0
        self.load_generator_cores = 0.0
        """Cores used by the benchmark's own clients and profiler in the window."""
        self._t0 = 0.0
        """Cores busy machine-wide in the window (ours and anyone else's)."""
        self.summary: ProfileSummary | None = None
        self.error: str | None = None

    def start(self) -> None:
        self._cpu0 = cpu_by_kind(tree(self.pid))
        self._machine0 = machine_busy()
        self._load0 = load_generator_cpu(self.pid)
        self._t0 = time.monotonic()
        if not self.use_py_spy:
            return
        spy = py_spy()
        assert spy is not None
        self._proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(self.pid),
                "--subprocesses",
                "--nonblocking",
                "--format",
                "raw",
                "--rate",
                str(self.rate),
                "-o",
                str(self.out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.cpu = cpu_delta(self._cpu0, cpu_by_kind(tree(self.pid)))
        elapsed = max(1e-6, time.monotonic() - self._t0)
        self.load_generator_cores = (load_generator_cpu(self.pid) - self._load0) / elapsed
        self.machine_busy_cores = cores_busy_between(self._machine0, machine_busy())
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait(5)
        try:
            self.summary = summarise(self.out.read_text(errors="replace"))
        except OSError as exc:
            self.error = f"py-spy wrote no profile: {exc}"


def cpu_line(cpu: Mapping[str, float], unit: str) -> str:
    """`CPU ms per fork: 131.0 in the daemon tree (app-server 110.0, daemon 15.0, …)`."""
    total = sum(cpu.values())
    digits = 1 if total >= 10 else 2  # a read costs a fraction of a millisecond
    parts = ", ".join(f"{k} {v:.{digits}f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
    return f"CPU {unit}: {total:.{digits}f} in the daemon tree ({parts or 'none'})"


def spy_lines(profile: TreeProfile | None, per_kind: int = 3) -> list[str]:
    """The py-spy summary of a window, or why there is none."""
    if profile is not None and profile.summary is not None:
        return ["py-spy (on-CPU samples of the daemon tree):", *profile.summary.lines(per_kind)]
    if py_spy() is None:
        return ["py-spy: not installed (make bench installs it: pip install -e '.[bench]')"]
    if profile is not None and profile.error:
        return [f"py-spy: {profile.error}"]
    return []
