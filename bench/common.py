"""What every benchmark shares: latency summaries, printed tables, the JSON-able result record,
the machine description and the `--quick`/`--smoke` command line.

A benchmark module exposes `run(mode: Mode) -> BenchResult` and `main(argv)`; the result keeps
the exact command that reproduces it, so every printed figure names its command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import shlex
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class Mode(StrEnum):
    """How long a benchmark runs; every mode measures the same things, only fewer of them."""

    FULL = "full"
    """The defaults `make bench` uses: enough samples for a stable p99 on 2 cores."""
    QUICK = "quick"
    """A few seconds per benchmark: figures are indicative (p99 of few samples is noisy)."""
    SMOKE = "smoke"
    """Seconds in total, for tests/bench: proves the benchmark runs end to end, not its figures."""


def pick(mode: Mode, full: Any, quick: Any, smoke: Any) -> Any:
    return {Mode.FULL: full, Mode.QUICK: quick, Mode.SMOKE: smoke}[mode]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `values`; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


@dataclass(frozen=True, slots=True)
class Latency:
    """A latency sample set in milliseconds, summarised; `samples` is kept for CDF plots."""

    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    max: float
    samples: tuple[float, ...] = ()

    @staticmethod
    def of(samples_ms: Iterable[float], keep: int = 4000) -> Latency:
        values = [float(v) for v in samples_ms]
        if not values:
            nan = math.nan
            return Latency(0, nan, nan, nan, nan, nan, ())
        kept = values if len(values) <= keep else _thin(sorted(values), keep)
        return Latency(
            n=len(values),
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            p99=percentile(values, 99),
            mean=sum(values) / len(values),
            max=max(values),
            samples=tuple(round(v, 3) for v in kept),
        )

    def brief(self) -> dict[str, Any]:
        return {k: _round(v) for k, v in asdict(self).items() if k != "samples"}


def _thin(ordered: list[float], keep: int) -> list[float]:
    """Evenly spaced order statistics: enough for a CDF, small enough for the JSON."""
    step = (len(ordered) - 1) / (keep - 1)
    return [ordered[round(i * step)] for i in range(keep)]


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 3)
    return value


def ratio(a: float, b: float) -> float:
    if not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def render(self) -> str:
        cells = [[_cell(v) for v in row] for row in self.rows]
        widths = [
            max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(self.columns)
        ]
        line = "  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True))
        out = [f"## {self.title}", line, "  ".join("-" * w for w in widths)]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
        return "\n".join(out)

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        sep = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in self.rows]
        return "\n".join([f"**{self.title}**", "", head, sep, *body])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


@dataclass(slots=True)
class BenchResult:
    """One benchmark's outcome: tables to print, figures for JSON/plots, and its command."""

    name: str
    command: str
    mode: str
    tables: list[Table] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def issue_target(
        self,
        key: str,
        value: float,
        *,
        measured: str,
        profile: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one of the issues' targets (`bench.targets.ISSUE20`, `ISSUE36`; the limit
        lives there):
        `measured` says what was measured at what size, `profile` what bounds the figure
        (`lines` for people, any other keys for the JSON)."""
        from bench.targets import BY_KEY

        t = BY_KEY[key]
        if t.info:
            # Beside a target, never judged against a limit.
            record: dict[str, Any] = {
                "what": t.what,
                "value": _round(float(value)),
                "limit": None,
                "direction": "",
                "met": None,
                "valueOverLimit": None,
                "info": True,
                "key": key,
                "measured": measured,
            }
            if profile is not None:
                record["profile"] = _jsonable(profile)
            self.targets.append(record)
            return
        self.target(
            t.what,
            value,
            t.limit,
            higher_is_better=t.higher_is_better,
            key=key,
            measured=measured,
            profile=profile,
        )

    def target(
        self,
        what: str,
        value: float,
        limit: float,
        *,
        higher_is_better: bool,
        key: str | None = None,
        measured: str | None = None,
        profile: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a target from the issue: met or missed, and by how much."""
        if math.isnan(value):
            met = False
            by = math.nan
        elif higher_is_better:
            met = value >= limit
            by = value / limit if limit else math.nan
        else:
            met = value <= limit
            by = value / limit if limit else math.nan
        record: dict[str, Any] = {
            "what": what,
            "value": _round(float(value)),
            "limit": limit,
            "direction": ">=" if higher_is_better else "<=",
            "met": met,
            "valueOverLimit": _round(by),
        }
        if key is not None:
            record["key"] = key
        if measured is not None:
            record["measured"] = measured
        if profile is not None:
            record["profile"] = _jsonable(profile)
        self.targets.append(record)

    def render(self) -> str:
        parts = [f"# {self.name} ({self.mode}, {self.seconds:.1f} s)"]
        parts += [t.render() for t in self.tables]
        if self.targets:
            rows = tuple(
                (
                    t["what"],
                    t["value"] if t["value"] is not None else math.nan,
                    "-" if t.get("info") else f"{t['direction']} {t['limit']}",
                    "info" if t.get("info") else "met" if t["met"] else "MISSED",
                    t["valueOverLimit"] if t["valueOverLimit"] is not None else math.nan,
                )
                for t in self.targets
            )
            parts.append(
                Table(
                    "targets", ("target", "value", "limit", "verdict", "value/limit"), rows
                ).render()
            )
        if self.notes:
            parts.append("\n".join(f"note: {n}" for n in self.notes))
        parts.append(f"command: {self.command}")
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "mode": self.mode,
            "seconds": round(self.seconds, 2),
            "tables": [
                {"title": t.title, "columns": list(t.columns), "rows": [list(r) for r in t.rows]}
                for t in self.tables
            ],
            "figures": _jsonable(self.figures),
            "targets": self.targets,
            "notes": self.notes,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Latency):
        return {**value.brief(), "samples": list(value.samples)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return _round(value)


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model and Python: the figures mean nothing without these."""
    mem_kb = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memoryGiB": round(mem_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "pythonBuild": python_build(),
        "kernel": platform.release(),
        "loadAverage1m": round(os.getloadavg()[0], 2),
    }


BUILD_FLAGS = ("--enable-optimizations", "--with-lto", "--enable-shared")
"""The interpreter's configure flags that move every figure here: the same fork cost the daemon
tree ~10 % less CPU on a PGO + LTO interpreter linked statically than on one built without
them as a shared `libpython` (docs/performance.md, "The interpreter's build")."""


def python_build() -> dict[str, Any]:
    """How the interpreter running this (and the daemon tree it starts: `sys.executable`) was
    built: its real path, the `libpython` it runs from (null when linked statically) and which
    of `BUILD_FLAGS` its configure line names. A distribution may build with profile-guided
    optimization outside its configure line (Debian does), so an absent flag is what the
    build says, not proof; two runs compare only on the same interpreter."""
    args = str(sysconfig.get_config_var("CONFIG_ARGS") or "").replace("'", " ").split()
    libpython = None
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and "/libpython" in fields[5]:
                    libpython = fields[5].strip()
                    break
    except OSError:
        pass
    return {
        "executable": os.path.realpath(sys.executable),
        "libpython": libpython,
        "configure": [flag for flag in BUILD_FLAGS if flag in args],
    }


def ab_trees(against: Path | None) -> dict[str, Path]:
    """The checkouts an in-process A/B interleaves: this one, and `against` (another tree,
    listed first) when given."""
    here = Path(__file__).resolve().parent.parent
    return {"this": here} if against is None else {"against": against.resolve(), "this": here}


def cpu_probe_ms(rounds: int = 3) -> float:
    """The host's single-thread Python speed now: the median ms of a fixed pure-Python workload
    (integer loop, SHA-1 and JSON; ~25-40 ms a round here). This 2-core VM's speed swings up to
    ~2x between minutes (`make bench` of 2026-12-01 10:53 UTC: 21-22 ms at its first two
    benchmarks, 35-38 ms from the third on), so each benchmark records it beside its figures:
    two runs compare only at a similar probe."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i & 7
        h = hashlib.sha1()
        for i in range(20_000):
            h.update(str(i).encode())
        json.dumps([{"id": i, "text": "x" * 20} for i in range(5_000)])
        times.append((time.perf_counter() - t0) * 1000)
    return round(sorted(times)[len(times) // 2], 1)


def command_for(module: str, argv: Sequence[str]) -> str:
    """The exact command line, runnable from the repository root."""
    return shlex.join(["build/venv/bin/python", "-m", module, *argv])


def parse_mode(argv: Sequence[str] | None, description: str) -> tuple[Mode, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a few seconds; indicative figures")
    parser.add_argument("--smoke", action="store_true", help="seconds; proves it runs (tests)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    mode = Mode.SMOKE if args.smoke else Mode.QUICK if args.quick else Mode.FULL
    return mode, args


def mode_argv(mode: Mode) -> list[str]:
    return {Mode.FULL: [], Mode.QUICK: ["--quick"], Mode.SMOKE: ["--quick", "--smoke"]}[mode]


def bench_main(
    module: str, description: str, run: Callable[[Mode], BenchResult], argv: Sequence[str] | None
) -> int:
    mode, args = parse_mode(argv, description)
    started = time.monotonic()
    result = run(mode)
    result.seconds = time.monotonic() - started
    result.command = command_for(module, mode_argv(mode))
    print(result.render(), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=1))
    return 0


def log(message: str) -> None:
    """Progress on stderr, so stdout carries only the tables."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def thread_counters(pid: int) -> Counter[str]:
    """CPU ticks ("cpu:<name>"), voluntary ("cs:<name>") and involuntary ("ncs:<name>")
    context switches and the thread count ("n:<name>") of each thread of `pid`, summed by name
    (numbered pool threads together)."""
    out: Counter[str] = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        name = re.sub(r"[_-]?\d+$", "", stat[stat.index("(") + 1 : stat.rindex(")")])
        fields = stat[stat.rindex(")") + 2 :].split()
        out["cpu:" + name] += int(fields[11]) + int(fields[12])
        out["n:" + name] += 1
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                out["cs:" + name] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                out["ncs:" + name] += int(line.split()[1])
    return out
