"""The app-server reader's quiet lines: notifications that turn into no event (a thread's status,
token usage, read state, rate limits, warnings) and the provider's copies of the user's message
reach the driver undecoded, still mark the thread's history as possibly changed when they may
concern it, and every other line — each delta among them — is decoded and relayed as before."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import EventLog, completed

from drivers.app_server.driver import AppServerDriver
from drivers.app_server.events import QUIET_PREFIXES, TurnEvents
from drivers.app_server.process import AppServerProcess, QuietLines, decode_line, private_env
from drivers.app_server.state import SessionState

Make = Callable[..., AppServerDriver]
THREAD = "019a0000-0000-7000-8000-00000000aaaa"
OTHER = "019a0000-0000-7000-8000-00000000bbbb"


def line(message: Mapping[str, Any]) -> bytes:
    """A message as app-servers write it: compact JSON, the method first."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def session_state(tmp_path: Path) -> SessionState:
    return SessionState("ws/s", tmp_path, str(tmp_path), THREAD, None)


@pytest.mark.timeout(60)
def test_a_turns_quiet_notifications_and_user_items_reach_the_reader_undecoded(
    make_driver: Make, tmp_path: Path
) -> None:
    log = EventLog()
    driver = make_driver()
    home = tmp_path / "runtimes" / "s" / "tutti-agent-home"
    driver.start_session(
        {"agentSessionId": "s", "home": str(home), "cwd": str(tmp_path), "settings": {}}
    )
    runtime = driver._sessions.require("s").runtime
    assert runtime is not None
    before = runtime.proc.quiet_lines
    text = "a streamed reply of several deltas"
    result = driver.start_turn(
        {"agentSessionId": "s", "turnId": "T1", "text": f"/stream {text}"}, log
    )
    log.wait_for(completed("T1"))
    # Two `thread/status/changed` (active, idle) and the user item started and completed.
    assert runtime.proc.quiet_lines - before == 4
    events = log.of_turn("T1")
    kinds = [e["type"] for e in events]
    assert kinds[0] == "turn.started" and "bindingJson" in events[0]
    assert "turn.binding" not in kinds  # carried by `turn.started`
    assert kinds[-1] == "turn.completed" and events[-1]["outcome"] == "completed"
    assert events[0]["providerTurnId"] == result["providerTurnId"]
    # Every delta relayed, in order, before the item they made; no user item.
    deltas = [e["delta"] for e in events if e["type"] == "message.delta"]
    reply = f"echo: {text}"
    assert deltas == [reply[at : at + 4] for at in range(0, len(reply), 4)]
    items = [e["item"] for e in events if e["type"] == "item"]
    assert [(i["kind"], i["text"]) for i in items] == [("assistant", reply)]
    assert kinds.index("item") > max(i for i, k in enumerate(kinds) if k == "message.delta")


@pytest.mark.timeout(30)
def test_a_quiet_line_marks_the_thread_changed_only_when_it_may_concern_it(
    tmp_path: Path,
) -> None:
    events = TurnEvents("tutti-agent", {}, None, lambda session, turn: None)
    session = session_state(tmp_path)
    status = {"method": "thread/status/changed", "params": {"status": {"type": "idle"}}}
    user_item = {
        "method": "item/completed",
        "params": {
            # Text that spells the key inside a string: JSON escapes its quotes.
            "item": {"type": "userMessage", "id": "u1", "content": [{"text": '"threadId":"x"'}]},
            "threadId": THREAD,
            "turnId": "t1",
        },
    }
    cases = [
        (status | {"params": {"threadId": THREAD, "status": {"type": "idle"}}}, True),
        (status | {"params": {"threadId": OTHER, "status": {"type": "idle"}}}, False),
        ({"method": "account/rateLimits/updated", "params": {"rateLimits": {}}}, False),
        ({"method": "warning", "params": {"message": "no thread named"}}, True),
        (user_item, True),
        (user_item | {"params": {**user_item["params"], "threadId": OTHER}}, False),
    ]
    for message, changed in cases:
        raw = line(message)
        assert raw.startswith(QUIET_PREFIXES), raw
        session.verified_turns = object()  # type: ignore[assignment]
        generation = session.history_generation
        events.on_quiet_line(session, raw)
        assert (session.history_generation != generation) is changed, message
        assert (session.verified_turns is None) is changed, message


SCRIPTED = """
import sys
for raw in sys.argv[1:]:
    sys.stdout.write(raw + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""


@pytest.mark.timeout(30)
def test_a_line_that_does_not_start_with_its_method_is_decoded_and_dispatched_in_order(
    tmp_path: Path,
) -> None:
    """A server that writes its keys in another order loses nothing: the line is decoded."""
    seen: list[tuple[str, Any]] = []
    done = threading.Event()

    def on_notification(method: str, params: Mapping[str, Any]) -> None:
        seen.append((method, dict(params)))
        if method == "turn/completed":
            done.set()

    messages = [
        {"method": "thread/status/changed", "params": {"threadId": THREAD}},
        {
            "params": {"threadId": THREAD, "status": {"type": "idle"}},
            "method": "thread/status/changed",
        },
        {"method": "item/agentMessage/delta", "params": {"threadId": THREAD, "delta": "d00 "}},
        {"method": "turn/completed", "params": {"threadId": THREAD, "turn": {"id": "t1"}}},
    ]
    proc = AppServerProcess(
        [sys.executable, "-c", SCRIPTED, *(json.dumps(m, separators=(",", ":")) for m in messages)],
        env=private_env(None, "FAKE_HOME", tmp_path / "home"),
        on_notification=on_notification,
        quiet=QuietLines(QUIET_PREFIXES, lambda raw: seen.append(("quiet", raw))),
    )
    proc.start()
    try:
        assert done.wait(10)
    finally:
        proc.close(1.0)
    assert seen == [
        ("quiet", line(messages[0])),
        ("thread/status/changed", messages[1]["params"]),
        ("item/agentMessage/delta", messages[2]["params"]),
        ("turn/completed", messages[3]["params"]),
    ]
    assert proc.quiet_lines == 1


@pytest.mark.timeout(30)
def test_a_line_orjson_refuses_is_read_as_the_standard_library_reads_it() -> None:
    assert decode_line(b'{"method":"m","params":{"n":2}}\n') == {"method": "m", "params": {"n": 2}}
    big = 2**70 + 1  # no float holds it: read as a float, it would compare unequal
    read = decode_line(b'{"n":%d}' % big)
    assert read == {"n": big} and type(read["n"]) is int
    assert decode_line(b'{"n":-%d}' % big) == {"n": -big}
    nan = decode_line(b'{"n":NaN}')
    assert isinstance(nan, dict) and nan["n"] != nan["n"]
    assert decode_line(b"not json at all\n") is None
