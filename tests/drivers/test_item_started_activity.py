"""The `TurnActivity` an `item/started` makes ("the model answered; an item runs"): sent for an
item that runs (a tool, a command, a reply that streams), not for one tutti-agent emits complete
(`completedNext`: its `item/completed` is the next line, a `TurnItem` the Session actor takes as
the same note) — one actor message a Turn fewer, no note lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from drv_helpers import EventLog
from test_tutti_driver import Make, open_session

from domain.turn_events import TurnActivity, TurnEvent, TurnItem
from drivers.app_server.events import COMPLETED_NEXT, TurnEvents
from drivers.app_server.state import SessionState

THREAD = "019a0000-0000-7000-8000-00000000aaaa"


def _started(item: dict[str, Any], *, completed_next: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"item": item, "threadId": THREAD, "turnId": "p1"}
    if completed_next:
        params[COMPLETED_NEXT] = True
    return params


@pytest.mark.parametrize(
    ("item", "completed_next", "noted"),
    [
        ({"type": "agentMessage", "id": "m1", "text": "hi"}, True, False),
        ({"type": "reasoning", "id": "r1", "summary": ["why"], "content": []}, True, False),
        # Codex's (no hint): the reply streams, or a tool runs, for as long as it takes.
        ({"type": "agentMessage", "id": "m1", "text": ""}, False, True),
        ({"type": "dynamicToolCall", "id": "c1", "tool": "t", "status": "inProgress"}, False, True),
        # An item type the driver does not know still becomes a `TurnItem` (map_item's last
        # case): it carries the note.
        ({"type": "someFutureItem", "id": "x1"}, True, False),
    ],
)
def test_an_item_started_notes_activity_unless_its_item_follows_at_once(
    tmp_path: Path, item: dict[str, Any], completed_next: bool, noted: bool
) -> None:
    sent: list[TurnEvent] = []
    events = TurnEvents("tutti-agent", {}, None, lambda session, turn: None)
    events.emit = lambda sid, event: sent.append(event)
    session = SessionState("ws/s", tmp_path, str(tmp_path), THREAD, None)
    session.turns["p1"] = "T1"
    events.on_notification(session, "item/started", _started(item, completed_next=completed_next))
    assert [e for e in sent if isinstance(e, TurnActivity)] == (
        [TurnActivity("T1")] if noted else []
    )


@pytest.mark.timeout(90)
def test_a_tutti_turn_sends_a_note_only_for_the_tool_that_runs(
    make_driver: Make, tmp_path: Path
) -> None:
    """A plain reply: its items and no `turn.activity` (the reply item is the note). A tool
    call: one note, when the tool starts (it runs before its item completes)."""
    log = EventLog()
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=("hello there", "/tool grep needle"))
    plain = [e["type"] for e in log.of_turn("src-T1")]
    assert TurnActivity.TYPE not in plain and plain.count(TurnItem.TYPE) == 1, plain
    tool = [e["type"] for e in log.of_turn("src-T2")]
    assert tool.count(TurnActivity.TYPE) == 1, tool
    # The note comes before the tool's items (it started before it completed).
    assert tool.index(TurnActivity.TYPE) < tool.index(TurnItem.TYPE) or (
        tool[: tool.index(TurnActivity.TYPE)].count(TurnItem.TYPE) == 1  # the reasoning item
    ), tool
