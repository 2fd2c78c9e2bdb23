"""The Textual GUI, headless through `App.run_test()`'s pilot, against a real daemon: Fork shown
and hidden by capability and binding, pending disables only its Turn, the child opens on
success, the divider sits right after the boundary Turn, the composer sends a turn."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Static

from client.engine.lifecycle import Engine
from client.gui.app import AgentHostApp
from client.gui.session_list import SessionTree
from client.gui.transcript import (
    DIVIDER_ID,
    LOAD_MORE_ID,
    SettledTurnView,
    TranscriptView,
    TurnView,
    fork_button_id,
    turn_widget_id,
)
from tests.client.conftest import source
from tests.support.daemon import (
    DaemonProcess,
    create_session,
    fork_params,
    run_turn,
    submit,
    wait_for,
)
from tests.support.git_repos import make_repo, turn_changing
from transport.client import Client

pytestmark = pytest.mark.timeout(90)

SIZE = (140, 48)


async def until(pilot: Pilot[Any], pred: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Wait for `pred` on a stable transcript (not in the middle of reconciling its widgets)."""
    deadline = time.monotonic() + timeout
    transcript = pilot.app.query_one(TranscriptView)
    while True:
        value = transcript.idle and pred()
        if value:
            return value
        if time.monotonic() > deadline:
            # Which of the two held it back: a transcript never idle and a condition never met
            # read alike otherwise (a CI failure after Abandon could not tell them apart).
            raise AssertionError(
                f"GUI condition not met in time (transcript idle: {transcript.idle},"
                f" busy {transcript._busy}, rewindow queued {transcript._rewindow_queued},"  # noqa: SLF001
                f" margins pending {transcript._margins_pending},"  # noqa: SLF001
                f" follows pending {transcript._follow_pending}; condition: {pred()!r})"  # noqa: SLF001
            )
        await pilot.pause(0.05)


def run_app(
    daemon: DaemonProcess,
    ws: str,
    scenario: Callable[[AgentHostApp, Pilot[Any]], Awaitable[None]],
    **kwargs: Any,
) -> None:
    async def main() -> None:
        engine = Engine.connect(daemon.api, daemon.events, ws)
        app = AgentHostApp(engine, own_engine=True, **kwargs)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.sessions_loaded)
            await scenario(app, pilot)

    asyncio.run(main())


async def click(app: AgentHostApp, pilot: Pilot[Any], selector: str) -> None:
    """Click once the widget is laid out where it is drawn (a fresh mount is not, for a frame)
    and ready to take a click. A settled Turn's Fork (`#fork-<turn>`) is the label its
    `SettledTurnView` draws: clicked where it is drawn."""
    label = selector.startswith("#fork-") and not app.query(selector)
    if label:
        view = app.query_one(f"#{turn_widget_id(selector.removeprefix('#fork-'))}")
        assert isinstance(view, SettledTurnView) and view.fork_label is not None
        selector = f"#{view.id}"

    def offset() -> tuple[int, int]:
        # The label's middle, from the region the widget has once laid out (not before).
        return (app.query_one(selector).region.width - FORK_FROM_RIGHT, 0) if label else (0, 0)

    def placed() -> bool:
        widget = app.query_one(selector)
        region = widget.region
        x, y = offset()
        # A Button ignores clicks during its 0.2 s "-active" effect after a press.
        return (
            bool(region.area)
            and app.screen.get_widget_at(region.x + x, region.y + y)[0] is widget
            and not widget.has_class("-active")
        )

    await until(pilot, placed)
    assert await pilot.click(selector, offset=offset())


FORK_FROM_RIGHT = 8
"""Columns from a `SettledTurnView`'s right edge to the middle of its Fork label (its right
padding 1, the label's margin 1, half the 12-cell label)."""


def turn_views(app: AgentHostApp) -> list[TurnView | SettledTurnView]:
    """The mounted Turns, in order: a `TurnView` (live, or marked `unknown`) or a settled
    Turn's `SettledTurnView`."""
    return [
        w
        for w in app.query("TurnView, SettledTurnView")
        if isinstance(w, TurnView | SettledTurnView)
    ]


def turn_ids(app: AgentHostApp) -> list[str]:
    return [str(v.turn["turnId"]) for v in turn_views(app)]


@dataclass(frozen=True)
class ForkLabel:
    """A `SettledTurnView`'s Fork label, read as its Button would be."""

    label: str
    disabled: bool
    tooltip: str


def fork_button(app: AgentHostApp, turn_id: str) -> Button | ForkLabel | None:
    """The Turn's Fork control (a `TurnView`'s Button, a `SettledTurnView`'s label), or None
    when it has no Fork action."""
    found = app.query(f"#{fork_button_id(turn_id)}")
    if found:
        return found.first(Button)
    views = app.query(f"#{turn_widget_id(turn_id)}")
    view = views.first() if views else None
    if isinstance(view, SettledTurnView) and view.fork_label is not None:
        return ForkLabel(view.fork_label, view.fork_disabled, view.fork_tooltip)
    return None


WIDE = 1000
"""A width no header or message line reaches: a `SettledTurnView` drawn at it says its whole
text, unwrapped and not elided, as a `Static`'s `render()` does (and whether it is laid out
yet or not)."""


def header_text(view: TurnView | SettledTurnView) -> str:
    """The Turn's header line as drawn (without a `SettledTurnView`'s Fork label)."""
    if isinstance(view, SettledTurnView):
        line = view.lines(WIDE)[0].text
        return line[: len(line) - 14].rstrip() if view.fork_label is not None else line.rstrip()
    return str(view.query_one(".turn-header", Static).render())


def body_text(view: TurnView | SettledTurnView) -> str:
    """The Turn's body as drawn (messages, interactions, error, files), a line per line."""
    if isinstance(view, SettledTurnView):
        return "\n".join(strip.text.rstrip() for strip in view.lines(WIDE)[1:])
    return str(view.query_one(".turn-body", Static).render())


def transcript_order(app: AgentHostApp) -> list[str]:
    return [str(w.id) for w in app.query_one(TranscriptView).children]


async def open_and_wait(app: AgentHostApp, pilot: Pilot[Any], sid: str, turns: int) -> None:
    await until(pilot, lambda: app.engine.session(sid) is not None)
    app.open_session(sid)
    await until(pilot, lambda: len(turn_ids(app)) == turns)


def test_fork_is_shown_on_settled_bound_turns_and_hidden_on_an_active_one(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=2)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 2)
        for turn in turns:
            button = fork_button(app, turn)
            assert button is not None and not button.disabled
        active = submit(client, sid, "/slow 2500 later", ws)["turnId"]
        # The live event brings the active Turn in: no Fork on it (not settled, not bound).
        await until(pilot, lambda: active in turn_ids(app))
        assert fork_button(app, active) is None
        assert all(fork_button(app, t) is not None for t in turns)
        # Once it settles (bound), the same live update gives it its Fork action.
        await until(pilot, lambda: fork_button(app, active) is not None)

    run_app(daemon, ws, scenario)


OLD_TUTTI = """\
import sys
import tutti_agent
tutti_agent.__version__ = "0.0.9"  # below the forkThroughTurn gate (0.0.10)
from tutti_agent.cli import main
sys.exit(main())
"""


def test_fork_is_hidden_when_the_session_lacks_the_capability(
    tmp_path_factory: pytest.TempPathFactory, ws: str
) -> None:
    home = tmp_path_factory.mktemp("old") / "home"
    home.mkdir(parents=True)
    script = home / "old_tutti.py"
    script.write_text(OLD_TUTTI)
    (home / "agenthost.toml").write_text(
        f'[providers.tutti-agent]\ncommand = "{sys.executable} {script}"\n'
    )
    daemon = DaemonProcess(home).start()
    try:
        c = daemon.client()
        sid = create_session(c, ws, title="Old agent")["agentSessionId"]
        turn = run_turn(c, sid, "hello", ws)
        assert turn["phase"] == "settled" and turn["providerForkBindingState"] == "bound"
        session = c.call("session.get", {"workspaceId": ws, "agentSessionId": sid})["session"]
        assert session["lifecycleCapabilities"]["forkThroughTurn"] is False

        async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
            await open_and_wait(app, pilot, sid, 1)
            await pilot.pause(0.2)
            assert fork_button(app, turn["turnId"]) is None
            # No Fork action anywhere: no button, no label.
            assert not app.query("Button.fork")
            assert all(fork_button(app, t) is None for t in turn_ids(app))

        run_app(daemon, ws, scenario)
    finally:
        daemon.stop()


def test_pending_fork_disables_only_its_turn_and_success_opens_the_child(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=2, title="Lisbon")
    client.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:2500"}})

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 2)
        await click(app, pilot, f"#{fork_button_id(turns[0])}")
        await until(pilot, lambda: fork_button(app, turns[0]).disabled)
        assert str(fork_button(app, turns[0]).label) == "Forking…"
        assert not fork_button(app, turns[1]).disabled  # other Turns stay usable
        # A second click on the disabled button sends nothing.
        await click(app, pilot, f"#{fork_button_id(turns[0])}")
        record = app.engine.mutation(sid, turns[0])
        assert record is not None and record.create_attempts == 1
        # Success opens the authoritative child.
        child = await until(
            pilot,
            lambda: app.current != sid and app.current,
            30,
        )
        assert child == app.engine.mutation(sid, turns[0]).child_session_id
        await until(pilot, lambda: len(turn_ids(app)) == 1)
        assert app.query_one(SessionTree).depth_of(child) == 1  # listed under its source
        assert transcript_order(app)[-1] == DIVIDER_ID
        assert "continued from Lisbon" in str(app.query_one(f"#{DIVIDER_ID}").render())

    run_app(daemon, ws, scenario)


def test_divider_sits_after_the_boundary_turn_and_hides_until_it_is_loaded(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=3, title="Source")
    op = client.call(
        "fork.create",
        {
            "workspaceId": ws,
            "agentSessionId": sid,
            "requestId": "gui-divider",
            "targetAgentSessionId": "22222222-3333-4444-8555-666666666666",
            "point": {"type": "throughTurn", "turnId": turns[1]},
        },
    )["operation"]
    op = wait_for(
        lambda: (
            (
                o := client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})[
                    "operation"
                ]
            )["status"]
            == "committed"
            and o
        )
    )
    child = op["targetAgentSessionId"]
    boundary = op["lineage"]["targetTurnId"]
    run_turn(client, child, "after the fork", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.engine.session(child) is not None)
        app.open_session(child)
        # One Turn per page: the boundary (the 2nd) is not loaded, so no divider anywhere.
        await until(pilot, lambda: len(turn_ids(app)) == 1)
        assert DIVIDER_ID not in transcript_order(app)
        assert LOAD_MORE_ID in transcript_order(app)
        await click(app, pilot, f"#{LOAD_MORE_ID}")
        await until(pilot, lambda: len(turn_ids(app)) == 2)
        order = transcript_order(app)
        assert order[order.index(f"turn-{boundary}") + 1] == DIVIDER_ID
        await click(app, pilot, f"#{LOAD_MORE_ID}")
        await until(pilot, lambda: len(turn_ids(app)) == 3)
        order = transcript_order(app)
        # Still right after the boundary Turn, not at the end of the timeline.
        assert order[order.index(f"turn-{boundary}") + 1] == DIVIDER_ID
        assert order[-1] != DIVIDER_ID
        assert "continued from Source" in str(app.query_one(f"#{DIVIDER_ID}").render())

    run_app(daemon, ws, scenario, page_size=1)


def test_composer_sends_a_turn_and_the_transcript_follows_it_live(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid = create_session(client, ws, title="Chat")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.engine.session(sid) is not None)
        app.open_session(sid)
        await click(app, pilot, "#composer")
        await pilot.press(*"hi there", "enter")
        await until(pilot, lambda: len(turn_ids(app)) == 1)
        view = turn_views(app)[0]
        await until(pilot, lambda: app.turns and app.turns[0]["phase"] == "settled")
        texts = [m["text"] for m in app.turns[0]["messages"]]
        assert texts == ["hi there", "echo: hi there"]
        assert view.turn["turnId"] == app.turns[0]["turnId"]

    run_app(daemon, ws, scenario)


def test_fork_whose_source_was_deleted_is_marked_in_the_session_list(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=1, title="Gone")
    op = client.call(
        "fork.create",
        fork_params(ws, sid, turns[0]),
    )["operation"]
    op = wait_for(
        lambda: (
            (
                o := client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})[
                    "operation"
                ]
            )["status"]
            == "committed"
            and o
        )
    )
    child = op["targetAgentSessionId"]
    client.call("fork.acknowledge", {"workspaceId": ws, "operationId": op["operationId"]})
    client.call("session.delete", {"workspaceId": ws, "agentSessionId": sid})

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        tree = app.query_one(SessionTree)
        node = await until(pilot, lambda: tree.node_for(child))
        assert "from a deleted session" in str(node.label)
        assert tree.depth_of(child) == 0

    run_app(daemon, ws, scenario)


def test_each_turn_shows_the_files_it_changed(
    daemon: DaemonProcess, client: Client, ws: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    sid = create_session(client, ws, title="Edits", cwd=str(repo))["agentSessionId"]

    def _edit() -> None:
        (repo / "a.txt").write_text("changed\n")
        (repo / "new.txt").write_text("new\n")

    turn_changing(client, sid, _edit, ws=ws)
    run_turn(client, sid, "nothing to change", ws)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 2)
        first, second = turn_views(app)
        head, body = header_text(first), body_text(first)
        assert "2 files changed" in head, head
        assert "files M a.txt, A new.txt" in body, body
        assert "no files changed" in header_text(second)

    run_app(daemon, ws, scenario)
