"""A settled Turn drawn with Textual's line API (`SettledTurnView`, one widget) against a
`TurnView` (four widgets: the Turn, its header and body `Static`s, its Fork `Button`): what
mounting the Turns of one screen costs each way (docs/performance.md §19.5).

The A/B runs in one process on a bare app (no daemon): per round, the Turns of one screen are
swapped for fresh ones of one kind (a jump's work: mount them, lay them out, draw the frame),
the kinds alternated round by round so a loaded host moves both alike; CPU ms of the process
per swap, medians. It also checks the look: the screen with the same Turns drawn each way,
line by line (text, and text with styles; `tests/client/test_gui_settled_turn.py` pins it).

    PYTHONPATH=$PWD build/venv/bin/python -m bench.gui_line_turn [--rounds N] [--size 200x50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll

from client.gui.transcript import SettledTurnView, TurnView
from client.session_client import ForkAction

COMMAND = "PYTHONPATH=$PWD build/venv/bin/python -m bench.gui_line_turn"
FORK_COLS = 14  # TurnView's header leaves these free for the docked button (12 + margin 0 1)
FORK_WIDTH = 12


def _turn(n: int) -> dict[str, Any]:
    return {
        "turnId": f"{n:08d}-0000-4000-8000-{n:012d}",
        "sequence": n,
        "phase": "settled",
        "outcome": "completed",
        "messages": [
            {"kind": "user", "text": f"say something about turn {n}"},
            {"kind": "assistant", "text": f"turn {n}: " + "a reply of a few words " * 3},
        ],
    }


class Bare(App[None]):
    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="pane")


def _screen_lines(app: App[Any]) -> list[list[Segment]]:
    update = app.screen._compositor.render_update(full=True, simplify=True)  # noqa: SLF001
    console = app.console
    lines: list[list[Segment]] = [[]]
    assert update is not None
    for segment in console.render(update, console.options.update_width(app.size.width)):
        if segment.text == "\n":
            lines.append([])
        else:
            lines[-1].append(segment)
    return [line for line in lines if line][: app.size.height]


def _plain(line: list[Segment]) -> str:
    return "".join(s.text for s in Segment.strip_styles(Segment.simplify(line)))


def _styled(line: list[Segment]) -> list[tuple[str, str]]:
    """Each cell's character and style; a blank cell by its background only (its foreground,
    bold or italic draw nothing)."""
    cells: list[tuple[str, str]] = []
    for seg in Segment.simplify(line):
        style = seg.style or RichStyle()
        blank = str(RichStyle(bgcolor=style.bgcolor))
        cells.extend((ch, blank if ch == " " else str(style)) for ch in seg.text)
    return cells


async def measure(size: tuple[int, int], rounds: int) -> dict[str, Any]:
    app = Bare()
    per = size[1] // 3 + 1  # a settled two-message Turn is 4 lines with its margin
    action = ForkAction.ENABLED
    cpu: dict[str, list[float]] = {"TurnView": [], "SettledTurnView": []}
    async with app.run_test(size=size) as pilot:
        pane = app.query_one("#pane", VerticalScroll)
        looks: dict[str, list[list[Segment]]] = {}
        for index in range(rounds * 2 + 2):
            kind = ("TurnView", "SettledTurnView")[index % 2]
            turns = [_turn((index + 1) * 1000 + i) for i in range(per)]
            if index < 2:  # the look: the same Turns drawn each way
                turns = [_turn(i + 1) for i in range(per)]
            c0 = time.process_time()
            await pane.remove_children()
            if kind == "TurnView":
                await pane.mount_all([TurnView("s", t, action) for t in turns])
            else:
                await pane.mount_all([SettledTurnView("s", t, action) for t in turns])
            await pilot.pause()
            ms = (time.process_time() - c0) * 1000
            if index < 2:
                for _ in range(3):  # the scroll bar appears on a later layout
                    await pilot.pause()
                looks[kind] = _screen_lines(app)
            else:
                cpu[kind].append(ms)
    a, b = looks["TurnView"], looks["SettledTurnView"]
    text_diff = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if _plain(x) != _plain(y)]
    style_diff = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if _styled(x) != _styled(y)]
    return {
        "turns": per,
        "cpu": {k: statistics.median(v) for k, v in cpu.items()},
        "text_diff": text_diff,
        "style_diff": style_diff,
        "sample": [(_plain(a[i]), _plain(b[i])) for i in text_diff[:3]],
        "cells": [
            (i, x, y)
            for i in style_diff[:3]
            for x, y in zip(_styled(a[i]), _styled(b[i]), strict=False)
            if x != y
        ][:6],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--size", action="append", default=[])
    args = parser.parse_args()
    sizes = [tuple(int(p) for p in s.split("x")) for s in args.size] or [(80, 24), (200, 50)]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
    for width, height in sizes:
        result = asyncio.run(measure((width, height), args.rounds))
        cpu = result["cpu"]
        print(
            f"{width}x{height}: {result['turns']} Turns per swap, CPU ms median of "
            f"{args.rounds}: TurnView {cpu['TurnView']:.1f}, "
            f"SettledTurnView {cpu['SettledTurnView']:.1f} "
            f"({cpu['SettledTurnView'] / cpu['TurnView']:.2f}x); lines differing: text "
            f"{result['text_diff']}, styles {result['style_diff']}"
        )
        for before, after in result["sample"]:
            print(f"  TurnView: {before!r}\n  SettledTurnView: {after!r}")
        for line, before, after in result["cells"]:
            print(f"  line {line}: TurnView {before} / SettledTurnView {after}")
    print(f"load {os.getloadavg()[0]:.1f}; {COMMAND} --rounds {args.rounds}")


if __name__ == "__main__":
    main()
