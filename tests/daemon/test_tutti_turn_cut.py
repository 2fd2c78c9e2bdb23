"""A Tutti Agent Session's rollout cut back by hand to before its last bound, completed Turn
(every line left whole, so nothing reads it as torn) while its app-server runs: the next Turn
fails `provider_history_missing` naming that Turn, before the app-server gets it (which holds
the conversation in memory and would run on past the cut), live and after a restart; a fork
through that Turn is refused before `thread/fork`, no child made; the rollout put back, the
next Turn completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codex.test_codex_rollout_damage import cut_last_turn, fork_refused
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from tests.support.homes import child_rollouts, rollouts, runtime_home

pytestmark = pytest.mark.timeout(180)


def test_a_turn_after_the_last_bound_turn_was_cut_from_the_rollout_fails_typed(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turns = [run_turn(c, sid, text) for text in ("one", "two")]
        assert [t["outcome"] for t in turns] == ["completed"] * 2, turns
        home = runtime_home(d.home, WS, sid)
        (rollout,) = rollouts(home)
        whole = rollout.read_bytes()
        last = cut_last_turn(rollout)
        cut = rollout.read_bytes()

        third = run_turn(c, sid, "three")
        assert third["outcome"] == "failed", third
        assert third["errorReason"] == "provider_history_missing", third
        assert last in third["error"], third
        assert third["hostOnly"] is True, third  # nothing recorded as run at the provider
        assert rollout.read_bytes() == cut  # nothing appended past the cut

        assert last in fork_refused(d, c, sid, turns[1]["turnId"], "tutti-agent-home")
        assert child_rollouts(home) == []
    finally:
        d.stop()
    d.start()
    try:
        c = d.client()
        fourth = run_turn(c, sid, "four")
        assert fourth["outcome"] == "failed", fourth
        assert fourth["errorReason"] == "provider_history_missing", fourth
        assert last in fourth["error"], fourth
        assert rollout.read_bytes() == cut
        rollout.write_bytes(whole)  # put back
        fifth = run_turn(c, sid, "five")
        assert fifth["outcome"] == "completed", fifth
    finally:
        d.stop()
