"""A reduction projected without items (`wire.lean_turns_to_wire`) and encoded (`_encoded`)
once, when a second thread asks for it while the first is still at it (a source's
`thread/read` that comes while the resume's prewarm projects: the cold fork's case)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import tutti_agent.wire as wire
from tests.tutti_agent.items import session_meta, task_complete, task_started, user_msg
from tutti_agent.history import build_turns

pytestmark = pytest.mark.timeout(60)


def test_a_read_during_the_prewarm_takes_its_projection_and_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prewarm (`prepare_lean`) is held inside its projection until the read has asked
    for the same turns and waited 0.2 s: the read answers with the prewarm's very list and
    text, and each turn was projected once and the list encoded once (without the lock: 2n
    projections, 2 encodes)."""
    items = [session_meta()]
    for n in range(50):
        items += [task_started(f"t{n}"), user_msg(f"q{n}"), task_complete(f"t{n}")]
    turns = tuple(build_turns(items, with_items=False))
    monkeypatch.setattr(wire, "_last_lean", None)
    projected, encoded = [0], [0]
    read_asks = threading.Event()
    project = wire.turn_to_wire

    def slow_project(*args: Any, **kwargs: Any) -> dict[str, Any]:
        projected[0] += 1
        if projected[0] == 1:  # the prewarm's first turn: let the read come now
            assert read_asks.wait(10)
            time.sleep(0.2)
        return project(*args, **kwargs)

    dumps = wire.orjson.dumps

    class CountingOrjson:
        JSONEncodeError = wire.orjson.JSONEncodeError

        @staticmethod
        def dumps(value: Any) -> bytes:
            encoded[0] += 1
            return dumps(value)

    monkeypatch.setattr(wire, "turn_to_wire", slow_project)
    monkeypatch.setattr(wire, "orjson", CountingOrjson)
    prewarm = threading.Thread(target=wire.prepare_lean, args=(turns,))
    prewarm.start()
    while projected[0] == 0:
        time.sleep(0.001)
    read_asks.set()
    got = wire.lean_turns_to_wire(turns)
    text = wire._encoded(got)
    prewarm.join(10)
    assert projected[0] == len(turns) == 50
    assert encoded[0] == 1
    assert wire._last_lean is not None and got is wire._last_lean[1]
    assert text == dumps(got).decode() and got.encoded is text
