"""The GUI by keyboard alone, at 80x24 and 200x50, through Textual's pilot against a real
daemon: the Tab order, a Turn's Fork reached by a key and confirmed by name, focus after New
session and answering, a refused send that keeps its text, the transcript following the newest
Turn, every key listed, a one-line session bar, elided titles, and words for people with the
internal names in a details pane."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Static

from client.engine.lifecycle import Engine
from client.gui.app import AgentHostApp
from client.gui.composer import Composer
from client.gui.controls import ForkScreen, NewSessionScreen
from client.gui.keyboard import DetailsScreen, HelpScreen, TurnPickerScreen
from client.gui.session_list import SessionTree
from client.gui.transcript import TranscriptView
from tests.client.test_client_gui import header_text, open_and_wait, turn_views, until
from tests.client.test_client_gui_controls import settled
from tests.support.daemon import DaemonProcess, create_session, run_turn, submit
from transport.client import Client

pytestmark = pytest.mark.timeout(90)

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((200, 50), id="200x50")]


def run_app(
    daemon: DaemonProcess,
    ws: str,
    size: tuple[int, int],
    scenario: Callable[[AgentHostApp, Pilot[Any]], Awaitable[None]],
) -> None:
    async def main() -> None:
        engine = Engine.connect(daemon.api, daemon.events, ws)
        app = AgentHostApp(engine, own_engine=True)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.sessions_loaded)
            await scenario(app, pilot)

    asyncio.run(main())


def composer(app: AgentHostApp) -> Composer:
    return app.screen_stack[0].query_one(Composer)


@pytest.mark.parametrize("size", SIZES)
def test_tab_reaches_the_message_box_and_a_fork_is_confirmed_by_turn(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Keys")["agentSessionId"]
    for text in ("first question", "second question"):
        run_turn(client, sid, text, ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 2)
        app.query_one(SessionTree).focus()
        for _ in range(2):
            if app.focused is composer(app):
                break
            await pilot.press("tab")
        assert app.focused is composer(app)
        # No Fork button takes focus: Enter can never land on one.
        assert all(not b.can_focus for b in app.query(Button) if str(b.id).startswith("fork"))
        # F5: pick the Turn (the newest is highlighted), then a confirmation naming it.
        await pilot.press("f5")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("down", "enter")  # Turn 1
        await until(pilot, lambda: isinstance(app.screen, ForkScreen))
        assert "Turn 1 · “first question”" in app.screen.question
        await pilot.press("enter")  # Cancel has the focus: Enter does not fork
        await until(pilot, lambda: not isinstance(app.screen, ForkScreen))
        turns = app.turns
        assert app.engine.mutation(sid, turns[0]["turnId"]) is None
        await pilot.press("f5")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        await pilot.press("enter")  # the newest, Turn 2
        await until(pilot, lambda: isinstance(app.screen, ForkScreen))
        assert "Turn 2 · “second question”" in app.screen.question
        await pilot.press("s")  # same folder
        await until(pilot, lambda: app.engine.mutation(sid, turns[1]["turnId"]) is not None)
        assert app.engine.mutation(sid, turns[0]["turnId"]) is None
        # New session: focus lands in the message box.
        app.query_one(SessionTree).focus()
        await pilot.press("ctrl+n")
        await until(pilot, lambda: isinstance(app.screen, NewSessionScreen))
        await pilot.press(*"Fresh", "enter")
        await until(pilot, lambda: not isinstance(app.screen, NewSessionScreen))
        await until(
            pilot,
            lambda: app.current != sid and app.focused is composer(app),
        )

    run_app(daemon, ws, size, scenario)


@pytest.mark.parametrize("size", SIZES)
def test_focus_returns_to_the_message_box_after_answering(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Answers")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        submit(client, sid, "/ask which colour?", ws)
        await until(pilot, lambda: app.query("#answer-input"))
        await pilot.press("ctrl+t")
        # Typed once the field has the focus, as a person sees the cursor there first.
        await until(pilot, lambda: getattr(app.focused, "id", None) == "answer-input")
        await pilot.press(*"teal", "enter")
        turn = await settled(pilot, client, ws, sid)
        assert turn["messages"][-1]["text"] == "teal"
        assert turn["interactions"][0]["output"]["by"] == "gui"
        await until(pilot, lambda: app.focused is composer(app))

    run_app(daemon, ws, size, scenario)


@pytest.mark.parametrize("size", SIZES)
def test_a_refused_send_keeps_the_typed_text(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Busy")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        submit(client, sid, "/slow 30000 still going", ws)
        await until(pilot, lambda: len(app.turns) == 1)
        composer(app).focus()
        await pilot.press(*"a long thought", "enter")
        await until(pilot, lambda: any("send" in str(n.message) for n in app._notifications))  # noqa: SLF001
        assert composer(app).value == "a long thought"
        await pilot.press("ctrl+g")  # interrupt, then the same text goes through
        await settled(pilot, client, ws, sid)
        composer(app).focus()
        await pilot.press("enter")
        await until(pilot, lambda: len(app.turns) == 2 and composer(app).value == "")
        await until(pilot, lambda: app.turns[0].get("error") == "by the GUI")

    run_app(daemon, ws, size, scenario)


@pytest.mark.parametrize("size", SIZES)
def test_the_transcript_follows_the_newest_turn_unless_scrolled_up(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Long")["agentSessionId"]
    loaded = 12 if size[1] < 30 else 25
    for i in range(loaded):
        run_turn(client, sid, f"line {i}", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, loaded)
        transcript = app.query_one(TranscriptView)
        await until(pilot, lambda: transcript.max_scroll_y > 0)
        await until(pilot, lambda: transcript.scroll_y >= transcript.max_scroll_y)
        for n in range(2):
            composer(app).focus()
            count = len(app.turns) + 1
            await pilot.press(*f"more {n}", "enter")
            await until(
                pilot,
                lambda count=count: len(app.turns) == count and app.turns[-1]["phase"] == "settled",
            )
            await until(pilot, lambda: transcript.scroll_y >= transcript.max_scroll_y)
        transcript.scroll_home(animate=False)
        await pilot.pause(0.2)
        composer(app).focus()
        count = len(app.turns) + 1
        await pilot.press(*"while reading", "enter")
        await until(pilot, lambda: len(app.turns) == count and app.turns[-1]["phase"] == "settled")
        await pilot.pause(0.3)
        assert transcript.scroll_y == 0  # the user's place is kept

    run_app(daemon, ws, size, scenario)


@pytest.mark.parametrize("size", SIZES)
def test_every_key_is_listed_the_bar_stays_one_line_and_titles_are_elided(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    long_title = "A very long session title that cannot possibly fit in the list " * 2
    sid = create_session(client, ws, title=long_title.strip())["agentSessionId"]
    run_turn(client, sid, "one", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        # F1 is in the footer at any width, and its screen lists every key.
        from textual.widgets._footer import FooterKey

        shown = [k for k in app.query(FooterKey) if k.key == "f1"]
        for _ in range(100):  # the footer is composed after the first refresh: under load, later
            if shown and shown[0].region.width:
                break
            await pilot.pause(0.05)
            shown = [k for k in app.query(FooterKey) if k.key == "f1"]
        assert shown and shown[0].region.right <= app.size[0]  # on screen, not scrolled off
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        listed = "\n".join(app.screen.lines)
        for action, words in AgentHostApp.KEY_HELP.items():
            assert words in listed, action
        # Both keys that open this list are on its line (docs/user-guide.md names both).
        assert any(line.startswith("F1 / ?") for line in app.screen.lines), listed
        assert _fits(app)
        await pilot.press("escape")
        # A blocked fork: the reason goes in the bar, which stays one line.
        submit(client, sid, "/slow 30000 busy", ws)
        await until(pilot, lambda: app.blocked_reason() is not None)
        await pilot.pause(0.2)
        bar = app.query_one("#session-title", Static)
        assert bar.region.height == 1
        assert app.query_one("#session-bar").region.height == 1
        # Titles too wide are elided with "…" (the list, and a dialog that fits the screen).
        label = str(app.query_one(SessionTree).root.children[0].label)
        assert "…" in label and len(label) < len(long_title)
        # The id follows the title where the list has room for both; at 80 columns it gives
        # way to the title.
        assert (sid[:8] in label) is (size[0] >= 200)
        await pilot.press("ctrl+g")
        await settled(pilot, client, ws, sid)
        await pilot.press("f5")
        await until(pilot, lambda: isinstance(app.screen, TurnPickerScreen))
        assert _fits(app)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ForkScreen))
        assert _fits(app)
        await pilot.press("escape")

    run_app(daemon, ws, size, scenario)


def _fits(app: AgentHostApp) -> bool:
    """The top dialog lies wholly inside the screen."""
    box = app.screen.query("Vertical").first().region
    width, height = app.size
    return box.x >= 0 and box.y >= 0 and box.right <= width and box.bottom <= height


@pytest.mark.parametrize("size", SIZES)
def test_turns_read_in_words_and_the_details_pane_keeps_the_names(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Words")["agentSessionId"]
    run_turn(client, sid, "one", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        (view,) = turn_views(app)
        header = header_text(view)
        assert "done · can fork" in header
        assert "settled" not in header and "binding" not in header
        bar = str(app.query_one("#session-title", Static).render())
        assert "can fork" in bar and "fork through turn" not in bar
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen))
        details = app.screen.text
        assert "phase settled, outcome completed, binding bound" in details
        assert "forkThroughTurn=True" in details
        await pilot.press("escape")

    run_app(daemon, ws, size, scenario)


@pytest.mark.parametrize("size", SIZES)
def test_each_turn_shows_what_it_did_at_a_glance(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    sid = create_session(client, ws, title="Glance")["agentSessionId"]
    run_turn(client, sid, "just talk", ws)
    run_turn(client, sid, "/tool search_flights LIS", ws)
    run_turn(client, sid, "/fail the model broke", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 3)
        submit(client, sid, "/approve make deploy", ws)
        await until(pilot, lambda: app.query("#approve"))
        await pilot.press("ctrl+y")
        await settled(pilot, client, ws, sid)

        def headers() -> list[str]:
            return [header_text(view) for view in turn_views(app)]

        # The settled header, not only the approval: its tool call may reach the GUI last.
        await until(pilot, lambda: "1 tool call · approval approved" in headers()[-1])
        talk, tool, failed, approved = headers()
        assert "tool call" not in talk and "approval" not in talk
        assert "1 tool call" in tool
        assert "failed" in failed and "error" in failed
        assert "1 tool call · approval approved" in approved

    run_app(daemon, ws, size, scenario)


@pytest.mark.parametrize("size", SIZES)
def test_a_long_question_leaves_its_answer_field_and_the_transcript_in_view(
    daemon: DaemonProcess, client: Client, ws: str, size: tuple[int, int]
) -> None:
    # A question of a few thousand characters (a plan to agree to, a pasted log): the bar that
    # asks it must not push its own answer field (nor the Turns) off the screen.
    sid = create_session(client, ws, title="Long ask")["agentSessionId"]
    question = " ".join(f"step {i} of the plan;" for i in range(400)) + " which colour?"

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        submit(client, sid, f"/ask {question}", ws)
        await until(pilot, lambda: app.query("#answer-input"))
        await pilot.press("ctrl+t")
        await until(pilot, lambda: getattr(app.focused, "id", None) == "answer-input")
        field = app.query_one("#answer-input")
        assert field.region.bottom <= size[1] and field.region.height > 0, field.region
        transcript = app.query_one(TranscriptView)
        assert transcript.region.height >= 3, transcript.region
        await pilot.press(*"teal", "enter")
        turn = await settled(pilot, client, ws, sid)
        assert turn["messages"][-1]["text"] == "teal"

    run_app(daemon, ws, size, scenario)
