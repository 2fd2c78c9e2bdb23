"""The GUI's everyday controls, headless through Textual's pilot against a real
daemon: answering an approval or a question (buttons and keys), Interrupt, New session,
Rename, Delete, the command palette, Fork disabled with its reason while the source is busy,
toasts in words, failed/interrupted turns with their reason, and an 80x24 terminal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Input, Select

from client.engine.lifecycle import Engine
from client.gui.app import AgentHostApp
from client.gui.controls import (
    ANSWER_INPUT_ID,
    APPROVE_ID,
    DECLINE_ID,
    ConfirmScreen,
    InteractionBar,
    NewSessionScreen,
    RenameScreen,
)
from client.gui.transcript import ForkRequested
from tests.client.conftest import source
from tests.client.test_client_gui import (
    body_text,
    click,
    fork_button,
    open_and_wait,
    turn_ids,
    turn_views,
    until,
)
from tests.support.daemon import DaemonProcess, create_session, submit
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


def run_app(
    daemon: DaemonProcess,
    ws: str,
    scenario: Callable[[AgentHostApp, Pilot[Any]], Awaitable[None]],
    size: tuple[int, int] = (120, 40),
) -> None:
    async def main() -> None:
        engine = Engine.connect(daemon.api, daemon.events, ws)
        app = AgentHostApp(engine, own_engine=True)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.sessions_loaded)
            await scenario(app, pilot)

    asyncio.run(main())


def toasts(app: AgentHostApp) -> list[str]:
    return [str(n.message) for n in app._notifications]  # noqa: SLF001


def turn_text(app: AgentHostApp) -> str:
    return "\n".join(body_text(view) for view in turn_views(app))


def last(client: Client, ws: str, sid: str) -> dict[str, Any]:
    turns = client.call("session.timeline", {"workspaceId": ws, "agentSessionId": sid})["turns"]
    return dict(turns[-1])


async def settled(pilot: Pilot[Any], client: Client, ws: str, sid: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        turn = last(client, ws, sid)
        return turn if turn["phase"] == "settled" else None

    return dict(await until(pilot, done))


def test_approval_buttons_and_keys(daemon: DaemonProcess, client: Client, ws: str) -> None:
    sid = create_session(client, ws, title="Approvals")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        submit(client, sid, "/approve rm -rf build", ws)
        await until(pilot, lambda: app.query(f"#{APPROVE_ID}"))
        bar = app.query_one(InteractionBar)
        assert "approval: rm -rf build" in str(bar.query_one(".ask").render())
        await click(app, pilot, f"#{APPROVE_ID}")
        assert (await settled(pilot, client, ws, sid))["messages"][-1]["text"] == (
            "approved: rm -rf build"
        )
        await until(pilot, lambda: not app.query(f"#{APPROVE_ID}"))
        await until(pilot, lambda: "approval: rm -rf build  → approved" in turn_text(app))
        # Decline by button, then approve and decline by key.
        submit(client, sid, "/approve deploy", ws)
        await until(pilot, lambda: app.query(f"#{DECLINE_ID}"))
        await click(app, pilot, f"#{DECLINE_ID}")
        assert (await settled(pilot, client, ws, sid))["messages"][-1]["text"] == "declined: deploy"
        for key, verdict in (("ctrl+y", "approved"), ("ctrl+o", "declined")):
            submit(client, sid, f"/approve {key}", ws)
            await until(pilot, lambda: app.query(f"#{APPROVE_ID}"))
            await pilot.press(key)
            turn = await settled(pilot, client, ws, sid)
            assert turn["messages"][-1]["text"] == f"{verdict}: {key}"

    run_app(daemon, ws, scenario)


def test_question_field_send_button_and_key(daemon: DaemonProcess, client: Client, ws: str) -> None:
    sid = create_session(client, ws, title="Questions")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        submit(client, sid, "/ask which colour?", ws)
        await until(pilot, lambda: app.query(f"#{ANSWER_INPUT_ID}"))
        await click(app, pilot, f"#{ANSWER_INPUT_ID}")
        await pilot.press(*"teal")
        await click(app, pilot, "#answer-send")
        assert (await settled(pilot, client, ws, sid))["messages"][-1]["text"] == "teal"
        # By key: ctrl+t focuses the answer field, Enter sends.
        submit(client, sid, "/ask and now?", ws)
        # The bar of the second question (the first one's field may still be on screen until
        # its answer's event arrives, and is then replaced, taking focus with it).
        await until(
            pilot,
            lambda: (
                app.query(f"#{ANSWER_INPUT_ID}")
                and any("and now?" in str(ask.render()) for ask in app.query(".ask"))
            ),
        )
        app.query_one("#composer").focus()
        await pilot.press("ctrl+t")
        assert isinstance(app.focused, Input) and app.focused.id == ANSWER_INPUT_ID
        await pilot.press(*"red", "enter")
        assert (await settled(pilot, client, ws, sid))["messages"][-1]["text"] == "red"

    run_app(daemon, ws, scenario)


def test_interrupt_button_and_key_show_the_reason(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid = create_session(client, ws, title="Slow")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 0)
        submit(client, sid, "/slow 30000 never", ws)
        await until(pilot, lambda: app.query_one("#interrupt").has_class("-shown"))
        await click(app, pilot, "#interrupt")
        assert (await settled(pilot, client, ws, sid))["outcome"] == "interrupted"
        await until(pilot, lambda: "interrupted" in turn_text(app))
        await until(pilot, lambda: not app.query_one("#interrupt").has_class("-shown"))
        submit(client, sid, "/slow 30000 again", ws)
        await until(pilot, lambda: app.query_one("#interrupt").has_class("-shown"))
        await pilot.press("ctrl+g")
        assert (await settled(pilot, client, ws, sid))["outcome"] == "interrupted"
        # A failed turn shows why.
        submit(client, sid, "/fail the model broke", ws)
        await settled(pilot, client, ws, sid)
        await until(pilot, lambda: "failed: the model broke" in turn_text(app))

    run_app(daemon, ws, scenario)


def test_fork_is_disabled_with_the_reason_while_the_source_is_busy_and_refusals_are_words(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=2, title="Busy")

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 2)
        active = submit(client, sid, "/slow 30000 later", ws)["turnId"]
        await until(pilot, lambda: active in turn_ids(app))

        def blocked() -> bool:
            button = fork_button(app, turns[0])
            return button is not None and button.disabled

        await until(pilot, blocked)
        button = fork_button(app, turns[1])
        assert button is not None and button.disabled
        assert str(button.tooltip) == (
            "Cannot fork now: Turn 3 is still running (source_turn_active)"
        )
        # Said in the title bar too (a keyboard user never sees a tooltip).
        title = str(app.query_one("#session-title").render())
        assert "not now: Turn 3 is still running (source_turn_active)" in title
        # A refusal from the daemon (a click that raced the busy state) reads in words.
        app.post_message(ForkRequested(sid, turns[1]))
        await until(
            pilot,
            lambda: any(
                t.startswith("cannot fork through Turn 2: ") and "(source_turn_active)" in t
                for t in toasts(app)
            ),
        )
        assert not any("409" in t or "conflict/" in t for t in toasts(app))
        # Sending while a turn runs: the toast says so in words.
        await click(app, pilot, "#composer")
        await pilot.press(*"hi", "enter")
        await until(
            pilot,
            lambda: any("cannot send: a turn is already running" in t for t in toasts(app)),
        )
        await pilot.press("ctrl+g")
        await settled(pilot, client, ws, sid)
        await until(pilot, lambda: not (fork_button(app, turns[0]) or Button()).disabled)

    run_app(daemon, ws, scenario)


def test_new_rename_delete_and_the_command_palette(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert titles >= {
            "New session",
            "Interrupt",
            "Approve",
            "Decline",
            "Answer",
            "Rename session",
            "Delete session",
        }
        footer_keys = {b.key for b in app.BINDINGS if getattr(b, "show", True)}  # type: ignore[union-attr]
        assert {"ctrl+g", "ctrl+n", "f2", "f8", "ctrl+y", "ctrl+o", "ctrl+t"} <= footer_keys
        await pilot.press("ctrl+n")
        await until(pilot, lambda: isinstance(app.screen, NewSessionScreen))
        picker = app.screen.query_one("#provider", Select)
        assert [str(o[1]) for o in picker._options] == ["tutti-agent", "codex", "claude-code"]  # noqa: SLF001
        assert picker.value == "tutti-agent"
        await pilot.press(*"Fresh", "enter")

        def opened() -> dict[str, Any] | None:
            session = app.engine.session(app.current) if app.current else None
            return session if session and session["title"] == "Fresh" else None

        session = await until(pilot, opened)
        sid = str(session["agentSessionId"])
        assert session["provider"] == "tutti-agent" and session["cwd"]
        await pilot.press("f2")
        await until(pilot, lambda: isinstance(app.screen, RenameScreen))
        app.screen.query_one(Input).value = ""
        await pilot.press(*"Renamed", "enter")
        got = client.call("session.get", {"workspaceId": ws, "agentSessionId": sid})["session"]
        await until(
            pilot,
            lambda: (
                client.call("session.get", {"workspaceId": ws, "agentSessionId": sid})["session"][
                    "title"
                ]
                == "Renamed"
            ),
        )
        assert got["agentSessionId"] == sid
        # Delete asks first: Cancel keeps it, Delete removes it.
        await pilot.press("f8")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#cancel")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert app.current == sid
        await pilot.press("f8")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#confirm")

        def gone() -> bool:
            listed = client.call("session.list", {"workspaceId": ws})["sessions"]
            return sid not in {s["agentSessionId"] for s in listed}

        await until(pilot, gone)
        await until(pilot, lambda: app.current is None and app.engine.session(sid) is None)

    run_app(daemon, ws, scenario)


def test_usable_at_80x24(daemon: DaemonProcess, client: Client, ws: str) -> None:
    sid, _ = source(client, ws, turns=1, title="A rather long session title for a small terminal")

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        submit(client, sid, "/approve ls -la", ws)
        await until(pilot, lambda: app.query(f"#{APPROVE_ID}"))
        await pilot.pause(0.2)
        # The list takes at most 21 of the 80 columns (its titles cut with "…" at its edge).
        assert app.query_one("#sessions").region.width <= 21
        for selector in (f"#{APPROVE_ID}", f"#{DECLINE_ID}", "#composer", "#interrupt"):
            region = app.query_one(selector).region
            assert region.area and region.right <= 80 and region.bottom <= 24, selector
        await click(app, pilot, f"#{APPROVE_ID}")
        assert (await settled(pilot, client, ws, sid))["outcome"] == "completed"

    run_app(daemon, ws, scenario, size=(80, 24))
