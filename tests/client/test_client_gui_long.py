"""A long transcript in the GUI, headless through Textual's pilot against a real daemon: only
the Turns near the viewport are mounted, the rest are counted in lines exactly (the scroll
range never changes while the user scrolls through it, and a jump lands where it aimed), and
the newest Turn is followed as it arrives."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from textual.pilot import Pilot

from client.gui.app import AgentHostApp
from client.gui.transcript import SettledTurnView, TranscriptView, TurnView
from tests.client.test_client_gui import turn_views, until
from tests.client.test_client_gui_keyboard import SIZES, composer, run_app
from tests.models.test_models_gui import transcript_words
from tests.support.daemon import DaemonProcess, create_session, run_turn
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

TURNS = 60


def top_turn(app: AgentHostApp) -> int:
    """The sequence of the first Turn whose header is on screen."""
    transcript = app.query_one(TranscriptView)
    shown = [
        v for v in turn_views(app) if transcript.region.y <= v.region.y < transcript.region.bottom
    ]
    return min(int(v.turn["sequence"]) for v in shown)


@pytest.mark.parametrize("size", SIZES)
def test_a_long_transcript_mounts_only_what_is_near_the_viewport(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Long")["agentSessionId"]
    for i in range(TURNS):
        run_turn(client, sid, f"/tool step_{i} arg" if i % 10 == 0 else f"line {i}", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.engine.session(sid) is not None)
        app.open_session(sid)
        transcript = app.query_one(TranscriptView)
        await until(pilot, lambda: transcript.turn_count == TURNS)
        # Opened at the newest Turn, with a screenful or so of Turns mounted, not all of them.
        await until(pilot, lambda: f"echo: line {TURNS - 1}" in transcript_words(app))
        assert len(turn_views(app)) < TURNS // 3
        # Each settled Turn is one widget (drawn with the line API), not a widget tree.
        assert all(isinstance(v, SettledTurnView) and not v.children for v in turn_views(app))
        total = transcript.max_scroll_y
        assert total > 0
        # A jump to each tenth and back: it lands where it aimed, shows the Turns there, and
        # the scroll range stays the same (the unmounted Turns are counted exactly).
        seen: dict[int, int] = {}
        for step in [*range(11), *range(10, -1, -1)]:
            y = round(total * step / 10)
            transcript.scroll_to(y=y, animate=False)
            await until(pilot, lambda y=y: round(transcript.scroll_y) == y)
            await pilot.pause(0.1)
            await until(pilot, lambda: transcript.idle)
            assert round(transcript.scroll_y) == y
            assert transcript.max_scroll_y == total
            assert len(turn_views(app)) < TURNS // 3
            first = top_turn(app)
            assert seen.setdefault(step, first) == first  # the same Turn at the same place
            assert f"Turn {first} " in transcript_words(app)
        assert seen[0] == 1 and seen[10] > TURNS * 0.8
        assert sorted(seen.values()) == [seen[s] for s in range(11)]
        # Back at the end, a new Turn is followed as it arrives.
        transcript.scroll_end(animate=False)
        await pilot.pause(0.2)
        composer(app).focus()
        await pilot.press(*"one more", "enter")
        await until(pilot, lambda: transcript.turn_count == TURNS + 1)
        await until(pilot, lambda: "echo: one more" in transcript_words(app))
        assert len(turn_views(app)) < TURNS // 3

    run_app(daemon, ws, size, scenario)


@pytest.fixture(scope="module")
def long_session(daemon: DaemonProcess) -> tuple[str, str]:
    """`(workspace, Session)`: a Session of `TURNS` Turns in a workspace of its own, for the
    tests that only read it (no Turn added, nothing written): each size's run opens it."""
    ws = f"ws-{uuid.uuid4().hex[:10]}"
    client = Client(daemon.api, timeout=30)
    try:
        sid = create_session(client, ws, title="Long")["agentSessionId"]
        for i in range(TURNS):
            run_turn(client, sid, f"line {i}", ws)
    finally:
        client.close()
    return ws, sid


@pytest.mark.parametrize("size", SIZES)
def test_a_jump_mounts_the_turns_on_screen_first_and_their_margins_after(
    daemon: DaemonProcess, long_session: tuple[str, str], size: tuple[int, int]
) -> None:
    ws, sid = long_session

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.engine.session(sid) is not None)
        app.open_session(sid)
        transcript = app.query_one(TranscriptView)
        await until(pilot, lambda: transcript.turn_count == TURNS)
        await until(pilot, lambda: f"echo: line {TURNS - 1}" in transcript_words(app))
        # What each placement of rows mounted, read as it is laid out (the Turn widgets whose
        # lines are outside the viewport, and how many Turns in all).
        placed: list[tuple[int, int]] = []
        place = transcript._place  # noqa: SLF001 - observed, not replaced

        async def observed(*args: Any, **kwargs: Any) -> None:
            await place(*args, **kwargs)
            top, bottom = (
                round(transcript.scroll_y),
                round(transcript.scroll_y) + (transcript.scrollable_content_region.height),
            )
            y, off_screen = transcript._gaps[0], 0  # noqa: SLF001
            for widget in transcript.children:
                if isinstance(widget, TurnView | SettledTurnView):
                    lines = transcript._height(  # noqa: SLF001
                        next(r for r in transcript._rows if r.key == widget.id),  # noqa: SLF001
                        transcript._row_width(),  # noqa: SLF001
                        None,
                    )
                    off_screen += y + lines <= top or y >= bottom
                    y += lines
                elif widget.id not in {"transcript-above", "transcript-below"}:
                    y += widget.outer_size.height + widget.styles.margin.bottom
            placed.append((off_screen, len(turn_views(app))))

        transcript._place = observed  # type: ignore[method-assign]  # noqa: SLF001
        # A jump from the end to the first Turns: nothing there is mounted.
        transcript.scroll_to(y=0, animate=False)
        await until(pilot, lambda: round(transcript.scroll_y) == 0)
        await pilot.pause(0.1)
        await until(pilot, lambda: transcript.idle)
        assert len(placed) >= 2, placed
        # The jump's own placement mounts only the Turns on screen; the next frame's adds the
        # margin Turns below them, so a wheel step still lands on mounted rows.
        assert placed[0][0] == 0, placed
        assert placed[-1][1] > placed[0][1], placed
        assert "echo: line 0" in transcript_words(app)

    run_app(daemon, ws, size, scenario)
