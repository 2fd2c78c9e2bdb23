"""Re-binding a lost provider binding for claude-code, through the real daemon, the real Claude
worker (SDK + bundled CLI) and the local MessagesServer: a settled completed Turn whose
provider binding the host lost (the row written as a dropped `turn.started`/`turn.binding`
write leaves it) is re-bound from the Session's own transcript at the next runtime
preparation — its root user-message UUID and its checkpoint — so a fork through it commits;
when two lost Turns with the same text could each be either provider turn, nothing is
guessed and the fork is refused `provider_turn_missing`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from model_fakes.messages import MessagesServer, model_input_texts
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.daemon.test_rebind import _fork, _unbind
from tests.support.daemon import DaemonProcess, create_session, run_turn, timeline
from tests.support.invariants import assert_invariants

pytestmark = [pytest.mark.claude, pytest.mark.timeout(240)]


@pytest.fixture
def server() -> Iterator[MessagesServer]:
    with MessagesServer() as s:
        yield s


def _claude_home(tmp_path: Path, server: MessagesServer) -> tuple[Path, Path]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(
        f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return home, cwd


def _source(home: Path, cwd: Path, texts: tuple[str, ...]) -> tuple[str, list[dict]]:
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c, provider="claude-code", title="claude", cwd=str(cwd))[
            "agentSessionId"
        ]
        turns = [run_turn(c, sid, text) for text in texts]
        assert [t["outcome"] for t in turns] == ["completed"] * len(texts), turns
        assert all(t["providerForkBindingState"] == "bound" for t in turns), turns
    finally:
        d.stop()
    return sid, turns


def test_claude_lost_binding_is_rebound_from_the_transcript_and_a_fork_through_it_commits(
    tmp_path: Path, server: MessagesServer
) -> None:
    home, cwd = _claude_home(tmp_path, server)
    sid, turns = _source(home, cwd, ("one", "two", "three"))
    lost = turns[1]
    _unbind(home, [lost["turnId"]])
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        before = {t["turnId"]: t for t in timeline(c, sid)}[lost["turnId"]]
        assert before["rootProviderTurnId"] is None
        assert before["providerForkBindingState"] == "unavailable"
        # fork.create prepares the runtime first: that preparation re-binds the Turn.
        _, op = fork(c, sid, lost["turnId"])
        op = until_terminal(c, op)
        assert op["status"] == "committed", op
        rebound = {t["turnId"]: t for t in timeline(c, sid)}[lost["turnId"]]
        assert rebound["rootProviderTurnId"] == lost["rootProviderTurnId"]
        assert rebound["providerForkBindingState"] == "bound"
        child = op["session"]["agentSessionId"]
        assert len(timeline(c, child)) == 2
        n = len(server.requests)
        assert run_turn(c, child, "four")["outcome"] == "completed"
        assert model_input_texts(server.requests[n]) == [
            ("user", "one"),
            ("assistant", "echo: one"),
            ("user", "two"),
            ("assistant", "echo: two"),
            ("user", "four"),
        ]
    finally:
        d.stop()
    assert_invariants(home)


def test_claude_ambiguous_lost_bindings_fail_closed(tmp_path: Path, server: MessagesServer) -> None:
    home, cwd = _claude_home(tmp_path, server)
    sid, turns = _source(home, cwd, ("same", "same", "other"))
    # Both "same" Turns lost their binding: two provider turns with the same text sit between
    # the same anchors, and either could be either — nothing may be guessed.
    _unbind(home, [turns[0]["turnId"], turns[1]["turnId"]])
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        status, body = _fork(c, sid, turns[2]["turnId"])
        assert status == 409, body
        assert body["params"]["forkBoundaryReason"] == "provider_turn_missing"
        status, body = _fork(c, sid, turns[0]["turnId"])
        assert status == 409, body
        assert body["params"]["forkBoundaryReason"] == "provider_turn_missing"
        after = timeline(c, sid)
        assert [t["rootProviderTurnId"] for t in after[:2]] == [None, None]
        assert after[2]["rootProviderTurnId"] == turns[2]["rootProviderTurnId"]
    finally:
        d.stop()
    # The history was read and judged ambiguous (not unreadable): each lost Turn is named.
    log = (home / "daemon.log").read_text(errors="replace")
    assert "re-bind from provider history failed" not in log
    for turn in turns[:2]:
        assert f"turn {turn['turnId']} has no provider binding and none can be proven" in log
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        # Refused before any operation: nothing prepared, nothing dispatched.
        assert conn.execute("SELECT count(*) FROM fork_operations").fetchone() == (0,)
    finally:
        conn.close()
