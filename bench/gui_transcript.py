"""How the GUI copes with a long transcript: a 1,000-Turn session opened, paged in whole,
scrolled, left and re-opened, and a streamed reply rendered at its end, through Textual's pilot
at 80x24 and 200x50 against a real daemon (tutti-agent's built-in model). Not part of `make
bench`: an experiment whose figures are in docs/performance.md "The GUI with 1,000 Turns".

Every figure is wall time in the pilot's process (headless: the terminal's own drawing is not
counted), the median (and worst) of the repetitions:

- open: `open_session` until the transcript shows the first page's Turns (those near the
  viewport mounted, the rest counted in its gaps);
- load all: every further page (Load more) until the transcript shows all Turns;
- scroll: a jump to each tenth of the transcript and the frame after it (top to bottom, back
  to the top), as a scroll bar drag lands;
- jump frame: the part of each scroll step until the jump's own frame is drawn (the Turns on
  screen mounted and laid out; the transcript mounts their margins on the frame after), or the
  whole step when it was no jump;
- wheel: 20 steps of 3 lines down from the middle, as a mouse wheel turns;
- switch: to a one-Turn session and back, until the long one's Turns are shown again;
- stream: one `message.delta` rendered at the end of the loaded transcript (`_on_delta`).

    build/venv/bin/python -m bench.gui_transcript [--turns N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import log
from bench.harness import WS, BenchDaemon, create_session, run_turn
from client.engine.lifecycle import Engine
from client.gui.app import AgentHostApp
from client.gui.transcript import LoadMoreRequested, TranscriptView

COMMAND = "build/venv/bin/python -m bench.gui_transcript"
SIZES = ((80, 24), (200, 50))


async def _until(pilot: Any, pred: Callable[[], Any], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("GUI condition not met")
        # Not `pilot.pause`: it gives up after 30 s of pending messages, which a slow step is.
        await asyncio.sleep(0.005)


CPU: dict[str, list[float]] = {}
"""The same steps' CPU ms in the pilot's process (on a shared host, wall time also counts the
other processes' turns on the cores; CPU time is what the GUI itself spent)."""


async def _timed(step: Callable[[], Awaitable[None]], name: str = "", kind: str = "") -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    await step()
    ms = (time.perf_counter() - t0) * 1000
    CPU.setdefault(kind or name.split(") ", 1)[-1], []).append((time.process_time() - c0) * 1000)
    if name:
        log(f"{name}: {ms:.0f} ms")  # as it goes: a slow run still leaves its figures
    return ms


def _mounted(app: AgentHostApp) -> int:
    """The Turns the transcript shows once it is settled (mounted near the viewport or counted
    in its gaps), else -1."""
    transcript = app.query_one(TranscriptView)
    return transcript.turn_count if transcript.idle else -1


async def measure(
    daemon: BenchDaemon, big: str, small: str, size: tuple[int, int], repeat: int
) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {
        "open": [],
        "load all": [],
        "scroll": [],
        "jump frame": [],
        "wheel": [],
        "switch": [],
        "stream": [],
    }
    engine = Engine.connect(daemon.api, daemon.events, WS)
    app = AgentHostApp(engine, own_engine=True)
    async with app.run_test(size=size) as pilot:
        await _until(pilot, lambda: app.sessions_loaded and engine.session(big) is not None)
        for _ in range(repeat):

            async def open_big() -> None:
                app.open_session(big)
                await _until(
                    pilot, lambda: app.current == big and _mounted(app) == len(app.turns) > 0
                )

            app.open_session(small)
            await _until(pilot, lambda: app.current == small and _mounted(app) == 1)
            figures["open"].append(await _timed(open_big, f"{size} open"))

            async def load_all() -> None:
                while app.has_more:
                    count = len(app.turns)
                    t0 = time.perf_counter()
                    app.post_message(LoadMoreRequested())
                    await _until(pilot, lambda count=count: len(app.turns) > count)
                    await _until(pilot, lambda: _mounted(app) == len(app.turns))
                    ms = (time.perf_counter() - t0) * 1000
                    log(f"{size} page to {len(app.turns)} turns: {ms:.0f} ms")

            figures["load all"].append(await _timed(load_all, f"{size} load all"))
            transcript = app.query_one(TranscriptView)
            steps = [0.0, *[transcript.max_scroll_y * i / 10 for i in range(1, 11)], 0.0]
            for y in steps:
                drawn: list[tuple[float, float]] = []
                margins = transcript._mount_margins  # noqa: SLF001 - called after a jump's frame

                def stamp(
                    margins: Callable[[], None] = margins,
                    drawn: list[tuple[float, float]] = drawn,
                ) -> None:
                    drawn.append((time.perf_counter(), time.process_time()))
                    margins()

                transcript._mount_margins = stamp  # type: ignore[method-assign]  # noqa: SLF001

                async def scroll(y: float = y, view: TranscriptView = transcript) -> None:
                    view.scroll_to(y=y, animate=False)
                    await pilot.pause()

                t0, c0 = time.perf_counter(), time.process_time()
                figures["scroll"].append(await _timed(scroll, f"{size} scroll"))
                del transcript._mount_margins  # noqa: SLF001
                end = drawn[0] if drawn else (time.perf_counter(), time.process_time())
                figures["jump frame"].append((end[0] - t0) * 1000)
                CPU.setdefault("jump frame", []).append((end[1] - c0) * 1000)
            transcript.scroll_to(y=transcript.max_scroll_y / 2, animate=False)
            await pilot.pause()
            for _ in range(20):

                async def wheel(view: TranscriptView = transcript) -> None:
                    view.scroll_to(y=view.scroll_y + 3, animate=False)
                    await pilot.pause()

                figures["wheel"].append(await _timed(wheel, kind="wheel"))
            log(f"{size} wheel: {statistics.median(figures['wheel']):.0f} ms median")
            last = app.turns[-1]

            async def stream(last: dict[str, Any] = last) -> None:
                await app._on_delta(  # noqa: SLF001 - the handler a live delta reaches
                    {
                        "type": "message.delta",
                        "agentSessionId": big,
                        "turnId": last["turnId"],
                        "itemId": "bench-item",
                        "kind": "assistant",
                        "delta": "more ",
                    }
                )

            for _ in range(5):
                figures["stream"].append(await _timed(stream, f"{size} stream"))

            async def switch() -> None:
                app.open_session(small)
                await _until(pilot, lambda: app.current == small and _mounted(app) == 1)
                await open_big()

            figures["switch"].append(await _timed(switch, f"{size} switch"))
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.gui_transcript")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--size", action="append", default=None, help="WxH (repeatable; default 80x24 and 200x50)"
    )
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="bench-gui-") as tmp,
        BenchDaemon(Path(tmp) / "home").start() as daemon,
    ):
        c = daemon.client()
        big = create_session(c, "Long transcript")
        small = create_session(c, "Short")
        run_turn(c, small, "hello")
        t0 = time.monotonic()
        for i in range(args.turns):
            run_turn(c, big, f"/tool step_{i} arg" if i % 10 == 0 else f"message {i}")
        log(f"{args.turns} turns in {time.monotonic() - t0:.0f} s")
        shown = "".join(f" --size {z}" for z in args.size or [])
        print(f"command: {COMMAND} --turns {args.turns} --repeat {args.repeat}{shown}")
        print(
            f"{'size':<8} {'step':<11} {'median ms':>10} {'worst ms':>10} {'cpu median':>10} "
            f"{'n':>4}"
        )
        sizes = [tuple(map(int, z.split("x"))) for z in args.size] if args.size else SIZES
        for size in sizes:
            CPU.clear()
            figures = asyncio.run(measure(daemon, big, small, (size[0], size[1]), args.repeat))
            for step, values in figures.items():
                cpu = statistics.median(CPU.get(step) or [0.0])
                print(
                    f"{size[0]}x{size[1]:<5} {step:<11} {statistics.median(values):>10.1f} "
                    f"{max(values):>10.1f} {cpu:>10.1f} {len(values):>4}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
