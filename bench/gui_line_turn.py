"""A settled Turn drawn with Textual's line API, against today's `TurnView`: what mounting the
Turns of one screen costs each way. A prototype, not the GUI's code (docs/performance.md §19.5).

`LineTurn` is one widget with no children: its header line (the Fork label drawn at its right
end, where `TurnView`'s docked button sits) and its body are rendered once per width into
cached `Strip`s, and `render_line(y)` returns them, so mounting it costs one widget's styles
and layout and a frame costs only the lines on screen. A click on the label posts
`ForkRequested`, as the button does.

The A/B runs in one process on a bare app (no daemon): per round, the Turns of one screen are
swapped for fresh ones of one kind (a jump's work: mount them, lay them out, draw the frame),
the kinds alternated round by round so a loaded host moves both alike; CPU ms of the process
per swap, medians. It also checks the look: the screen with the same Turns drawn each way,
line by line (text, and text with styles).

    PYTHONPATH=$PWD build/venv/bin/python -m bench.gui_line_turn [--rounds N] [--size 200x50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Mapping
from typing import Any

from rich.segment import Segment
from rich.style import Style as RichStyle
from textual import events
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.geometry import Size
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widget import Widget

from client.gui.transcript import ForkRequested, TurnView
from client.gui.turn_text import turn_body, turn_header
from client.session_client import ForkAction

COMMAND = "PYTHONPATH=$PWD build/venv/bin/python -m bench.gui_line_turn"
FORK_COLS = 14  # TurnView's header leaves these free for the docked button (12 + margin 0 1)
FORK_WIDTH = 12


class LineTurn(Widget):
    """A settled Turn as one widget: header (with its Fork label) and body from cached strips."""

    DEFAULT_CSS = """
    LineTurn {
        height: auto; padding: 0 1; margin-bottom: 1; border-left: tall $primary 30%;
    }
    LineTurn > .line-turn--fork {
        text-style: bold; color: $button-color-foreground; background: $primary;
    }
    LineTurn > .line-turn--fork-off {
        text-style: bold; color: $button-foreground 60%; background: $surface;
    }
    """
    COMPONENT_CLASSES = {"line-turn--fork", "line-turn--fork-off"}

    def __init__(self, session_id: str, turn: Mapping[str, Any], action: ForkAction) -> None:
        super().__init__(id=f"turn-{turn['turnId']}")
        self.session_id = session_id
        self.turn = dict(turn)
        self.action = action
        self._strips: tuple[int, list[Strip]] | None = None

    def _fork_strip(self) -> Strip:
        """The label the docked compact `Button` draws: centred in 12 columns, margin 0 1; its
        colours from component classes that mirror the Button's CSS."""
        if self.action is ForkAction.HIDDEN:
            return Strip([])
        enabled = self.action is ForkAction.ENABLED
        part = "line-turn--fork" if enabled else "line-turn--fork-off"
        style = self.get_component_rich_style(part)
        label = "Forking…" if self.action is ForkAction.DISABLED else "Fork"
        base = self.rich_style
        cell = label.center(FORK_WIDTH)
        return Strip([Segment(" ", base), Segment(cell, style), Segment(" ", base)])

    def _lines(self, width: int) -> list[Strip]:
        if self._strips is not None and self._strips[0] == width:
            return self._strips[1]
        style = self.visual_style
        fork = self._fork_strip()
        head_width = max(1, width - fork.cell_length)
        header = turn_header(self.turn, self.action is ForkAction.ENABLED)
        header.truncate(head_width, overflow="ellipsis")
        head = Visual.to_strips(
            self, visualize(self, Content.from_rich_text(header)), head_width, 1, style
        )[0]
        head = head.extend_cell_length(head_width, self.rich_style).crop(0, head_width)
        body = Visual.to_strips(
            self, visualize(self, Content.from_rich_text(turn_body(self.turn))), width, None, style
        )
        lines = [
            Strip.join([head, fork]),
            *(s.extend_cell_length(width, self.rich_style) for s in body),
        ]
        self._strips = (width, lines)
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width))

    def render_line(self, y: int) -> Strip:
        lines = self._lines(self.size.width)
        return lines[y] if y < len(lines) else Strip.blank(self.size.width, self.rich_style)

    def on_click(self, event: events.Click) -> None:
        on_label = event.y == 0 and event.x >= self.size.width - FORK_COLS + 1
        if self.action is ForkAction.ENABLED and on_label:
            self.post_message(ForkRequested(self.session_id, str(self.turn["turnId"])))


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
    cpu: dict[str, list[float]] = {"TurnView": [], "LineTurn": []}
    async with app.run_test(size=size) as pilot:
        pane = app.query_one("#pane", VerticalScroll)
        looks: dict[str, list[list[Segment]]] = {}
        for index in range(rounds * 2 + 2):
            kind = ("TurnView", "LineTurn")[index % 2]
            turns = [_turn((index + 1) * 1000 + i) for i in range(per)]
            if index < 2:  # the look: the same Turns drawn each way
                turns = [_turn(i + 1) for i in range(per)]
            c0 = time.process_time()
            await pane.remove_children()
            if kind == "TurnView":
                await pane.mount_all([TurnView("s", t, action) for t in turns])
            else:
                await pane.mount_all([LineTurn("s", t, action) for t in turns])
            await pilot.pause()
            ms = (time.process_time() - c0) * 1000
            if index < 2:
                for _ in range(3):  # the scroll bar appears on a later layout
                    await pilot.pause()
                looks[kind] = _screen_lines(app)
            else:
                cpu[kind].append(ms)
    a, b = looks["TurnView"], looks["LineTurn"]
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
            f"{args.rounds}: TurnView {cpu['TurnView']:.1f}, LineTurn {cpu['LineTurn']:.1f} "
            f"({cpu['LineTurn'] / cpu['TurnView']:.2f}x); lines differing: text "
            f"{result['text_diff']}, styles {result['style_diff']}"
        )
        for before, after in result["sample"]:
            print(f"  TurnView: {before!r}\n  LineTurn: {after!r}")
        for line, before, after in result["cells"]:
            print(f"  line {line}: TurnView {before} / LineTurn {after}")
    print(f"load {os.getloadavg()[0]:.1f}; {COMMAND} --rounds {args.rounds}")


if __name__ == "__main__":
    main()
