"""`ThreadHistoryBuilder.handle_range`: the state `handle` line by line leaves, with the
lean reduction's shortcuts (lines passed over, each Turn's start and end reduced inline)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tutti_agent.items import session_meta, task_complete, task_started, user_msg
from tutti_agent.history import ThreadHistoryBuilder, build_turns, reduce_run
from tutti_agent.rollout import LineType, RolloutItem

pytestmark = pytest.mark.timeout(120)

_ODD = st.sampled_from([None, 0, 7, -1, 2.5, True, "9", "x", [1], {"a": 1}])
_ID = st.one_of(st.none(), st.sampled_from(["t1", "t2", "t3"]), _ODD)


def _event(kind: Any, **fields: Any) -> RolloutItem:
    payload = {k: v for k, v in fields.items() if v is not _ABSENT}
    if kind is not _ABSENT:
        payload["type"] = kind
    return RolloutItem(LineType.EVENT_MSG, payload)


_ABSENT = object()
_MAYBE = st.one_of(st.just(_ABSENT), _ODD, st.integers(0, 10**12))

_ITEMS = st.one_of(
    st.builds(
        _event, st.just("task_started"), turn_id=st.one_of(st.just(_ABSENT), _ID), started_at=_MAYBE
    ),
    st.builds(
        _event,
        st.just("task_complete"),
        turn_id=st.one_of(st.just(_ABSENT), _ID),
        completed_at=_MAYBE,
        duration_ms=_MAYBE,
    ),
    st.builds(
        _event,
        st.just("turn_aborted"),
        turn_id=st.one_of(st.just(_ABSENT), _ID),
        completed_at=_MAYBE,
        duration_ms=_MAYBE,
    ),
    st.builds(_event, st.just("error"), message=st.one_of(st.just(_ABSENT), st.text(max_size=3))),
    st.builds(
        _event,
        st.just("item_completed"),
        item=st.one_of(st.just(_ABSENT), st.none(), st.just({"type": "agentMessage", "id": "i"})),
    ),
    st.builds(_event, st.sampled_from([_ABSENT, None, "agent_message", [1], 3, "task"])),
    st.sampled_from(
        [
            user_msg("hello"),
            user_msg("<environment_context>\n</environment_context>"),
            RolloutItem(LineType.RESPONSE_ITEM, {"type": "message", "role": "assistant"}),
            RolloutItem(LineType.RESPONSE_ITEM, {"type": "function_call", "call_id": "c"}),
            session_meta(),
            RolloutItem("turn_context", {"type": "task_started", "turn_id": "x"}),
        ]
    ),
)


def _line_by_line(
    items: list[RolloutItem], start: int, stop: int, with_items: bool
) -> ThreadHistoryBuilder:
    builder = ThreadHistoryBuilder(with_items=with_items)
    for i in range(start, stop):
        builder.handle(i, items[i])
    return builder


@settings(max_examples=600, deadline=None)
@given(items=st.lists(_ITEMS, max_size=40), with_items=st.booleans(), data=st.data())
def test_handle_range_leaves_the_state_handle_leaves(
    items: list[RolloutItem], with_items: bool, data: st.DataObject
) -> None:
    """Any lines, odd values included (ids and times of every JSON type, events without a
    type or with an unhashable one, a failed turn, a start without an end, an end without a
    start, legacy user messages): the turns closed and the turn left open are those of
    `handle` called line by line, over any range of them and from any state before it."""
    start = data.draw(st.integers(0, len(items)))
    stop = data.draw(st.integers(start, len(items)))
    cut = data.draw(st.integers(0, start))
    want = _line_by_line(items, cut, stop, with_items)
    got = _line_by_line(items, cut, start, with_items)
    got.handle_range(items, start, stop)
    assert got.state(cut, stop) == want.state(cut, stop)
    assert got.turns() == want.turns()
    assert (
        build_turns(items, with_items=with_items)
        == _line_by_line(items, 0, len(items), with_items).turns()
    )
    run = reduce_run(items, start, stop, with_items=with_items)
    assert run == _line_by_line(items, start, stop, with_items).state(start, stop)


def test_a_lean_reduction_hands_handle_no_line_of_a_settled_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lean reduction of settled Turns (start, user message, item events, end) makes no
    `handle` call for any of their lines: each Turn is reduced in `handle_range`'s loop
    (100 Turns: 0 calls, against 600 line by line); the turns are those `handle` makes."""
    items = [session_meta()]
    for n in range(100):
        done = {"type": "item_completed", "item": {"type": "agentMessage", "id": str(n)}}
        items += [
            task_started(f"t{n}", started_at=n),
            user_msg(f"question {n}"),
            RolloutItem(LineType.EVENT_MSG, done),
            RolloutItem(LineType.RESPONSE_ITEM, {"type": "message", "role": "assistant"}),
            RolloutItem(LineType.EVENT_MSG, done),
            task_complete(f"t{n}"),
        ]
    want = _line_by_line(items, 0, len(items), False).turns()
    calls = [0]
    handle = ThreadHistoryBuilder.handle

    def counted(self: ThreadHistoryBuilder, index: int, item: RolloutItem) -> None:
        calls[0] += 1
        handle(self, index, item)

    monkeypatch.setattr(ThreadHistoryBuilder, "handle", counted)
    assert build_turns(items, with_items=False) == want
    assert len(want) == 100
    assert calls[0] == 0
    build_turns(items, with_items=True)  # the full reduction: every line, as before
    assert calls[0] == len(items)
