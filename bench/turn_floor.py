"""The floor of one Turn on this machine (issue 36 target 2): what the laws make a host Turn wait
for beyond the bare provider's own Turn even if every other cost (the hops to the worker and
back, the actor's bookkeeping, the publication) were zero. `bench.turn_overhead` prints it
beside each provider's "host turn p50 - bare turn p50", with their ratio, as `bench.sync_floor`
does for a fork.

What the laws force onto a Turn's critical path:

- **the claim** (seed 000, docs/design/store.md): `turn.submit` is answered, and the provider
  sees the Turn, only once its claim (the active Turn, its user Message, the request id) is
  durable: one COMMIT of the store, WAL with `synchronous=FULL`, i.e. one `fdatasync`;
- **the `before` checkpoint** (docs/design/workspace.md, "When checkpoints are taken"): the
  files as they were before the provider may write, recorded before `turn.start` reaches it.
  The cheapest a capture of an unchanged folder can be is what the host's capture does when
  the folder has not changed since its last clean capture and is older than the racy margin
  (a person's project folder is): the stat check of its snapshot (`ShadowStore._unchanged`:
  one `lstat` per entry walked and the shadow index's checksum, no process; "What one capture
  starts"). Its tree is kept by a ref the law writes before the settlement that records the
  tree ("Invariants"), one a tree per Session: an unchanged folder's tree is its previous
  Turn's, whose ref is there already, so the cheapest capture writes none. A folder without a
  snapshot (too big, or changed since) needs one `git ls-files --modified --others` against the
  shadow index instead of the stat check (listing nothing: the tree and its ref are the last
  capture's): that is the cheapest capture then, and is timed beside for comparison in every
  case. Nothing orders the capture against
  the claim's COMMIT, so the floor counts the longer of the two;
- **the `after` checkpoint**: a settled Turn is never seen, nor forked through, without its
  `after` record (same section), so the files as the Turn left them are captured before the
  settlement is written: one more cheapest capture;
- **the settlement**: `turn.updated` says `settled` only once the settlement is durable: one
  more COMMIT.

    floor = max(COMMIT p50, capture p50) + capture p50 + COMMIT p50

Each part is timed here, on the same filesystem and the same kind of directory as the bench's
Sessions work in (an empty folder, aged past the racy margin first, as `bench.turn_overhead`
ages its Sessions' folder before its timed Turns): the COMMIT as `bench.sync_floor` times it;
the stat check; one `git ls-files` run exactly as `workspace.shadow.ShadowStore` runs it (its
isolated environment, its shadow index); and the host's own `before`
capture of the same folder as `actors.checkpoints.TurnCheckpoints` makes it
(`ShadowStore.capture`, its tree's ref kept: written once, then known) — interleaved sample
by sample, so the distances between them are what git and the capture code add to the
cheapest.

    build/venv/bin/python -m bench.turn_floor [--cwd DIR] [--samples 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import Latency, cpu_probe_ms
from bench.sync_floor import commit_latency

SAMPLES = 100
COMMITS = 2
"""The claim's and the settlement's: the only durable writes a law puts between the ask and the
provider, and between the provider's end and the client's `settled`."""


@dataclass(frozen=True, slots=True)
class Captures:
    """One folder's captures, timed interleaved: the cheapest, git's listing, the host's."""

    cheapest: Latency
    git: Latency
    """One `ls-files --modified --others` against the shadow index, and the ref kept."""
    host: Latency
    """The host's `before` capture: `ShadowStore.capture`, the ref kept, the `after` lock."""
    kind: str
    """What the cheapest is: "stat check" (the folder has a snapshot) or "ls-files"; either
    with its ref kept (one loose ref written), as the law keeps every recorded tree."""


def capture_latency(
    cwd: Path, root: Path, samples: int = SAMPLES, *, racy_margin_ns: int | None = None
) -> Captures:
    """The captures of `cwd` (unchanged meanwhile) into a new shadow store under `root`, after a
    first capture made its index and, when the folder allows one, its stat snapshot: the stat
    check, one `ls-files`, and the host's own `before` capture, interleaved sample by sample so
    all see the same load. The folder is aged past the racy margin first (`racy_margin_ns`:
    another margin, for tests)."""
    from workspace.shadow import ShadowStore

    shadow = ShadowStore(root)
    if racy_margin_ns is not None:
        shadow.racy_margin_ns = racy_margin_ns
    _age(cwd, shadow.racy_margin_ns)
    shadow.capture(cwd)  # the shadow repository, its index and snapshot, as a Turn leaves them
    git = shadow._git()
    real = os.path.realpath(cwd)
    repo = shadow._repo(git, cwd, real)
    index = repo / "index"
    env = shadow._env(repo, cwd)
    kind = "stat check" if shadow._unchanged(repo, index) is not None else "ls-files"
    args = ["ls-files", "-z", "--modified", "--others", "--exclude-standard"]
    check: list[float] = []
    listing: list[float] = []
    host: list[float] = []
    changed = f"{cwd} changed while its floor was measured"
    tree = shadow.capture(cwd, real)
    if getattr(tree, "commit", None) is None:
        raise RuntimeError(f"{cwd} could not be captured: {tree}")
    for i in range(samples):
        for part in (0, 1, 2) if i % 2 else (2, 1, 0):
            t0 = time.perf_counter()
            if part == 0:
                if kind == "stat check" and shadow._unchanged(repo, index) is None:
                    raise RuntimeError(f"{changed}: its stat snapshot no longer holds")
                if kind == "stat check":
                    check.append(1000 * (time.perf_counter() - t0))
            elif part == 1:
                listed = git.run(args, env=env, cwd=cwd).stdout
                if listed:
                    raise RuntimeError(f"{changed}: {listed!r}")
                listing.append(1000 * (time.perf_counter() - t0))
            else:
                done = shadow.capture(cwd, real)
                kept = getattr(done, "commit", None)
                if kept is None:
                    raise RuntimeError(f"{cwd} could not be captured: {done}")
                # As a Turn keeps it: its Session's ref of the tree (there after the first).
                shadow.keep_commit(cwd, f"floor/+{kept}", kept, real)
                host.append(1000 * (time.perf_counter() - t0))
    git_ms = Latency.of(listing)
    cheapest = Latency.of(check) if kind == "stat check" else git_ms
    return Captures(cheapest, git_ms, Latency.of(host), kind)


def _age(cwd: Path, margin_ns: int) -> None:
    """Wait until `cwd` and its entries are older than the racy margin (a capture takes a
    younger entry on its stat never, and asks git every time)."""
    newest = max([cwd.stat().st_ctime_ns, *(p.lstat().st_ctime_ns for p in cwd.rglob("*"))])
    wait = (newest + margin_ns - time.time_ns()) / 1e9
    if wait > 0:
        time.sleep(wait + 0.05)


@dataclass(frozen=True, slots=True)
class TurnFloor:
    commit: Latency
    capture: Latency
    """The cheapest capture: the stat check of a folder with a snapshot, else one `ls-files`;
    its ref kept."""
    host_capture: Latency
    """The host's own `before` capture of the same unchanged folder, for comparison."""
    commits: int = COMMITS
    git_capture: Latency | None = None
    """One `ls-files` of the same folder (what a capture asks git when it has no snapshot)."""
    capture_kind: str = "ls-files"

    @property
    def start_ms(self) -> float:
        """Before the provider sees the Turn: the claim's COMMIT and the `before` capture."""
        return max(self.commit.p50, self.capture.p50)

    @property
    def settle_ms(self) -> float:
        """Before the client is told the Turn settled: the `after` capture, then the COMMIT."""
        return self.capture.p50 + (self.commits - 1) * self.commit.p50

    @property
    def floor_ms(self) -> float:
        return self.start_ms + self.settle_ms

    def ratio(self, overhead_ms: float) -> float:
        """How many floors a host's turn overhead (host p50 - bare p50) is."""
        return overhead_ms / self.floor_ms if self.floor_ms > 0 else float("nan")

    def line(self) -> str:
        git = ""
        if self.git_capture is not None and self.capture_kind != "ls-files":
            git = f", one `ls-files` {self.git_capture.p50:.2f} ms"
        return (
            f"turn floor on this machine: max(claim COMMIT {self.commit.p50:.2f}, `before`"
            f" capture {self.capture.p50:.2f}) + `after` capture {self.capture.p50:.2f} +"
            f" settlement COMMIT {self.commit.p50:.2f} = {self.floor_ms:.1f} ms a Turn waits"
            f" for beyond the bare provider's (the cheapest capture: {self.capture_kind});"
            f" the host's own capture of the same unchanged folder"
            f" {self.host_capture.p50:.2f} ms{git} (p50)"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "commitMs": self.commit.brief(),
            "captureMs": self.capture.brief(),
            "hostCaptureMs": self.host_capture.brief(),
            "captureKind": self.capture_kind,
            **({"gitCaptureMs": self.git_capture.brief()} if self.git_capture else {}),
            "commits": self.commits,
            "startMs": round(self.start_ms, 3),
            "settleMs": round(self.settle_ms, 3),
            "floorMs": round(self.floor_ms, 3),
        }


def measure(cwd: Path | None = None, samples: int = SAMPLES) -> TurnFloor:
    """Time each part in a fresh directory beside `cwd` (or in a temporary one): a COMMIT of a
    new store, and the captures of `cwd` (default: a new empty folder, as the bench's Sessions
    work in, aged past the racy margin) into a new shadow store."""
    with tempfile.TemporaryDirectory(prefix="bench-turn-floor-") as tmp_text:
        tmp = Path(tmp_text)
        work = cwd
        if work is None:
            work = tmp / "work"
            work.mkdir()
        commit = commit_latency(tmp, samples=2 * samples)
        caps = capture_latency(work, tmp / "checkpoints", samples)
    return TurnFloor(commit, caps.cheapest, caps.host, git_capture=caps.git, capture_kind=caps.kind)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.turn_floor", description=__doc__)
    ap.add_argument("--cwd", type=Path, default=None, help="the folder the Turns work in")
    ap.add_argument("--samples", type=int, default=SAMPLES)
    args = ap.parse_args(argv)
    probe, load = cpu_probe_ms(), os.getloadavg()[0]
    floor = measure(args.cwd, args.samples)
    print(floor.line())
    print(f"CPU probe at start {probe:.0f} ms; load {load:.2f}")
    print(f"command: {sys.executable} -m bench.turn_floor", *(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
