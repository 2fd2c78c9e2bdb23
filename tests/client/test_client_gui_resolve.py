"""The GUI's issue-21 parts, headless through Textual's pilot against a real daemon: an
`unknown` fork marked on its boundary Turn with Inspect → Adopt / Abandon (the verdict and the
children in words, Adopt only when adoptable, refusals in words), the Session-level Fork shown
only with `forkFullSession`, and the session list's fork ordinals and deleted-ancestor marks."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Static

from client.engine.lifecycle import Engine
from client.engine.values import LATEST_SETTLED, AckState, MutationStatus
from client.gui.app import FORK_SESSION_ID, AgentHostApp
from client.gui.resolve import (
    ABANDON_ID,
    ADOPT_ID,
    CHILDREN_ID,
    ERROR_ID,
    VERDICT_ID,
    ResolveScreen,
)
from client.gui.session_list import SessionTree
from client.gui.transcript import UNRESOLVED_TIP, inspect_button_id, unknown_row_id
from tests.client.conftest import source
from tests.client.test_client_gui import click, fork_button, open_and_wait, turn_ids, until
from tests.daemon.test_fork_saga import until_terminal
from tests.support.daemon import DaemonProcess, create_session, fork_params, run_turn, submit
from transport.client import Client, EventSubscriber

pytestmark = pytest.mark.timeout(120)


class RecordingApp(AgentHostApp):
    """The GUI, keeping every toast it raised (`said`). A toast is shown for a few seconds only,
    and on a loaded host one `pilot.pause` can take longer than that (a loop of this file under
    load saw 6.3 s and 9.2 s): the adopt and abandon toasts were missed that way."""

    def __init__(self, engine: Engine, *, own_engine: bool = False) -> None:
        super().__init__(engine, own_engine=own_engine)
        self.toasts_raised: list[str] = []

    def notify(self, message: str, **kwargs: Any) -> None:
        self.toasts_raised.append(str(message))
        super().notify(message, **kwargs)


def said(app: AgentHostApp) -> list[str]:
    """Every toast `app` raised so far, shown or expired."""
    assert isinstance(app, RecordingApp)
    return app.toasts_raised


def run_app(
    daemon: DaemonProcess,
    ws: str,
    scenario: Callable[[AgentHostApp, Pilot[Any]], Awaitable[None]],
) -> None:
    async def main() -> None:
        engine = Engine.connect(daemon.api, daemon.events, ws)
        app = RecordingApp(engine, own_engine=True)
        async with app.run_test(size=(140, 48)) as pilot:
            await until(pilot, lambda: app.sessions_loaded)
            await scenario(app, pilot)

    asyncio.run(main())


async def wait(pilot: Pilot[Any], pred: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Like `until`, for states with a dialog on top (no transcript to wait on)."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, "GUI condition not met in time"
        await pilot.pause(0.05)
    return value


async def press(app: AgentHostApp, pilot: Pilot[Any], button_id: str) -> None:
    """Click a dialog's button once it is drawn and enabled."""

    def ready() -> bool:
        found = app.screen.query(f"#{button_id}")
        if not found:
            return False
        button = found.first(Button)
        region = button.region
        return (
            bool(region.area)
            and not button.disabled
            and app.screen.get_widget_at(*region.offset)[0] is button
        )

    # A dialog's layout may still move (an error line appears): retry a click that missed.
    for _ in range(20):
        await wait(pilot, ready)
        await pilot.pause()
        if await pilot.click(f"#{button_id}"):
            return
        await pilot.pause(0.1)
    raise AssertionError(f"could not click #{button_id}")


def text_of(app: AgentHostApp, widget_id: str) -> str:
    """A dialog's text; empty while the dialog is pushed but not yet composed (a loaded run
    read the verdict in that moment and failed on `NoMatches`)."""
    found = app.screen.query(f"#{widget_id}")
    return str(found.first(Static).render()) if found else ""


def marked(app: AgentHostApp, turn_id: str) -> bool:
    return bool(app._main.query(f"#{unknown_row_id(turn_id)}"))  # noqa: SLF001


def subscribed(client: Client, sub: EventSubscriber, ws: str) -> None:
    """Beat ZeroMQ's slow joiner: create probe Sessions until `sub` hears one."""
    for _ in range(20):
        probe = create_session(client, ws, title="probe")["agentSessionId"]
        deadline = time.monotonic() + 1
        while (event := sub.next(max(0.0, deadline - time.monotonic()))) is not None:
            if event["type"] == "session.upserted" and event["session"]["agentSessionId"] == probe:
                return
    raise AssertionError("the subscriber heard none of 20 probe Sessions in 20 s")


def unknown_fork(
    client: Client, ws: str, sid: str, turn_id: str, point: str, events: str
) -> dict[str, Any]:
    """A fork left `unknown` by another client: the worker is SIGKILLed at `point`.

    Returns only once the daemon has published the operation's `unknown` event (heard here),
    so an Engine that connects after this cannot hear it: the operation's commit is readable
    by `fork.get` before its change reaches the publisher, and a subscription that arrived in
    between would hear it (a CI run saw the GUI marked before its Fork click that way)."""
    with EventSubscriber(events, (ws,)) as sub:
        subscribed(client, sub, ws)
        client.call("debug.failpoints", {"points": {point: "once:kill"}})
        op = client.call("fork.create", fork_params(ws, sid, turn_id))["operation"]
        op = until_terminal(client, op, ws=ws)
        assert op["status"] == "unknown", op
        deadline = time.monotonic() + 60
        while True:
            event = sub.next(max(0.0, deadline - time.monotonic()))
            assert event is not None, "the unknown operation's event was never published"
            if (
                event["type"] == "fork.operation"
                and event["operation"]["operationId"] == op["operationId"]
                and event["operation"]["status"] == "unknown"
            ):
                break
    return dict(op)


def test_unknown_fork_is_marked_on_its_turn_inspected_adoptable_and_adopted(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=2, title="Crashy")

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 2)
        assert not marked(app, turns[0]) and not marked(app, turns[1])
        client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
        await click(app, pilot, f"#fork-{turns[0]}")
        # The fork ends unknown: Turn 1 carries the mark and Inspect; Turn 2 does not.
        await until(pilot, lambda: marked(app, turns[0]))
        client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
        assert not marked(app, turns[1])
        row = app._main.query_one(f"#{unknown_row_id(turns[0])}")  # noqa: SLF001
        words = " ".join(str(s.render()) for s in row.query(Static))
        assert "fork result unknown" in words
        record = app.engine.mutation(sid, turns[0])
        assert record is not None and record.status is MutationStatus.UNKNOWN
        assert str(record.operation_id)[:8] in words
        # The click's toast and the Turn's Fork send the person to Inspect: a Fork again would
        # answer the same operation (its requestId), so it is not offered.
        assert record.recorded_unknown
        await wait(pilot, lambda: any("press Inspect on the turn" in t for t in said(app)))
        assert not any("Fork again" in t for t in said(app)), said(app)
        button = fork_button(app, turns[0])
        assert button is not None and button.disabled and button.tooltip == UNRESOLVED_TIP
        await click(app, pilot, f"#{inspect_button_id(turns[0])}")
        await wait(pilot, lambda: isinstance(app.screen, ResolveScreen))
        await wait(pilot, lambda: "Verdict" in text_of(app, VERDICT_ID))
        assert text_of(app, VERDICT_ID).startswith(
            "Verdict: adoptable: exactly one provider child matches this fork"
        )
        children = text_of(app, CHILDREN_ID)
        assert "• provider session " in children
        assert "its turns equal the history up to the boundary" in children
        adopt = app.screen.query_one(f"#{ADOPT_ID}", Button)
        assert adopt.display and adopt.has_class("-shown")
        await press(app, pilot, ADOPT_ID)
        # Adopted: the dialog closes, the child opens, the mark is gone, the ACK observed.
        await wait(pilot, lambda: not isinstance(app.screen, ResolveScreen))
        await wait(
            pilot,
            lambda: any(t.startswith("adopted: the fork through Turn 1") for t in said(app)),
        )
        child = str(record.target_session_id)
        await wait(pilot, lambda: app.current == child)
        await wait(
            pilot,
            lambda: getattr(app.engine.mutation(sid, turns[0]), "ack", None) is AckState.OBSERVED,
        )
        assert app.engine.unknown_operations(sid) == {}
        await until(pilot, lambda: len(turn_ids(app)) == 1)
        op = client.call("fork.get", {"workspaceId": ws, "operationId": str(record.operation_id)})[
            "operation"
        ]
        assert op["status"] == "committed"
        app.open_session(sid)
        await until(pilot, lambda: len(turn_ids(app)) == 2 and not marked(app, turns[0]))

    run_app(daemon, ws, scenario)


def test_absent_unknown_fork_offers_no_adopt_refusals_are_words_and_abandon_frees_the_turn(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=1, title="Absent")
    # Left `unknown` by another client before this GUI started: the GUI learns of it when
    # its Fork click is answered with that durable operation (the boundary barrier).
    op = unknown_fork(client, ws, sid, turns[0], "worker.fork.before_provider_call", daemon.events)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        assert not marked(app, turns[0])
        await click(app, pilot, f"#fork-{turns[0]}")
        await until(pilot, lambda: marked(app, turns[0]))
        assert app.engine.unknown_operations(sid)[turns[0]]["operationId"] == op["operationId"]
        await click(app, pilot, f"#{inspect_button_id(turns[0])}")
        await wait(pilot, lambda: isinstance(app.screen, ResolveScreen))
        await wait(pilot, lambda: "Verdict" in text_of(app, VERDICT_ID))
        assert text_of(app, VERDICT_ID).startswith(
            "Verdict: absent: the provider made no child for this fork."
        )
        assert "No provider child was found" in text_of(app, CHILDREN_ID)
        # Adopt is not offered (not displayed) and not allowed (refused before any request).
        adopt = app.screen.query_one(f"#{ADOPT_ID}", Button)
        assert not adopt.has_class("-shown") and adopt.disabled
        screen = app.screen
        assert isinstance(screen, ResolveScreen)
        screen._run("adopt")  # noqa: SLF001 - what a stray key binding would do
        await wait(pilot, lambda: "cannot adopt" in text_of(app, ERROR_ID))
        # The daemon's refusal of adopt (verdict absent) reads in words, not codes.
        with pytest.raises(Exception) as refused:
            app.engine.resolve(op["operationId"], "adopt")
        from client.session_client import error_words

        words = error_words("adopt the fork", refused.value)
        assert words == (
            "cannot adopt the fork: the evidence is absent, not adoptable (only one verified "
            "provider child can be adopted; abandon it instead)"
        )
        await press(app, pilot, ABANDON_ID)
        await wait(pilot, lambda: not isinstance(app.screen, ResolveScreen))
        await wait(
            pilot, lambda: any(t == "abandoned: Turn 1 can be forked again" for t in said(app))
        )
        await until(pilot, lambda: not marked(app, turns[0]))
        got = client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})
        assert got["operation"]["status"] == "abandoned"
        # The boundary is free: Fork again forks anew and opens the child.
        await until(pilot, lambda: (b := fork_button(app, turns[0])) is not None and not b.disabled)
        await click(app, pilot, f"#fork-{turns[0]}")
        await wait(pilot, lambda: app.current not in (None, sid))
        record = app.engine.mutation(sid, turns[0])
        assert record is not None and record.status is MutationStatus.SUCCEEDED
        assert record.operation_id != op["operationId"]
        await until(pilot, lambda: len(turn_ids(app)) == 1)  # the child's transcript

    run_app(daemon, ws, scenario)


def test_resolve_dialog_says_in_words_when_another_client_resolved_first(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid, turns = source(client, ws, turns=1, title="Race")
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        await click(app, pilot, f"#fork-{turns[0]}")
        await until(pilot, lambda: marked(app, turns[0]))
        client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
        op_id = str(getattr(app.engine.mutation(sid, turns[0]), "operation_id", ""))
        await click(app, pilot, f"#{inspect_button_id(turns[0])}")
        await wait(pilot, lambda: isinstance(app.screen, ResolveScreen))
        await wait(pilot, lambda: "adoptable" in text_of(app, VERDICT_ID))
        # Another client abandons it meanwhile; this dialog's Adopt is then refused in words.
        client.call(
            "fork.resolve",
            {
                "workspaceId": ws,
                "operationId": op_id,
                "requestId": str(uuid.uuid4()),
                "action": "abandon",
            },
        )
        await press(app, pilot, ADOPT_ID)
        await wait(pilot, lambda: text_of(app, ERROR_ID))
        error = text_of(app, ERROR_ID)
        assert error.startswith("cannot adopt the fork: "), error
        assert "409" not in error and "resolve_conflict" not in error
        assert isinstance(app.screen, ResolveScreen)  # still open, the user reads it
        # The dialog re-inspects: it now says the fork is abandoned, and offers nothing.
        await wait(pilot, lambda: "abandoned now" in text_of(app, "resolve-status"))
        assert text_of(app, ERROR_ID) == error
        assert not app.screen.query_one(f"#{ADOPT_ID}", Button).has_class("-shown")
        assert app.screen.query_one(f"#{ABANDON_ID}", Button).disabled
        await pilot.press("escape")
        await wait(pilot, lambda: not isinstance(app.screen, ResolveScreen))
        # The abandon's fork.operation event cleared the mark.
        await until(pilot, lambda: not marked(app, turns[0]))

    run_app(daemon, ws, scenario)


def fork_button_session(app: AgentHostApp) -> Button:
    return app._main.query_one(f"#{FORK_SESSION_ID}", Button)  # noqa: SLF001


def test_session_fork_shown_only_with_fork_full_session_and_forks_the_latest_turn(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    sid = create_session(client, ws, title="Whole")["agentSessionId"]

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.engine.session(sid) is not None)
        app.open_session(sid)
        await until(pilot, lambda: app.current == sid)
        # No Turn yet: no attestation, forkFullSession false → no Session-level Fork.
        session = app.engine.session(sid) or {}
        assert session["lifecycleCapabilities"]["forkFullSession"] is False
        await pilot.pause(0.2)
        assert not fork_button_session(app).display
        turns = [run_turn(client, sid, t, ws)["turnId"] for t in ("one", "two")]
        await until(
            pilot,
            lambda: (app.engine.session(sid) or {})["lifecycleCapabilities"]["forkFullSession"],
        )
        await until(pilot, lambda: fork_button_session(app).display and len(turn_ids(app)) == 2)
        button = fork_button_session(app)
        assert not button.disabled and str(button.label) == "Fork session"
        # While a Turn runs it is disabled with the reason.
        active = submit(client, sid, "/slow 8000 three", ws)["turnId"]
        await until(pilot, lambda: fork_button_session(app).disabled)
        assert str(fork_button_session(app).tooltip) == (
            "Cannot fork now: Turn 3 is still running (source_turn_active)"
        )
        # The palette's "Fork session" while busy: the daemon's refusal reads in words.
        app.action_fork_session()
        await until(
            pilot,
            lambda: any(
                t == "cannot fork the whole session: Turn 3 is still running (source_turn_active)"
                for t in said(app)
            ),
        )
        await until(pilot, lambda: not fork_button_session(app).disabled, timeout=30)
        await click(app, pilot, f"#{FORK_SESSION_ID}")
        await until(pilot, lambda: app.current not in (None, sid))
        record = app.engine.mutation(sid, LATEST_SETTLED)
        assert record is not None and record.status is MutationStatus.SUCCEEDED
        assert record.boundary_turn_id == active != turns[-1]
        child = app.engine.session(str(app.current)) or {}
        assert child["forkedFrom"]["sourceTurnId"] == active
        await until(pilot, lambda: len(turn_ids(app)) == 3)

    run_app(daemon, ws, scenario)


def fork_now(client: Client, ws: str, sid: str) -> str:
    """Fork `sid` through its newest Turn, wait for the commit, ACK it: the child id."""
    turns = client.call("session.timeline", {"workspaceId": ws, "agentSessionId": sid})["turns"]
    op = client.call("fork.create", fork_params(ws, sid, turns[-1]["turnId"]))["operation"]
    op = until_terminal(client, op, ws=ws)
    assert op["status"] == "committed", op
    client.call("fork.acknowledge", {"workspaceId": ws, "operationId": op["operationId"]})
    return str(op["targetAgentSessionId"])


def labels(app: AgentHostApp) -> dict[str, str]:
    tree = app._main.query_one(SessionTree)  # noqa: SLF001
    out: dict[str, str] = {}

    def walk(node: Any) -> None:
        for child in node.children:
            out[str(child.data)] = str(child.label)
            walk(child)

    walk(tree.root)
    return out


def test_session_list_shows_fork_ordinals_and_marks_deleted_ancestors(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    # A → B (#1), A → C (#2); B → D (#1); D → E (#1). Then B is deleted.
    a, _ = source(client, ws, turns=1, title="Alpha")
    b = fork_now(client, ws, a)
    c = fork_now(client, ws, a)
    d = fork_now(client, ws, b)
    e = fork_now(client, ws, d)

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await wait(pilot, lambda: len(labels(app)) == 5)

        def shown() -> dict[str, str] | None:
            got = labels(app)
            return got if got.get(c, "").startswith("#2 ") else None

        got = await wait(pilot, shown)
        assert got[a].startswith("Alpha ")
        assert got[b].startswith("#1 ") and got[c].startswith("#2 ")
        assert got[d].startswith("#1 ") and got[e].startswith("#1 ")
        assert not any("deleted" in label for label in got.values())
        client.call("session.delete", {"workspaceId": ws, "agentSessionId": b})

        def after() -> dict[str, str] | None:
            got = labels(app)
            return got if b not in got and "ancestor was deleted" in got.get(e, "") else None

        got = await wait(pilot, after)
        # D's source is gone; E's grandparent is: both say so, and keep their ordinals.
        assert got[d].startswith("† #1 ") and "↳ from a deleted session" in got[d]
        assert got[e].startswith("† #1 ") and "↳ an ancestor was deleted" in got[e]
        assert got[c].startswith("#2 ") and "deleted" not in got[c]
        assert "deleted" not in got[a]

    run_app(daemon, ws, scenario)


def test_the_details_pane_names_an_unknown_forks_whole_operation_id_for_the_cli(
    daemon: DaemonProcess, client: Client, ws: str
) -> None:
    # The mark names the operation by 8 characters; `agenthost resolve` needs the whole id of
    # an operation that is not committed (no wire method lists them), so F3 gives it whole.
    sid, turns = source(client, ws, turns=1, title="Copy the id")
    op = unknown_fork(client, ws, sid, turns[0], "worker.fork.before_provider_call", daemon.events)
    operation_id = str(op["operationId"])

    async def scenario(app: AgentHostApp, pilot: Pilot[Any]) -> None:
        await open_and_wait(app, pilot, sid, 1)
        await click(app, pilot, f"#fork-{turns[0]}")
        await until(pilot, lambda: marked(app, turns[0]))
        await pilot.press("f3")
        await wait(pilot, lambda: hasattr(app.screen, "text"))
        details = str(app.screen.text)  # type: ignore[attr-defined]
        assert f"agenthost resolve {operation_id}" in details, details

    run_app(daemon, ws, scenario)
