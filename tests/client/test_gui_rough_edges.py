"""What a keyboard walk of the GUI at 80x24 found, against a real daemon: a Turn's header keeps
its file count when it is cut; deleting the open fork child opens its source; a daemon that
does not answer says so at once (not after the request's 30 s) and neither the title nor a
Turn's header says what it cannot know (F5 says why nothing forks); toasts stay short and out
of the message box's way."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Button, Static
from textual.widgets._toast import Toast

from client.engine.lifecycle import Engine
from client.gui.app import AgentHostApp
from client.gui.composer import Composer
from client.gui.controls import ConfirmScreen, RenameScreen
from client.gui.session_list import SessionTree
from tests.client.test_client_gui import header_text, open_and_wait, turn_views, until
from tests.client.test_client_gui_keyboard import run_app
from tests.support.daemon import DaemonProcess, create_session, fork_params, run_turn
from tests.support.git_repos import make_repo
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def drawn_header(app: AgentHostApp, index: int) -> str:
    """The Turn's header as drawn on screen (cut at the transcript's width)."""
    view = turn_views(app)[index]
    lines = view.lines() if hasattr(view, "lines") else None
    if lines is not None:
        return str(lines[0].text)
    return header_text(view)


def test_a_cut_turn_header_keeps_its_file_count_at_80_columns(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, ws, title="Files", cwd=str(repo))["agentSessionId"]
    run_turn(client, sid, "/write notes.txt first line", ws)  # a tool call and a file

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        head = drawn_header(app, 0)
        assert "1 file changed" in head, head

    run_app(daemon, ws, (80, 24), scenario)


def _fork_now(client: Client, ws: str, sid: str, turn_id: str) -> str:
    op = client.call("fork.create", fork_params(ws, sid, turn_id))["operation"]
    deadline = time.monotonic() + 60
    while op["status"] == "accepted" and time.monotonic() < deadline:
        time.sleep(0.05)
        op = client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})[
            "operation"
        ]
    client.call("fork.acknowledge", {"workspaceId": ws, "operationId": op["operationId"]})
    return str(op["targetAgentSessionId"])


def test_deleting_the_open_fork_child_opens_its_source(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid = create_session(client, ws, title="Source")["agentSessionId"]
    turn = run_turn(client, sid, "hello", ws)
    create_session(client, ws, title="Another")
    child = _fork_now(client, ws, sid, str(turn["turnId"]))

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, child, 1)
        app.query_one(SessionTree).focus()
        await pilot.press("f8")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: app.engine.session(child) is None, timeout=30)
        await until(pilot, lambda: app.current == sid and len(turn_views(app)) == 1)
        title = str(app.query_one("#session-title", Static).render())
        assert title.startswith("Source"), title
        assert app.query_one(SessionTree).cursor_node.data == sid  # type: ignore[union-attr]

    run_app(daemon, ws, (80, 24), scenario)


def test_a_send_to_a_daemon_that_does_not_answer_says_so_long_before_its_deadline(
    tmp_path: Path,
) -> None:
    ws = "down"
    daemon = DaemonProcess(tmp_path / "home").start()
    try:
        c = daemon.client()
        sid = create_session(c, ws, title="Quiet")["agentSessionId"]
        run_turn(c, sid, "hello there", ws)

        async def main() -> None:
            engine = Engine.connect(daemon.api, daemon.events, ws)
            app = AgentHostApp(engine, own_engine=True)
            async with app.run_test(size=(80, 24)) as pilot:
                await until(pilot, lambda: app.sessions_loaded)
                await open_and_wait(app, pilot, sid, 1)
                title = app.query_one("#session-title", Static)
                assert "can fork" in str(title.render())
                assert "can fork" in drawn_header(app, 0)
                daemon.stop()
                box = app.query_one(Composer)
                box.focus()
                await pilot.press(*"are you there", "enter")
                # Well inside the request's 30 s deadline (the notice comes after ~1 s).
                await until(pilot, lambda: "waiting for the daemon" in str(title.render()))
                assert "can fork" not in str(title.render())
                # Nor does the Turn's own header, and F5 says why nothing forks now.
                await until(pilot, lambda: "can fork" not in drawn_header(app, 0))
                await pilot.press("f5")
                await until(
                    pilot,
                    lambda: any("not answering" in str(n.message) for n in app._notifications),
                )
                toasts = [str(n.message) for n in app._notifications]
                assert any("waiting for the daemon" in t for t in toasts), toasts
                assert not any("cannot send" in t for t in toasts)  # not timed out yet
                assert box.value == "are you there"  # the typed text is kept

        asyncio.run(main())
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()


def overlaps(a: Widget, b: Widget) -> bool:
    return bool(a.region.intersection(b.region).area)


def test_toasts_leave_the_message_box_and_a_dialogs_buttons_in_view_at_80x24(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid = create_session(client, ws, title="Toasted")["agentSessionId"]
    run_turn(client, sid, "hello", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        app.query_one(SessionTree).focus()
        await pilot.press("f7")  # pinned: a toast
        await until(pilot, lambda: len(app.screen.query(Toast)) >= 1)
        await pilot.pause(0.3)
        box = app.query_one(Composer)
        toasts = list(app.screen.query(Toast))
        assert all(not overlaps(t, box) for t in toasts), [t.region for t in toasts]
        await pilot.press("f8")  # a dialog while the toast is up
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await until(pilot, lambda: len(app.screen.query(Toast)) >= 1)
        await pilot.pause(0.3)
        buttons = list(app.screen.query(Button))
        toasts = list(app.screen.query(Toast))
        assert all(not overlaps(t, b) for t in toasts for b in buttons)
        await pilot.press("escape")

    async def main() -> None:
        engine = Engine.connect(daemon.api, daemon.events, ws)
        app = AgentHostApp(engine, own_engine=True)
        # Toasts are drawn only with notifications on (run_app leaves them off).
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await until(pilot, lambda: app.sessions_loaded)
            await scenario(app, pilot)

    asyncio.run(main())


def test_the_open_session_deleted_by_another_client_offers_no_fork_of_its_turns(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid = create_session(client, ws, title="Gone soon")["agentSessionId"]
    run_turn(client, sid, "hello", ws)
    create_session(client, ws, title="Stays")

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        assert "can fork" in drawn_header(app, 0)
        assert turn_views(app)[0].fork_label == "Fork"
        # Another client (the CLI, a script) deletes the session the GUI has open.
        client.call("session.delete", {"workspaceId": ws, "agentSessionId": sid})
        title = app.query_one("#session-title", Static)
        await until(pilot, lambda: "not available" in str(title.render()))
        # Its Turns stay on screen to be read, but none says it can be forked any more.
        await until(pilot, lambda: turn_views(app)[0].fork_label is None)
        assert "can fork" not in drawn_header(app, 0)

    run_app(daemon, ws, (80, 24), scenario)


def test_escape_sequences_in_a_title_or_a_reply_never_reach_the_terminal(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    # A title another client set and the model's reply: an escape sequence in them, drawn as
    # it came, would be obeyed by the terminal the GUI runs in (clear it, write its clipboard).
    from tests.client.make_screenshot import screen_segments

    sid = create_session(client, ws, title="evil\x1b[2J\x1b]52;c;aGk=\x1b\\ title")[
        "agentSessionId"
    ]
    run_turn(client, sid, "colour \x1b[31mred\x9b2J", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        await pilot.pause(0.2)
        drawn = "".join(s.text for line in screen_segments(app) for s in line if not s.control)
        assert "evil" in drawn and "colour" in drawn, drawn
        for raw in ("\x1b", "\x9b"):
            assert raw not in drawn, repr(drawn)

    run_app(daemon, ws, (100, 30), scenario)


def test_bidi_overrides_in_a_title_or_a_reply_are_drawn_in_the_order_stored(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    # A right-to-left override or isolate makes a terminal that reorders text draw what
    # follows it reversed: "report\u202efdp.exe" reads "reportexe.pdf" in the list and the
    # session bar, and a reply can hide what it says. None of them reaches the terminal.
    from tests.client.make_screenshot import screen_segments
    from tests.client.test_client_cli_everyday import BIDI

    sid = create_session(client, ws, title="report\u202efdp.exe " + BIDI)["agentSessionId"]
    run_turn(client, sid, "reply \u2067olleh\u2069 done", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        await pilot.pause(0.2)
        drawn = "".join(s.text for line in screen_segments(app) for s in line if not s.control)
        assert "reportfdp.exe" in drawn and "reply olleh done" in drawn, drawn
        for raw in BIDI:
            assert raw not in drawn, (hex(ord(raw)), drawn)

    run_app(daemon, ws, (100, 30), scenario)


def test_an_empty_rename_says_the_title_is_empty_and_keeps_the_dialog(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    # F2, the title erased, Enter: the session keeps its title, and the person is told why in
    # the words the CLI's `rename S ""` uses, with the dialog still open to type a title.
    sid = create_session(client, ws, title="Kept title")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, RenameScreen))
        await pilot.press("end", "ctrl+u", "space", "enter")  # erased: only a space left
        await until(
            pilot,
            lambda: any("the title is empty" in str(n.message) for n in app._notifications),  # noqa: SLF001
        )
        assert isinstance(app.screen, RenameScreen)
        await pilot.press("ctrl+u", *"Given", "enter")
        await until(pilot, lambda: not isinstance(app.screen, RenameScreen))
        await until(
            pilot,
            lambda: (
                client.call("session.get", {"workspaceId": ws, "agentSessionId": sid})["session"][
                    "title"
                ]
                == "Given"
            ),
        )

    run_app(daemon, ws, (80, 24), scenario)


def test_a_narrow_session_list_gives_its_titles_all_the_room_it_has(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    # At 80 columns the list was a quarter of the screen (20 cells), two of them left empty and
    # the rest shared with the id: a fork child's title kept 10 characters. Now each row is its
    # title cut with "…" at the list's edge, the id gives way before the title does, and the
    # list takes a cell more (the transcript keeps what a Turn's header needs for its files).
    long = "Plan a long weekend in Lisbon with the whole family"
    sid = create_session(client, ws, title=long)["agentSessionId"]
    run_turn(client, sid, "one", ws)
    turns = client.call("session.timeline", {"workspaceId": ws, "agentSessionId": sid})["turns"]
    child = _fork_now(client, ws, sid, turns[0]["turnId"])
    client.call(
        "session.updateTitle",
        {"workspaceId": ws, "agentSessionId": child, "title": "Child of " + long},
    )

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        from tests.client.make_screenshot import screen_segments

        await open_and_wait(app, pilot, sid, 1)
        tree = app.query_one(SessionTree)
        await until(pilot, lambda: len(tree.root.children) == 1 and tree.root.children[0].children)
        await until(pilot, lambda: "#1" in str(tree.root.children[0].children[0].label))
        await pilot.pause(0.2)
        width = tree.scrollable_content_region.width
        rows = [
            "".join(s.text for s in line if not s.control)[:width].rstrip()
            for line in screen_segments(app)[:2]
        ]
        root, fork = rows
        assert width >= 20, width  # the column split at 80 columns
        assert root == long[: width - 1] + "…", rows
        assert fork.endswith("#1 " + ("Child of " + long)[: len(fork) - 7] + "…"), rows
        assert len(root) == len(fork) == width, rows  # no cell left empty
        assert sid[:8] not in root and child[:8] not in fork, rows

    run_app(daemon, ws, (80, 24), scenario)


def test_a_widened_terminal_gives_the_session_lists_titles_the_new_room(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    # The rows were cut once, at the list's width when they were drawn: a terminal widened
    # from 80 to 160 columns kept a 19-character title in a list of 40 cells until the next
    # session event. A resize cuts them again, for the width the list has now.
    long = "Plan a long weekend in Lisbon with the whole family and friends"
    sid = create_session(client, ws, title=long)["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        from tests.client.make_screenshot import screen_segments

        tree = app.query_one(SessionTree)
        await until(pilot, lambda: len(tree.root.children) == 1)

        def row() -> str:
            width = tree.scrollable_content_region.width
            line = screen_segments(app)[0]
            return "".join(s.text for s in line if not s.control)[:width].rstrip()

        assert row() == long[: tree.scrollable_content_region.width - 1] + "…"
        await pilot.resize_terminal(160, 30)
        await until(pilot, lambda: tree.scrollable_content_region.width == 39)
        await pilot.pause(0.2)
        # The id beside it now: 28 cells are left for the title.
        assert row() == long[:28] + "…  " + sid[:8], row()

    run_app(daemon, ws, (80, 24), scenario)
