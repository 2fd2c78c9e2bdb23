"""tutti-agent's notifications are encoded by orjson (`tutti_agent.wire.encode_notification`)
and read exactly as the standard library's encoder wrote them: every line a Turn writes — a
streamed reply, a tool, a failure, text with escapes, non-ASCII and control characters — is
the text `json.dumps(value, separators=(",", ":"), ensure_ascii=False)` makes of its value,
and what orjson refuses (a lone surrogate) is still written by the standard library."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from tests.support.python_calls import python_calls
from tutti_agent.model import BuiltinModel
from tutti_agent.server import Connection
from tutti_agent.store import ThreadStore
from tutti_agent.turns import LiveThread

pytestmark = pytest.mark.timeout(60)


def _standard(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _turns(tmp_path: Any, texts: list[str]) -> list[str]:
    store = ThreadStore(tmp_path / "home")
    meta = {"id": "t-notify", "cwd": str(tmp_path), "model": "m"}
    writer = store.create_rollout("t-notify", meta)
    writer.close()
    history = store.load("t-notify")
    out = io.StringIO()
    live = LiveThread(store, history, store.open_writer(history), Connection(out), BuiltinModel())
    for text in texts:
        _wire, starter = live.start_turn(text)
        starter()
        assert live.wait_idle(30)
    live.close()
    return out.getvalue().split("\n")[:-1]  # not splitlines: U+2028 is no line end here


def test_every_line_a_turn_notifies_is_the_standard_librarys_text(tmp_path: Any) -> None:
    lines = _turns(
        tmp_path,
        [
            '/stream héllo \u2028 wörld "quoted" back\\slash tab\t nl\n ctl\x01 del\x7f 🙂',
            "/tool grep x\u0085y",
            "/fail it broke: \u00e9\x1f",
            "plain",
        ],
    )
    methods = [json.loads(line)["method"] for line in lines]
    assert methods.count("item/agentMessage/delta") > 10
    assert {"turn/started", "turn/completed", "item/started", "item/completed"} <= set(methods)
    for line in lines:
        assert line == _standard(json.loads(line))


def test_a_notification_is_not_encoded_by_the_standard_library() -> None:
    out = io.StringIO()
    conn = Connection(out)
    params = {"threadId": "t", "turnId": "u", "itemId": "msg_1", "delta": "echo"}
    entered = python_calls(lambda: conn.notify("item/agentMessage/delta", params))
    # Without encode_notification: JSONEncoder.encode and iterencode per notification.
    assert not [name for name in entered if name.startswith("JSONEncoder.")], entered
    assert (
        out.getvalue() == _standard({"method": "item/agentMessage/delta", "params": params}) + "\n"
    )


def test_what_orjson_refuses_is_written_by_the_standard_library() -> None:
    out = io.StringIO()
    conn = Connection(out)
    lone = {"delta": "a\udc80b", "n": 2**70}
    conn.notify("item/agentMessage/delta", lone)
    assert out.getvalue() == _standard({"method": "item/agentMessage/delta", "params": lone}) + "\n"
