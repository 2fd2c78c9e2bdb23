"""A Turn's checkpoint captures of an unchanged folder, N times, as the daemon takes them: the
`before` on the checkpoint pool, the `after` on the asking thread
(`TurnCheckpoints.capture_after_here`, else the pool), after three warm-up Turns. Prints
`START` on stdout before the counted Turns; run it under strace to count the system calls a
Turn makes under the checkpoint store (docs/performance.md, ckref):

    PYTHONPATH=$T strace -f -qq -e trace=mkdir,rename,openat,unlink,write -o out \
      build/venv/bin/python -m bench.checkpoint_ref_calls 200
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from actors.checkpoints import TurnCheckpoints
from workspace.shadow import Checkpoint, ShadowStore


def _turn(turns: TurnCheckpoints, cwd: str, turn: str) -> bool:
    """One Turn's two captures; whether the `after` was taken on this thread."""
    before = turns.capture(cwd, "s1", turn, "before").result(30)
    assert isinstance(before.checkpoint, Checkpoint), before
    tree = before.checkpoint.tree
    if turns.capture_after_here(cwd, "s1", turn, tree) is not None:
        return True
    turns.capture(cwd, "s1", turn, "after", tree).result(30)
    return False


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 200
    root = Path(tempfile.mkdtemp(prefix="ckref-count-"))
    cwd = root / "work"
    cwd.mkdir()
    (cwd / "a.txt").write_text("a\n")
    store = ShadowStore(root / "home" / "checkpoints")
    store.racy_margin_ns = 10**8
    time.sleep(0.3)  # the folder older than the racy margin: its stat snapshot answers
    turns = TurnCheckpoints(store)
    try:
        for i in range(3):
            _turn(turns, str(cwd), f"w{i}")
        print("START", flush=True)
        here = sum(_turn(turns, str(cwd), f"t{i}") for i in range(n))
    finally:
        turns.pool.shutdown(wait=True)
    print(f"{n} Turns, {here} `after`s on the asking thread; home {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
