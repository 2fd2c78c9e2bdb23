"""Regenerates docs/images/gui-fork.svg (and .png): a real daemon, a session of three turns
forked through its second, a turn on the child, and the GUI showing the child; then
gui-approval (a pending approval with Approve / Decline), gui-fork-refused (a busy source:
Fork disabled with its reason as the tooltip, and a refusal toast in words), and the sizes: the
fork child at 80x24 and 200x50, with the keys screen and a fork confirmation at 80x24.

Run: `build/venv/bin/python -m tests.client.make_screenshot [OUT_DIR]`. The PNG is drawn from
the same terminal cells with Pillow and DejaVu Sans Mono (no SVG renderer is needed).
"""

from __future__ import annotations

import asyncio
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.segment import Segment

from client.engine.lifecycle import Engine
from client.engine.values import AckState
from client.gui.app import AgentHostApp
from client.gui.transcript import ForkRequested as ForkRequestedMsg
from tests.support.daemon import DaemonProcess, create_session, fork_params, run_turn, submit

WS = "demo"
SIZE = (150, 42)
SMALL = (110, 30)
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
FONT_BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"


def screen_segments(app: AgentHostApp) -> list[list[Segment]]:
    """The current screen as lines of styled segments (what `export_screenshot` renders)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    render = app.screen._compositor.render_update(  # noqa: SLF001 - as export_screenshot does
        full=True, screen_stack=app._background_screens, simplify=True
    )
    console.print(render)
    return list(Segment.split_lines(console._record_buffer))  # noqa: SLF001


def to_png(lines: list[list[Segment]], path: Path) -> None:
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(FONT, 15)
    bold = ImageFont.truetype(FONT_BOLD, 15)
    cell_w = int(round(font.getlength("M")))
    cell_h = 19
    cols = max(sum(len(s.text) for s in line if not s.control) for line in lines)
    image = Image.new("RGB", (cols * cell_w, len(lines) * cell_h), (12, 12, 12))
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        col = 0
        for segment in line:
            if segment.control:
                continue  # cursor moves: the lines are already split
            style = segment.style
            fg = (220, 220, 220)
            bg = None
            if style is not None:
                if style.color is not None and style.color.triplet is not None:
                    fg = tuple(style.color.triplet)
                if style.bgcolor is not None and style.bgcolor.triplet is not None:
                    bg = tuple(style.bgcolor.triplet)
                if style.reverse:
                    fg, bg = bg or (12, 12, 12), fg
            face = bold if style is not None and style.bold else font
            for char in segment.text:
                x, y = col * cell_w, row * cell_h
                if bg is not None:
                    draw.rectangle([x, y, x + cell_w - 1, y + cell_h - 1], fill=bg)
                if char.strip():
                    draw.text((x, y + 1), char, font=face, fill=fg)
                col += 1
    image.save(path)


def build_fork(daemon: DaemonProcess) -> tuple[str, str]:
    c = daemon.client()
    sid = create_session(c, WS, title="Trip planning")["agentSessionId"]
    for text in ("Plan a weekend in Lisbon", "/tool search_flights LIS", "Book a hotel in Alfama"):
        run_turn(c, sid, text, WS)
    turns = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
    with Engine(c, WS) as engine:
        engine.fork(sid, turns[1]["turnId"])
        engine.wait_for(
            lambda: (r := engine.mutation(sid, turns[1]["turnId"])).ack is AckState.OBSERVED and r,
            60,
        )
        child = engine.mutation(sid, turns[1]["turnId"]).child_session_id
    assert child
    run_turn(c, child, "/history", WS)
    return sid, child


async def capture(daemon: DaemonProcess, child: str, out: Path) -> None:
    engine = Engine.connect(daemon.api, daemon.events, WS)
    app = AgentHostApp(engine, own_engine=True)
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + 30
        while not (app.sessions_loaded and engine.session(child)):
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        app.open_session(child)
        while len(app.turns) < 3:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        await pilot.pause(0.5)
        app.save_screenshot("gui-fork.svg", str(out))
        to_png(screen_segments(app), out / "gui-fork.png")


async def _open(app: AgentHostApp, pilot: Any, sid: str, turns: int) -> None:
    deadline = time.monotonic() + 30
    while not (app.sessions_loaded and app.engine.session(sid)):
        assert time.monotonic() < deadline
        await pilot.pause(0.05)
    app.open_session(sid)
    while len(app.turns) < turns:
        assert time.monotonic() < deadline
        await pilot.pause(0.05)


async def _until(pilot: Any, pred: Any) -> None:
    deadline = time.monotonic() + 30
    while not pred():
        assert time.monotonic() < deadline
        await pilot.pause(0.05)


async def capture_approval(daemon: DaemonProcess, out: Path) -> None:
    """The GUI answering an approval: the bar with Approve / Decline, Approve focused."""
    c = daemon.client()
    sid = create_session(c, WS, title="Deploy the site")["agentSessionId"]
    run_turn(c, sid, "Build the site", WS)
    submit(c, sid, "/approve rsync -av public/ web:/srv/site", WS)
    engine = Engine.connect(daemon.api, daemon.events, WS)
    app = AgentHostApp(engine, own_engine=True)
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await _open(app, pilot, sid, 2)
        await _until(pilot, lambda: app.query("#approve"))
        app.query_one("#approve").focus()
        await pilot.hover("#approve")
        await pilot.pause(1.0)
        app.save_screenshot("gui-approval.svg", str(out))
        to_png(screen_segments(app), out / "gui-approval.png")


async def capture_refused_fork(daemon: DaemonProcess, out: Path) -> None:
    """A refused fork: a turn is running, so Fork is disabled with the reason as its tooltip,
    and a refusal from the daemon reads as a sentence."""
    from client.gui.transcript import ForkRequested, turn_widget_id
    from tests.client.test_client_gui import FORK_FROM_RIGHT, fork_button

    c = daemon.client()
    sid = create_session(c, WS, title="Trip planning")["agentSessionId"]
    for text in ("Plan a weekend in Lisbon", "Book a hotel in Alfama"):
        run_turn(c, sid, text, WS)
    turns = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
    engine = Engine.connect(daemon.api, daemon.events, WS)
    app = AgentHostApp(engine, own_engine=True)
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await _open(app, pilot, sid, 2)
        submit(c, sid, "/slow 60000 Find a restaurant", WS)
        await _until(pilot, lambda: len(app.turns) == 3)
        turn_id = turns[1]["turnId"]
        await _until(pilot, lambda: (fork := fork_button(app, turn_id)) and fork.disabled)
        app.post_message(ForkRequested(sid, turns[1]["turnId"]))
        await _until(
            pilot, lambda: any("cannot fork" in str(n.message) for n in app._notifications)
        )  # noqa: SLF001
        # Its Fork label, where the Turn draws it (a settled Turn is one widget).
        view = app.query_one(f"#{turn_widget_id(turn_id)}")
        await pilot.hover(view, offset=(view.region.width - FORK_FROM_RIGHT, 0))
        await pilot.pause(1.5)
        app.save_screenshot("gui-fork-refused.svg", str(out))
        to_png(screen_segments(app), out / "gui-fork-refused.png")
        sessions = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        c.call(
            "turn.interrupt",
            {"workspaceId": WS, "agentSessionId": sid, "turnId": sessions["activeTurnId"]},
        )


async def capture_resolve(daemon: DaemonProcess, out: Path) -> None:
    """A fork through Turn 2 left `unknown` (the worker failed right after the
    provider made the child), marked on Turn 2; Inspect shows the verdict and the child with
    Adopt / Abandon. The session list shows fork ordinals and a deleted ancestor's mark, and
    the title bar the Session-level Fork."""
    from client.gui.resolve import ResolveScreen
    from client.gui.transcript import inspect_button_id, unknown_row_id

    c = daemon.client()
    sid = create_session(c, WS, title="Release notes")["agentSessionId"]
    for text in ("Draft the 2.0 notes", "/tool grep CHANGELOG", "Shorten the intro"):
        run_turn(c, sid, text, WS)
    turns = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
    # Lineage for the list: two forks of the source, a fork of a fork whose source is deleted.
    first = _fork_now(c, sid, turns[0]["turnId"])
    _fork_now(c, sid, turns[2]["turnId"])
    first_turns = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": first})
    grandchild = _fork_now(c, first, first_turns["turns"][-1]["turnId"])
    c.call(
        "session.updateTitle",
        {"workspaceId": WS, "agentSessionId": grandchild, "title": "Release notes (short)"},
    )
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": first})
    boundary = turns[1]["turnId"]
    engine = Engine.connect(daemon.api, daemon.events, WS)
    app = AgentHostApp(engine, own_engine=True)
    async with app.run_test(size=SIZE) as pilot:
        await _open(app, pilot, sid, 3)
        c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
        app.post_message(ForkRequestedMsg(sid, boundary))
        await _until(pilot, lambda: app.query(f"#{unknown_row_id(boundary)}"))
        c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
        await _until(pilot, lambda: len(app.marks) >= 2)
        await pilot.pause(6.0)  # let the "unknown" toast time out: the mark says it
        app.save_screenshot("gui-unknown-fork.svg", str(out))
        to_png(screen_segments(app), out / "gui-unknown-fork.png")
        await pilot.click(f"#{inspect_button_id(boundary)}")
        await _until(pilot, lambda: isinstance(app.screen, ResolveScreen))
        await _until(
            pilot, lambda: "Verdict" in str(app.screen.query_one("#resolve-verdict").render())
        )
        await pilot.hover("#resolve-adopt")
        await pilot.pause(1.0)
        app.save_screenshot("gui-resolve.svg", str(out))
        to_png(screen_segments(app), out / "gui-resolve.png")


def _fork_now(c: Any, sid: str, turn_id: str) -> str:
    op = c.call(
        "fork.create",
        fork_params(WS, sid, turn_id),
    )["operation"]
    while op["status"] == "accepted":
        time.sleep(0.05)
        op = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})["operation"]
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    return str(op["targetAgentSessionId"])


async def capture_sizes(daemon: DaemonProcess, child: str, out: Path) -> None:
    """The fork child at 80x24 and 200x50 (keyboard focus in the message box), and at 80x24
    the keys screen (F1) and the Fork picker's confirmation that names the Turn (F5)."""
    for size in ((80, 24), (200, 50)):
        await _capture_size(daemon, child, out, size)


async def _capture_size(
    daemon: DaemonProcess, child: str, out: Path, size: tuple[int, int]
) -> None:
    from client.gui.controls import ForkScreen
    from client.gui.keyboard import HelpScreen, TurnPickerScreen

    name = f"gui-{size[0]}x{size[1]}"
    engine = Engine.connect(daemon.api, daemon.events, WS)
    app = AgentHostApp(engine, own_engine=True)
    async with app.run_test(size=size) as pilot:
        await _open(app, pilot, child, 3)
        await _until(pilot, lambda: len(app.query("TurnView, SettledTurnView")) == 3)
        app.focus_composer()
        await pilot.pause(0.8)
        app.save_screenshot(f"{name}.svg", str(out))
        to_png(screen_segments(app), out / f"{name}.png")
        if size != (80, 24):
            return
        await pilot.press("f1")
        await _until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause(0.5)
        app.save_screenshot(f"{name}-keys.svg", str(out))
        to_png(screen_segments(app), out / f"{name}-keys.png")
        await pilot.press("escape", "f5")
        await _until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(app.screen, ForkScreen))
        await pilot.pause(0.5)
        app.save_screenshot(f"{name}-fork-confirm.svg", str(out))
        to_png(screen_segments(app), out / f"{name}-fork-confirm.png")
        await pilot.press("escape")


SHOTS = ("fork", "approval", "fork-refused", "resolve", "sizes")


def main(argv: list[str]) -> int:
    """`make_screenshot [OUT_DIR] [SHOT…]`: SHOT is one of SHOTS (default: all)."""
    out = Path(argv[0] if argv else "docs/images").resolve()
    wanted = set(argv[1:]) or set(SHOTS)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ah-shot-") as tmp:
        daemon = DaemonProcess(Path(tmp) / "home").start()
        try:
            if wanted & {"fork", "sizes"}:
                _, child = build_fork(daemon)
                if "fork" in wanted:
                    asyncio.run(capture(daemon, child, out))
                if "sizes" in wanted:
                    asyncio.run(capture_sizes(daemon, child, out))
            if "approval" in wanted:
                asyncio.run(capture_approval(daemon, out))
            if "fork-refused" in wanted:
                asyncio.run(capture_refused_fork(daemon, out))
            if "resolve" in wanted:
                asyncio.run(capture_resolve(daemon, out))
        finally:
            daemon.stop()
    print(f"wrote {', '.join(sorted(wanted))} (.svg, .png) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
