"""The Codex worker's check that a Session's rollout still holds the end of its last bound,
completed Turn (`CodexProvider.turn_end_missing`, drivers/turn_ends.py), as a warm Turn
makes it: on a rollout of `TURNS` Turns (Codex 0.171's line shapes, `PAD` bytes of reply
each), N times each of: the Turn asked again (its line kept: one `pread` of it), a Turn just
ended (found in the file's last 256 KiB), and a cold search for the first Turn (the whole file
read from its end). In-process, one thread: prints the thread CPU per check, µs, at any load.
`--tutti`: the Tutti Agent's check (`TuttiAgentProvider.turn_end_missing`, the same
`TurnEnds`) on a rollout of the same Turns filed as the Tutti Agent files it.

    PYTHONPATH=$TREE build/venv/bin/python -m bench.codex_turn_end [N] [--tutti]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from drivers.codex.driver import CodexProvider
from drivers.tutti_agent import TuttiAgentProvider

TURNS = 200
PAD = 2000


def _line(ordinal: int, kind: str, payload: dict[str, object]) -> bytes:
    record = {"timestamp": "2026-12-07T00:00:00.000Z", "ordinal": ordinal, "type": kind}
    record["payload"] = payload
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def rollout(home: Path, thread: str, *, tutti: bool = False) -> tuple[Path, list[str]]:
    # The Tutti Agent files a rollout directly in `sessions/`, Codex by its day.
    day = home / "sessions" if tutti else home / "sessions" / "2026" / "12" / "07"
    day.mkdir(parents=True)
    path = day / f"rollout-2026-12-07T00-00-00-{thread}.jsonl"
    turns = [str(uuid.uuid4()) for _ in range(TURNS)]
    out = [_line(0, "session_meta", {"id": thread})]
    for turn in turns:
        n = len(out)
        start: dict[str, object] = {"type": "task_started", "turn_id": turn}
        if not tutti:
            start = {"type": "task_started", "turn_attribution": {"turn_id": turn}}
        out.append(_line(n, "event_msg", start))
        item = {"type": "message", "role": "assistant", "content": [{"text": "x" * PAD}]}
        out.append(_line(n + 1, "response_item", item))
        end = {"type": "task_complete", "turn_id": turn, "last_agent_message": "x" * 200}
        out.append(_line(n + 2, "event_msg", end))
    path.write_bytes(b"".join(out))
    return path, turns


def cpu_us(fn: object, n: int) -> float:
    call = fn  # type: ignore[assignment]
    t0 = time.thread_time_ns()
    for _ in range(n):
        call()  # type: ignore[operator]
    return (time.thread_time_ns() - t0) / n / 1000


def main(argv: list[str]) -> int:
    tutti = "--tutti" in argv
    argv = [a for a in argv if a != "--tutti"]
    n = int(argv[0]) if argv else 2000
    with tempfile.TemporaryDirectory(prefix="codex-turn-end-") as tmp:
        home = Path(tmp) / "home"
        thread = str(uuid.uuid4())
        path, turns = rollout(home, thread, tutti=tutti)
        provider = TuttiAgentProvider({}) if tutti else CodexProvider({})
        assert provider.history_gone(home, thread) is False  # the path known, as at a start
        last = turns[-1]
        assert provider.turn_end_missing(home, thread, last, search=False) is False
        kept = cpu_us(lambda: provider.turn_end_missing(home, thread, last, search=False), n)

        def new_turn() -> None:
            provider.turn_end_missing(home, thread, turns[-2], search=False)
            provider.turn_end_missing(home, thread, last, search=False)

        tail = cpu_us(new_turn, n) / 2

        def far() -> None:  # two Turns far from the end, asked in turn: each a search
            provider.turn_end_missing(home, thread, turns[0], search=True)
            provider.turn_end_missing(home, thread, turns[1], search=True)

        cold = cpu_us(far, max(1, n // 20)) / 2
        size = path.stat().st_size
    print(
        f"{'tutti-agent' if tutti else 'codex'} rollout={size / 1e6:.1f}MB turns={TURNS} n={n}"
        f" | kept={kept:.1f}us "
        f"tail={tail:.1f}us search_first={cold:.0f}us",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
