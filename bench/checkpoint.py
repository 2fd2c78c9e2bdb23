"""What a workspace checkpoint costs: a real git repository of many files (10,000 at full
size) with a few changed between checkpoints (10), timed side by side with an idle
`git status` of the same tree — the cost an incremental checkpoint is meant to match — and the
first (cold) checkpoint, and writing a checkpoint out as a new directory (`materialize`).
Then a `worktree` fork of the same tree through a real daemon (Tutti Agent), end to end, beside
a `git worktree add` of it and the same fork without a workspace: the target is the worktree
fork within 2× the sum of those two.

    build/venv/bin/python -m bench.checkpoint [--quick | --smoke] [--json PATH]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    BenchResult,
    Latency,
    Mode,
    Table,
    bench_main,
    cpu_probe_ms,
    log,
    pick,
    ratio,
)
from bench.harness import WS, BenchDaemon, acknowledge, run_turn
from transport.client import ApiError, Client
from workspace.shadow import Checkpoint, ShadowStore

TARGET_P50_MS = 100.0
TARGET_WORKTREE_RATIO = 2.0


def _git(repo: Path, *args: str) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@x",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@x",
    }
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def make_tree(root: Path, files: int) -> list[Path]:
    """A committed repository of `files` small files in 100-file directories."""
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    paths = []
    for i in range(files):
        d = root / f"pkg{i // 100:03d}"
        d.mkdir(exist_ok=True)
        p = d / f"mod{i % 100:02d}.py"
        p.write_text(f"# module {i}\nVALUE = {i}\n")
        paths.append(p)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "tree")
    return paths


def _fork(c: Client, sid: str, turn_id: str, workspace: str) -> dict[str, Any]:
    """`fork.create` (with `workspace`) until terminal, then ACKed; the committed operation."""
    params = {
        "workspaceId": WS,
        "agentSessionId": sid,
        "requestId": str(uuid.uuid4()),
        "targetAgentSessionId": str(uuid.uuid4()),
        "point": {"type": "throughTurn", "turnId": turn_id},
        "workspace": workspace,
    }
    status, body = c.call_raw("fork.create", params)
    if status >= 400:
        raise ApiError.from_reply(status, body)
    op = dict(body["operation"])
    while op["status"] == "accepted":
        time.sleep(0.01)
        op = dict(
            c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})["operation"]
        )
    assert op["status"] == "committed", op
    acknowledge(c, op["operationId"])
    return op


def worktree_forks(base: Path, repo: Path, rounds: int) -> tuple[Latency, Latency, Latency]:
    """(worktree fork, fork without a workspace, `git worktree add`), interleaved per round on
    one daemon whose Session works in `repo`; each tree is removed after its round."""
    home = base / "daemon-home"
    home.mkdir()
    # A cold checkpoint of a large tree may take longer than the default bound on a loaded host.
    (home / "agenthost.toml").write_text("[workspace]\ntimeout_s = 600\n")
    worktree_ms, shared_ms, add_ms = [], [], []
    with BenchDaemon(home).start() as d:
        c = d.client(timeout=600)
        sid = c.call(
            "session.create",
            {"workspaceId": WS, "provider": "tutti-agent", "title": "bench", "cwd": str(repo)},
        )["session"]["agentSessionId"]
        turn_id = run_turn(c, sid, "/write pkg000/mod00.py VALUE = 'changed by the agent'")
        for r in range(rounds):
            t0 = time.perf_counter()
            op = _fork(c, sid, turn_id, "worktree")
            worktree_ms.append(1000 * (time.perf_counter() - t0))
            t0 = time.perf_counter()
            _fork(c, sid, turn_id, "shared")
            shared_ms.append(1000 * (time.perf_counter() - t0))
            plain = base / f"plain-{r}"
            t0 = time.perf_counter()
            _git(repo, "worktree", "add", "-q", "-b", f"bench-{r}", str(plain), "HEAD")
            add_ms.append(1000 * (time.perf_counter() - t0))
            _git(repo, "worktree", "remove", "--force", str(plain))
            _git(repo, "worktree", "remove", "--force", op["workspace"]["path"])
    return Latency.of(worktree_ms), Latency.of(shared_ms), Latency.of(add_ms)


def run(mode: Mode) -> BenchResult:
    files = pick(mode, 10_000, 2_000, 200)
    rounds = pick(mode, 30, 10, 3)
    changed = 10
    result = BenchResult("checkpoint", "", mode.value)
    probe = cpu_probe_ms()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        base = Path(tmp)
        paths = make_tree(base / "repo", files)
        repo = base / "repo"
        store = ShadowStore(base / "home" / "checkpoints", timeout_s=120)
        t0 = time.perf_counter()
        cold = store.capture(repo)
        cold_ms = 1000 * (time.perf_counter() - t0)
        assert isinstance(cold, Checkpoint), cold
        log(f"cold checkpoint of {files} files: {cold_ms:.0f} ms")
        capture_ms, status_ms = [], []
        for r in range(rounds):
            for p in paths[r * changed % len(paths) :][:changed]:
                p.write_text(p.read_text() + f"# round {r}\n")
            # Interleaved, so both see the same page cache and load.
            t0 = time.perf_counter()
            subprocess.run(
                ["git", "status", "--porcelain"],
                cwd=repo,
                env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
                check=True,
                capture_output=True,
            )
            status_ms.append(1000 * (time.perf_counter() - t0))
            t0 = time.perf_counter()
            cp = store.capture(repo)
            capture_ms.append(1000 * (time.perf_counter() - t0))
            assert isinstance(cp, Checkpoint), cp
        t0 = time.perf_counter()
        store.materialize(repo, cp.commit, base / "copy")
        materialize_ms = 1000 * (time.perf_counter() - t0)
        capture, status = Latency.of(capture_ms), Latency.of(status_ms)
        fork_rounds = pick(mode, 10, 4, 2)
        worktree, shared, add = worktree_forks(base, repo, fork_rounds)
        log(
            f"worktree fork p50 {worktree.p50:.0f} ms; shared fork {shared.p50:.0f} ms; "
            f"git worktree add {add.p50:.0f} ms"
        )
    budget = ratio(worktree.p50, add.p50 + shared.p50)
    result.tables.append(
        Table(
            f"checkpoint of {files} files, {changed} changed per round ({rounds} rounds)",
            ("what", "p50 ms", "p90 ms", "max ms"),
            (
                ("incremental checkpoint", capture.p50, capture.p90, capture.max),
                ("idle git status, same tree", status.p50, status.p90, status.max),
                ("first (cold) checkpoint", cold_ms, cold_ms, cold_ms),
                (
                    "materialize into a new directory",
                    materialize_ms,
                    materialize_ms,
                    materialize_ms,
                ),
            ),
        )
    )
    result.figures = {
        "files": files,
        "changedPerRound": changed,
        "checkpoint": capture,
        "gitStatus": status,
        "coldMs": cold_ms,
        "materializeMs": materialize_ms,
        "worktreeFork": worktree,
        "sharedFork": shared,
        "gitWorktreeAdd": add,
        "worktreeForkRatio": budget,
        "cpuProbeMsAtStart": probe,
        "loadAverage1mAtStart": round(os.getloadavg()[0], 2),
    }
    result.tables.append(
        Table(
            f"a worktree fork of the {files}-file tree, end to end ({fork_rounds} rounds)",
            ("what", "p50 ms", "p90 ms", "max ms"),
            (
                (
                    "fork.create workspace=worktree → committed",
                    worktree.p50,
                    worktree.p90,
                    worktree.max,
                ),
                ("fork.create without a workspace", shared.p50, shared.p90, shared.max),
                ("git worktree add of the same tree", add.p50, add.p90, add.max),
            ),
        )
    )
    if mode is Mode.FULL:
        result.target(
            "worktree fork / (git worktree add + fork without a workspace), p50",
            budget,
            TARGET_WORKTREE_RATIO,
            higher_is_better=False,
            measured=f"{fork_rounds} rounds of {files} files",
        )
        result.target(
            "checkpoint p50, 10,000 files / 10 changed (ms)",
            capture.p50,
            TARGET_P50_MS,
            higher_is_better=False,
            measured=f"{rounds} rounds; idle git status p50 {status.p50:.1f} ms beside it",
        )
    result.notes.append(f"CPU probe at start {probe} ms; load {os.getloadavg()[0]:.2f}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.checkpoint", __doc__.splitlines()[0], run, argv)


if __name__ == "__main__":
    sys.exit(main())
