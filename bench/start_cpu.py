"""Benchmark: the CPU each kind of process the host starts spends from its exec to ready, A/B
between two trees: `agenthost serve` on a fresh home (to its ready line), a driver worker (to
its hello on the link), the Tutti Agent app-server (to its answer to `initialize`) and the CLI
client (`agenthost status` against a live daemon of the same tree, to its exit); and `serve`
as the tests' harness starts it, the accept shim preloaded (`serve-preloaded`: one interpreter,
where a user's `serve` re-executes itself with the shim).

CPU is the child's user + system seconds from `os.wait4` (every interpreter of the process: the
accept shim's re-execution keeps the pid). A process that stays up once ready is killed
(SIGKILL) the moment it is, so what it would do next is not counted (a worker's driver preload
starts beside its hello: the kill comes within a millisecond of it). Each run starts every kind
once in each tree, one tree after the other, the order alternating from run to run (the way
`bench.ab_pairs` pairs two trees), so both see the same load. Both trees' packages are
byte-compiled first, as an install is. `--imports` also prints, per kind, the modules with the
largest own import time (`-X importtime`) in this tree.

    build/venv/bin/python -m bench.start_cpu [--against /path/to/other-tree] [--runs 10] \\
        [--kinds serve,serve-preloaded,worker,app-server,status] [--imports 15]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import zmq

from bench.ab_pairs import AGAINST, THIS, Pair, print_pairs, summary
from bench.common import REPO, Table, cpu_probe_ms, log
from bench.harness import byte_compile
from transport import accept_shim

MODULE = "bench.start_cpu"
KINDS = ("serve", "serve-preloaded", "worker", "app-server", "status")
TIMEOUT_S = 120.0


def _python(tree: Path) -> Path:
    return tree / "build" / "venv" / "bin" / "python"


def _env(tree: Path, home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(tree),
            "AGENTHOST_HOME": str(home / "home"),
            "HOME": str(home / "user"),
            # The accept shim compiled once, as a user's cache keeps it.
            "AGENTHOST_NATIVE_DIR": str(tree / "build" / "native"),
        }
    )
    env.update(extra or {})
    return env


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sc-", dir="/tmp") as tmp:
        root = Path(tmp)
        (root / "home").mkdir(mode=0o700)
        (root / "user").mkdir()
        yield root


def _reap(proc: subprocess.Popen[bytes], kill: bool) -> float:
    """The process's CPU seconds (user + system) once it is reaped; SIGKILLed first if `kill`."""
    if kill and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def _sample(
    proc: subprocess.Popen[bytes], started: float, ready: Callable[[], None], kill: bool = True
) -> dict[str, float]:
    """The figures of one start: `ready` waits for it; a process that exits by itself (not
    `kill`) is ready at its exit."""
    try:
        ready()
        wall = time.perf_counter() - started
    except BaseException:
        _reap(proc, kill=True)
        raise
    cpu = _reap(proc, kill)
    if not kill:
        wall = time.perf_counter() - started
    return {"cpu ms": cpu * 1000, "wall ms": wall * 1000}


def _ready_line(proc: subprocess.Popen[bytes], what: str) -> Callable[[], None]:
    def wait() -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if what.encode() not in line:
            raise RuntimeError(f"no {what} line: {line[:200]!r}")

    return wait


def serve(tree: Path, stderr: Path | None = None, preloaded: bool = False) -> dict[str, float]:
    """`agenthost serve` on a fresh home, to its ready line; `preloaded`: started with the
    accept shim already preloaded, as the tests' harness starts it (no re-execution)."""
    with _scratch() as root:
        env = _env(tree, root, _importtime(stderr))
        if preloaded:
            env = accept_shim.preload_env(env, accept_shim.build(tree / "build" / "native"))
        started = time.perf_counter()
        proc = subprocess.Popen(
            [str(_python(tree)), "-m", "agenthost", "--home", str(root / "home"), "serve"],
            stdout=subprocess.PIPE,
            stderr=_sink(stderr),
            env=env,
            cwd=root,
        )
        return _sample(proc, started, _ready_line(proc, '"ready"'))


def worker(tree: Path, stderr: Path | None = None) -> dict[str, float]:
    """`python -m drivers.worker --provider tutti-agent`, to its hello on a PAIR bound here."""
    with _scratch() as root, zmq.Context() as ctx, ctx.socket(zmq.PAIR) as sock:
        endpoint = f"ipc://{root}/w.sock"
        sock.bind(endpoint)
        sock.setsockopt(zmq.LINGER, 0)
        env = _env(tree, root, _importtime(stderr))
        env["AGENTHOST_WORKER_PARENT_PID"] = str(os.getpid())
        argv = ["-m", "drivers.worker", "--provider", "tutti-agent", "--connect", endpoint]
        started = time.perf_counter()
        proc = subprocess.Popen(
            [str(_python(tree)), *argv], stderr=_sink(stderr), env=env, cwd=root
        )

        def hello() -> None:
            if not sock.poll(TIMEOUT_S * 1000):
                raise RuntimeError("no hello")
            if b"hello" not in sock.recv():
                raise RuntimeError("the first frame is no hello")

        return _sample(proc, started, hello)


def app_server(tree: Path, stderr: Path | None = None) -> dict[str, float]:
    """The `tutti-agent app-server` script next to the interpreter (as the driver starts it), to
    its answer to `initialize`."""
    with _scratch() as root:
        env = _env(tree, root, _importtime(stderr))
        env["TUTTI_AGENT_HOME"] = str(root / "tutti")
        request = {
            "id": 1,
            "method": "initialize",
            "params": {
                "clientInfo": {"name": "bench", "title": "bench", "version": "0"},
                "capabilities": {"experimentalApi": True},
            },
        }
        started = time.perf_counter()
        proc = subprocess.Popen(
            [str(_python(tree).parent / "tutti-agent"), "app-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=_sink(stderr),
            env=env,
            cwd=root,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        return _sample(proc, started, _ready_line(proc, '"id":1'))


@contextlib.contextmanager
def live_daemon(tree: Path) -> Iterator[Path]:
    """A `serve` of `tree` on a fresh home for the CLI's samples; yields its scratch root."""
    with _scratch() as root:
        proc = subprocess.Popen(
            [str(_python(tree)), "-m", "agenthost", "--home", str(root / "home"), "serve"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_env(tree, root),
            cwd=root,
        )
        try:
            _ready_line(proc, '"ready"')()
            yield root
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def status(tree: Path, root: Path, stderr: Path | None = None) -> dict[str, float]:
    """`agenthost status` against the live daemon of `root`, to its exit (0)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(_python(tree)), "-m", "agenthost", "--home", str(root / "home"), "status"],
        stdout=subprocess.DEVNULL,
        stderr=_sink(stderr),
        env=_env(tree, root, _importtime(stderr)),
        cwd=root,
    )
    out = _sample(proc, started, lambda: None, kill=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: agenthost status exited {proc.returncode}")
    return out


def _sink(path: Path | None) -> int | IO[bytes]:
    """Where a child's stderr goes: nowhere, or (an import-time log) the file `path`; the file
    object lives until `Popen` has handed it to the child."""
    return subprocess.DEVNULL if path is None else path.open("wb")


def _importtime(path: Path | None) -> dict[str, str]:
    return {} if path is None else {"PYTHONPROFILEIMPORTTIME": "1"}


_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def largest_imports(path: Path, count: int) -> list[tuple[int, int, str]]:
    """The `count` largest own import times (µs) in an `-X importtime` log, with their
    cumulative times; of the last interpreter only (serve's accept shim re-executes it)."""
    lines = path.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if "self [us]" in line]
    rows = []
    for line in lines[(starts[-1] + 1) if starts else 0 :]:
        m = _IMPORT_LINE.match(line)
        if m:
            rows.append((int(m[1]), int(m[2]), m[4]))
    return sorted(rows, reverse=True)[:count]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.add_argument("--against", type=Path, default=None, help="the tree to compare with")
    ap.add_argument("--runs", type=int, default=10, help="runs (pairs, with --against)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="a comma-separated subset")
    ap.add_argument("--imports", type=int, default=0, help="list the N largest imports a kind")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds: {sorted(unknown)}")
    trees = {THIS: REPO} if args.against is None else {AGAINST: args.against.resolve(), THIS: REPO}
    for tree in trees.values():
        byte_compile(tree)
    print(f"# load {os.getloadavg()[0]:.2f}, CPU probe {cpu_probe_ms():.1f} ms at the start")
    print(f"# trees: {', '.join(f'{k} = {v}' for k, v in trees.items())}; {args.runs} runs")
    with contextlib.ExitStack() as stack:
        daemons = {
            name: stack.enter_context(live_daemon(tree))
            for name, tree in trees.items()
            if "status" in kinds
        }
        samplers: dict[str, Callable[[str, Path], dict[str, float]]] = {
            "serve": lambda name, tree: serve(tree),
            "serve-preloaded": lambda name, tree: serve(tree, preloaded=True),
            "worker": lambda name, tree: worker(tree),
            "app-server": lambda name, tree: app_server(tree),
            "status": lambda name, tree: status(tree, daemons[name]),
        }
        pairs: dict[str, list[Pair]] = {kind: [] for kind in kinds}
        names = list(trees)
        for i in range(max(1, args.runs)):
            order = names if i % 2 == 0 else names[::-1]
            for kind in kinds:
                log(f"run {i + 1} of {args.runs}: {kind}")
                figures = {name: samplers[kind](name, trees[name]) for name in order}
                pairs[kind].append(Pair(order[0], figures))
        if args.imports:
            with tempfile.TemporaryDirectory(prefix="sc-imports-") as tmp:
                for kind in kinds:
                    log_path = Path(tmp) / f"{kind}.log"
                    if kind == "status":
                        status(REPO, daemons[THIS], log_path)
                    elif kind == "serve-preloaded":
                        serve(REPO, log_path, preloaded=True)
                    else:
                        {"serve": serve, "worker": worker, "app-server": app_server}[kind](
                            REPO, log_path
                        )
                    rows = largest_imports(log_path, args.imports)
                    print(
                        Table(
                            f"{kind}: the largest own import times (this tree, one start)",
                            ("self µs", "cumulative µs", "module"),
                            tuple(rows),
                        ).render()
                    )
                    print()
    tables = []
    for kind in kinds:
        if len(trees) == 2:
            tables.append(summary(f"{kind}: exec → ready", pairs[kind], ("cpu ms", "wall ms")))
        else:
            rows = []
            for figure in ("cpu ms", "wall ms"):
                values = [p.figures[THIS][figure] for p in pairs[kind]]
                rows.append((figure, statistics.median(values), min(values), max(values)))
            tables.append(
                Table(f"{kind}: exec → ready", ("figure", "median", "min", "max"), tuple(rows))
            )
    print(f"# CPU probe {cpu_probe_ms():.1f} ms at the end")
    print_pairs(MODULE, list(sys.argv[1:] if argv is None else argv), tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
