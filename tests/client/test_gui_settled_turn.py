"""A settled Turn drawn with Textual's line API (`SettledTurnView`, one widget): it draws the
same cells as a `TurnView` (four widgets) of the same Turn, at 80 and 200 columns, in each Fork
state, with the mouse on its Fork label or not; a click on its Fork label forks (not on a
disabled label, not elsewhere on the Turn); hovering the label shows the Button's tooltip."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rich.segment import Segment
from rich.style import Style
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget

from client.gui.transcript import ForkRequested, SettledTurnView, TurnView
from client.session_client import ForkAction
from tests.client.make_screenshot import screen_segments

pytestmark = pytest.mark.timeout(60)


def _turn(n: int, *, files: bool = False) -> dict[str, Any]:
    turn: dict[str, Any] = {
        "turnId": f"{n:08d}-0000-4000-8000-{n:012d}",
        "sequence": n,
        "phase": "settled",
        "outcome": "completed",
        "providerForkBindingState": "bound",
        "messages": [
            {"kind": "user", "text": f"plan step {n}"},
            {"kind": "assistant", "text": "a reply long enough to wrap at eighty columns " * 3},
        ],
    }
    if files:
        turn["workspace"] = {
            "state": "recorded",
            "after": "ckpt",
            "changedFiles": [{"path": "a.txt", "kind": "modified"}],
        }
    return turn


class Pane(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.forks: list[str] = []

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="pane")

    def on_fork_requested(self, message: ForkRequested) -> None:
        self.forks.append(message.turn_id)


def _cells(app: App[Any]) -> list[list[tuple[str, str]]]:
    """Each screen cell's character and style; a blank cell by its background only (a
    foreground on a space draws nothing)."""
    rows = []
    for line in screen_segments(app):  # type: ignore[arg-type]
        cells: list[tuple[str, str]] = []
        for segment in Segment.simplify(line):
            if segment.control:
                continue
            style = segment.style or Style()
            blank = str(Style(bgcolor=style.bgcolor))
            cells.extend((ch, blank if ch == " " else str(style)) for ch in segment.text)
        rows.append(cells)
    return rows


async def _draw(
    app: Pane, pilot: Any, widgets: list[Widget]
) -> tuple[list[list[tuple[str, str]]], list[list[tuple[str, str]]]]:
    """The screen with these Turns, and with the mouse on the first one's Fork label."""
    pane = app.query_one("#pane", VerticalScroll)
    await pilot.hover(pane, offset=(0, pane.region.height - 1))
    await pane.remove_children()
    await pane.mount_all(widgets)
    for _ in range(3):  # the scroll bar comes with a later layout
        await pilot.pause()
    still = _cells(app)
    first = widgets[0]
    await pilot.hover(first, offset=(first.region.width - 8, 0))
    for _ in range(2):
        await pilot.pause()
    return still, _cells(app)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
@pytest.mark.parametrize(
    "action", [ForkAction.ENABLED, ForkAction.BLOCKED, ForkAction.DISABLED, ForkAction.HIDDEN]
)
def test_a_settled_turn_draws_the_same_cells_as_a_turn_view(
    size: tuple[int, int], action: ForkAction
) -> None:
    asyncio.run(_same_cells(size, action))


async def _same_cells(size: tuple[int, int], action: ForkAction) -> None:
    turns = [_turn(n, files=n % 2 == 0) for n in range(1, 7)]  # more than a screen at 80x24
    app = Pane()
    async with app.run_test(size=size) as pilot:
        widgets = await _draw(app, pilot, [TurnView("s", t, action, "busy") for t in turns])
        lines = await _draw(app, pilot, [SettledTurnView("s", t, action, "busy") for t in turns])
        assert all(not view.children for view in app.query(SettledTurnView))
        assert not app.query(TurnView)
    for drawn, expected in zip(lines, widgets, strict=True):  # still, and the label hovered
        assert [i for i, (a, b) in enumerate(zip(expected, drawn, strict=True)) if a != b] == []
    assert any("Turn 1" in "".join(ch for ch, _ in row) for row in lines[0])


def test_a_click_on_the_fork_label_forks_and_nowhere_else() -> None:
    asyncio.run(_clicks())


async def _clicks() -> None:
    app = Pane()
    async with app.run_test(size=(80, 24)) as pilot:
        usable = SettledTurnView("s", _turn(1), ForkAction.ENABLED)
        busy = SettledTurnView("s", _turn(2), ForkAction.BLOCKED, "Turn 3 is still running")
        await app.query_one("#pane").mount_all([usable, busy])
        await pilot.pause()
        label = usable.region.width - 8  # the middle of the label (padding 1, margin 1, 12/2)
        await pilot.click(usable, offset=(2, 0))  # the header's text
        await pilot.click(usable, offset=(label, 1))  # the body, under the label
        await pilot.click(busy, offset=(label, 0))  # a disabled label
        await pilot.pause()
        assert app.forks == []
        await pilot.click(usable, offset=(label, 0))
        await pilot.pause()
        assert app.forks == [usable.turn_id]
        # Hovering a label shows the Button's tooltip; elsewhere on the Turn, none.
        await pilot.hover(busy, offset=(label, 0))
        await pilot.pause()
        assert busy.tooltip == "Cannot fork now: Turn 3 is still running"
        await pilot.hover(busy, offset=(2, 1))
        await pilot.pause()
        assert busy.tooltip is None


def test_an_update_redraws_the_turn_in_place() -> None:
    asyncio.run(_update())


async def _update() -> None:
    app = Pane()
    async with app.run_test(size=(80, 24)) as pilot:
        view = SettledTurnView("s", _turn(1), ForkAction.ENABLED)
        await app.query_one("#pane").mount(view)
        await pilot.pause()
        height = view.size.height
        turn = _turn(1, files=True)
        await view.update(turn, ForkAction.DISABLED)
        await pilot.pause()
        assert app.query_one(SettledTurnView) is view
        assert view.fork_label == "Forking…" and view.fork_disabled
        assert "1 file changed" in view.lines()[0].text
        assert any("M a.txt" in strip.text for strip in view.lines()[1:])
        assert view.size.height == height + 1  # the files line: laid out again


def test_the_mouse_selects_a_settled_turns_text() -> None:
    asyncio.run(_select())


async def _select() -> None:
    app = Pane()
    async with app.run_test(size=(80, 24)) as pilot:
        view = SettledTurnView("s", _turn(1), ForkAction.ENABLED)
        await app.query_one("#pane").mount(view)
        await pilot.pause()
        texts = [strip.text.rstrip() for strip in view.lines()]
        assert len(texts) >= 4, texts  # the reply wraps
        left = view.content_region.x - view.region.x  # the border and the padding
        await pilot.hover(view, offset=(left, 3))
        before = _cells(app)
        # Drag from the start of the second line to the sixth cell of the third.
        await pilot.mouse_down(view, offset=(left, 1))
        await pilot.hover(view, offset=(left + 5, 2))
        await pilot.mouse_up(view, offset=(left + 5, 2))
        await pilot.pause()
        # (Whether the cell under the pointer is in is Textual's choice: five or six.)
        selected_text = app.screen.get_selected_text() or ""
        first, _, rest = selected_text.partition("\n")
        assert first == texts[1] and rest == texts[2][: len(rest)], (selected_text, texts)
        assert len(rest) in (5, 6), rest
        # Exactly the selected cells are painted (the selection style), nothing else changed.
        after = _cells(app)
        top, x0 = view.region.y, view.content_region.x
        changed = {
            (y, x)
            for y, (old, new) in enumerate(zip(before, after, strict=True))
            for x, (a, b) in enumerate(zip(old, new, strict=True))
            if a != b
        }
        selected = {(top + 1, x0 + i) for i in range(len(texts[1]))}
        selected |= {(top + 2, x0 + i) for i in range(len(rest))}
        assert changed == selected, sorted(changed ^ selected)
        # The text stays readable: a selected character is not drawn in its background colour.
        for y, x in selected:
            char, style = after[y][x]
            if char != " ":
                parsed = Style.parse(style)
                assert parsed.color != parsed.bgcolor, (char, style)
        # A click elsewhere clears it.
        await pilot.click(view, offset=(left + 6, 3))
        await pilot.pause()
        assert app.screen.get_selected_text() is None
        assert _cells(app) == before
        # The header's text is selectable without its Fork label.
        await pilot.mouse_down(view, offset=(left, 0))
        await pilot.hover(view, offset=(view.region.width - 2, 0))
        await pilot.mouse_up(view, offset=(view.region.width - 2, 0))
        await pilot.pause()
        header = app.screen.get_selected_text() or ""
        assert header.startswith("Turn 1 ") and "Fork" not in header, header


def test_a_turn_the_provider_never_got_says_so_not_that_it_blocks_forks() -> None:
    asyncio.run(_never_sent())


async def _never_sent() -> None:
    lost = {"outcome": "failed", "providerForkBindingState": "unavailable"}
    app = Pane()
    async with app.run_test(size=(80, 24)) as pilot:
        views = [
            SettledTurnView("s", {**_turn(1), **lost, "hostOnly": True}, ForkAction.HIDDEN),
            SettledTurnView("s", {**_turn(2), **lost}, ForkAction.HIDDEN),
        ]
        await app.query_one("#pane").mount_all(views)
        for _ in range(2):
            await pilot.pause()
        rows = ["".join(ch for ch, _ in row) for row in _cells(app)]
    headers = [r for r in rows if "Turn 1" in r or "Turn 2" in r]
    assert len(headers) == 2, rows
    # A host-only Turn blocks no fork; an unbound one without the mark does.
    assert "failed · never sent to the provider" in headers[0], headers
    assert "cannot be forked" not in headers[0], headers
    assert "failed · cannot be forked" in headers[1], headers
