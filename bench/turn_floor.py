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
  The cheapest a capture can be is the one question every capture has to ask git, whatever
  it reuses: `ls-files --modified --others` against the shadow index (nothing changed since
  the previous capture: its tree is reused). Nothing orders it against the claim's COMMIT,
  so the floor counts the longer of the two;
- **the `after` checkpoint**: a settled Turn is never seen, nor forked through, without its
  `after` record (same section), so the files as the Turn left them are captured before the
  settlement is written: one more cheapest capture;
- **the settlement**: `turn.updated` says `settled` only once the settlement is durable: one
  more COMMIT.

    floor = max(COMMIT p50, capture p50) + capture p50 + COMMIT p50

Each part is timed here, on the same filesystem and the same kind of directory as the bench's
Sessions work in: the COMMIT as `bench.sync_floor` times it, the capture as one `git ls-files`
run exactly as `workspace.shadow.ShadowStore` runs it (its isolated environment, its shadow
index, the tree captured once before). The host's own capture of the same unchanged folder
(`ShadowStore.capture`: that `ls-files` plus what the shadow store does around it) is timed
beside it, interleaved, so the distance between the two is what the capture code adds.

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


def capture_latency(cwd: Path, root: Path, samples: int = SAMPLES) -> tuple[Latency, Latency]:
    """The cheapest capture of `cwd` (one `ls-files` against its shadow index, after a first
    capture made that index) and the host's own capture of it (`ShadowStore.capture`),
    interleaved sample by sample so both see the same load."""
    from workspace.shadow import ShadowStore

    shadow = ShadowStore(root)
    shadow.capture(cwd)  # the shadow repository and its index, as the previous Turn left them
    git = shadow._git()
    repo = shadow._repo(git, cwd)
    env = shadow._env(repo, cwd)
    args = ["ls-files", "-z", "--modified", "--others", "--exclude-standard"]
    floor: list[float] = []
    host: list[float] = []
    for i in range(samples):
        for kind in (0, 1) if i % 2 else (1, 0):
            t0 = time.perf_counter()
            if kind == 0:
                listed = git.run(args, env=env, cwd=cwd).stdout
                if listed:
                    raise RuntimeError(f"{cwd} changed while its floor was measured: {listed!r}")
                floor.append(1000 * (time.perf_counter() - t0))
            else:
                shadow.capture(cwd)
                host.append(1000 * (time.perf_counter() - t0))
    return Latency.of(floor), Latency.of(host)


@dataclass(frozen=True, slots=True)
class TurnFloor:
    commit: Latency
    capture: Latency
    """The cheapest capture: one `ls-files`."""
    host_capture: Latency
    """The host's own capture of the same unchanged folder, for comparison."""
    commits: int = COMMITS

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
        return (
            f"turn floor on this machine: max(claim COMMIT {self.commit.p50:.2f}, `before`"
            f" capture {self.capture.p50:.2f}) + `after` capture {self.capture.p50:.2f} +"
            f" settlement COMMIT {self.commit.p50:.2f} = {self.floor_ms:.1f} ms a Turn waits"
            f" for beyond the bare provider's; the host's own capture of the same unchanged"
            f" folder {self.host_capture.p50:.2f} ms (p50)"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "commitMs": self.commit.brief(),
            "captureMs": self.capture.brief(),
            "hostCaptureMs": self.host_capture.brief(),
            "commits": self.commits,
            "startMs": round(self.start_ms, 3),
            "settleMs": round(self.settle_ms, 3),
            "floorMs": round(self.floor_ms, 3),
        }


def measure(cwd: Path | None = None, samples: int = SAMPLES) -> TurnFloor:
    """Time each part in a fresh directory beside `cwd` (or in a temporary one): a COMMIT of a
    new store, and the captures of `cwd` (default: a new empty folder, as the bench's Sessions
    work in) into a new shadow store."""
    with tempfile.TemporaryDirectory(prefix="bench-turn-floor-") as tmp_text:
        tmp = Path(tmp_text)
        work = cwd
        if work is None:
            work = tmp / "work"
            work.mkdir()
        commit = commit_latency(tmp, samples=2 * samples)
        capture, host_capture = capture_latency(work, tmp / "checkpoints", samples)
    return TurnFloor(commit, capture, host_capture)


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
