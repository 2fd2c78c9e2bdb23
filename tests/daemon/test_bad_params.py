"""Parameters a handler cannot store, through the real daemon: a map parameter holding bytes or
a bytes key anywhere inside it, and a `cwd` holding NUL, are a 400 `invalid_argument` naming
the field (they were a 500 `internal_error` from the store's JSON encoder or `realpath`), and
nothing of the request is written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session

BAD_MAPS: list[Any] = [
    {"a": b"bytes"},
    {"a": {b"key": 1}},
    {"a": [1, {"b": [b"deep"]}]},
]


@pytest.mark.parametrize("settings", BAD_MAPS)
def test_settings_that_are_not_json_are_400_and_nothing_is_created(
    daemon: DaemonProcess, settings: Any
) -> None:
    c = daemon.client()
    sid = str(uuid.uuid4())
    status, body = c.call_raw(
        "session.create",
        {"workspaceId": WS, "agentSessionId": sid, "provider": "tutti-agent", "settings": settings},
    )
    assert status == 400, body
    assert body["reason"] == "invalid_argument" and body["params"]["field"] == "settings"
    status, body = c.call_raw("session.get", {"workspaceId": WS, "agentSessionId": sid})
    assert status == 404, body
    # The Session made with the same settings as plain data is fine, and updating its
    # settings to bytes is refused the same way, its settings unchanged.
    session = create_session(c)
    sid = session["agentSessionId"]
    status, body = c.call_raw(
        "session.updateSettings", {"workspaceId": WS, "agentSessionId": sid, "settings": settings}
    )
    assert status == 400, body
    assert body["reason"] == "invalid_argument" and body["params"]["field"] == "settings"
    got = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    assert got["settings"] == session["settings"]


def test_a_cwd_holding_nul_is_400(daemon: DaemonProcess) -> None:
    c = daemon.client()
    status, body = c.call_raw(
        "session.create", {"workspaceId": WS, "provider": "tutti-agent", "cwd": "/tmp/a\0b"}
    )
    assert status == 400, body
    assert body["reason"] == "invalid_argument" and body["params"]["field"] == "cwd"
    assert c.call("session.list", {"workspaceId": WS})["sessions"] == []
