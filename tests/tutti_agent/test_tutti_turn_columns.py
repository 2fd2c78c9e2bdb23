"""The cold fork's source read as turn columns (`turnColumns`): the resume's prewarm makes the
columns, not the turns' objects — no turn is projected for a host that asks for columns, the
read answers the prewarm's very lists. Counts, never timings."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.tutti_agent.items import explicit_turn
from tests.tutti_agent.storeutil import write_root
from tutti_agent import wire
from tutti_agent.model import BuiltinModel
from tutti_agent.server import AppServer
from tutti_agent.store import ThreadStore

pytestmark = pytest.mark.timeout(60)


def test_the_prewarm_makes_the_columns_and_projects_no_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    store = ThreadStore(home)
    thread_id = write_root(
        store, [*explicit_turn("t1", "q1", "a1"), *explicit_turn("t2", "q2", "a2")]
    )
    projected: list[object] = []
    real = wire.turn_to_wire

    def counting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        projected.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(wire, "turn_to_wire", counting)
    out = io.StringIO()
    server = AppServer(ThreadStore(home), BuiltinModel(), out)

    def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
        out.seek(0)
        out.truncate()
        server.handle_line(json.dumps({"id": 1, "method": method, "params": params}))
        answer: dict[str, Any] = orjson.loads(out.getvalue().split("\n", 1)[0])
        assert "error" not in answer, answer
        return answer["result"]

    try:
        ask("initialize", {"clientInfo": {"name": "t", "version": "0"}})
        ask("thread/resume", {"threadId": thread_id, "excludeTurns": True})
        for t in threading.enumerate():
            if t.name.startswith("prewarm"):
                t.join(10)
        made = wire._last_columns
        assert made is not None and made[1]["turnIds"] == ["t1", "t2"]
        read = ask(
            "thread/read",
            {"threadId": thread_id, "includeTurns": True, "turnItems": False, "turnColumns": True},
        )["thread"]
        assert (read["turnIds"], read["turnStatuses"]) == (["t1", "t2"], ["completed"] * 2)
        assert wire._last_columns is made  # the prewarm's lists answered, not made again
        assert projected == []  # no turn object made for the read, nor by the prewarm
    finally:
        server.shutdown()
