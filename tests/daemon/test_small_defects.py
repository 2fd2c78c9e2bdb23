"""Small strictness rules, through the real daemon: a `session.list` cursor is parsed strictly
(ASCII digits inside int64: a 400, never a 500, and never `١٢٣` or `1_000`); deleting a
Session mid-turn is refused with 409 until the Turn is interrupted; a subscriber of workspace
`team` never receives `team-secret`'s events; workspace ids map injectively onto runtimes/."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from actors.context import _path_segment
from agenthost.catalog import Catalog
from tests.support.daemon import DaemonProcess, create_session, settle, submit
from transport.client import EventSubscriber


@pytest.mark.parametrize(
    "cursor",
    [
        "99999999999999999999999:00000000-0000-0000-0000-000000000000",
        "١٢٣:00000000-0000-0000-0000-000000000000",
        "1_000:00000000-0000-0000-0000-000000000000",
        "-5:x",
        "no-colon",
    ],
)
def test_session_list_bad_cursor_is_400(daemon: DaemonProcess, cursor: str) -> None:
    c = daemon.client()
    status, body = c.call_raw("session.list", {"workspaceId": "w", "cursor": cursor})
    assert status == 400, body
    assert body["reason"] == "invalid_argument" and body["params"]["field"] == "cursor"
    assert c.call("session.list", {"workspaceId": "w"})["sessions"] == []


def test_delete_mid_turn_is_refused_until_interrupted(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/slow 20000 long")
    status, body = c.call_raw("session.delete", {"workspaceId": "ws-test", "agentSessionId": sid})
    assert status == 409 and body["reason"] == "agent_session_busy", body
    c.call(
        "turn.interrupt",
        {"workspaceId": "ws-test", "agentSessionId": sid, "turnId": turn["turnId"]},
    )
    assert settle(c, sid, turn["turnId"])["outcome"] == "interrupted"
    assert c.call("session.delete", {"workspaceId": "ws-test", "agentSessionId": sid})["deleted"]


def test_workspace_topic_is_not_a_prefix_of_another(daemon: DaemonProcess) -> None:
    c = daemon.client()
    team = EventSubscriber(daemon.events, ("team",))
    secret = EventSubscriber(daemon.events, ("team-secret",))
    try:
        time.sleep(0.5)  # ZeroMQ's slow joiner: let the subscriptions reach the PUB side
        create_session(c, ws="team-secret")
        got = secret.next_message(10)
        assert got is not None and got[0] == "team-secret"
        assert team.next_message(1.0) is None
    finally:
        team.close()
        secret.close()


def test_workspace_to_runtimes_dir_is_injective() -> None:
    hashed = "ws-" + hashlib.sha256(b"team secret").hexdigest()[:24]
    assert _path_segment("team secret") != _path_segment(hashed)
    assert _path_segment("team") == "team"
    assert _path_segment("ws-test") == "ws-test"
    assert Path(_path_segment("../x")).name == _path_segment("../x")


def test_turn_left_active_by_a_deleted_session_is_settled_at_start(tmp_path: Path) -> None:
    """What an older daemon left behind when a Session was deleted mid-turn: recovery settles
    the Turn instead of logging a traceback at every start and leaving it active forever."""
    import apsw

    from tests.support.daemon import DaemonProcess as Daemon

    home = tmp_path / "home"
    d = Daemon(home).start()
    c = d.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/slow 20000 long")
    d.kill()
    conn = apsw.Connection(str(home / "store.sqlite3"))
    conn.execute("UPDATE sessions SET deleted = 1 WHERE session_id = ?", (sid,))
    conn.close()
    for _ in range(2):
        d = Daemon(home).start()
        d.stop()
    conn = apsw.Connection(str(home / "store.sqlite3"))
    phase = conn.execute("SELECT phase FROM turns WHERE turn_id = ?", (turn["turnId"],)).fetchone()
    conn.close()
    assert phase == ("settled",)
    assert "could not settle orphaned turn" not in d.tail_log(100_000)


def test_runtime_home_is_one_join_of_a_remembered_segment() -> None:
    """`runtime_home` (every fork's dispatch asks it): the path the three `/` gave, built by one
    join, from a workspace segment worked out once per workspace id."""
    from actors.context import HostContext

    ctx = HostContext.__new__(HostContext)
    object.__setattr__(ctx, "runtimes_dir", Path("/h/runtimes"))
    object.__setattr__(ctx, "catalog", Catalog())
    object.__setattr__(ctx, "_spread", set())
    _path_segment.cache_clear()
    for ws in ("ws-test", "team secret", "../x", "ws-" + "a" * 24):
        for provider in ("tutti-agent", "codex", "claude-code"):
            home = Catalog().driver_info(provider).home_dir_name
            assert ctx.runtime_home(ws, "s-1", provider) == (
                Path("/h/runtimes") / _path_segment(ws) / "s-1" / home
            )
    info = _path_segment.cache_info()
    assert info.misses == 4 and info.hits > 0
