"""A Tutti Agent thread whose history could not be loaded when its app-server started (the
lean resume answered from the rollout's head, the deferred load failed): once the rollout reads
again, the Session's next Turn runs — the failure is not kept to answer every later Turn while
that app-server lives (the host never resumes a live runtime's thread again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from tests.support.homes import rollouts, runtime_home

pytestmark = pytest.mark.timeout(120)


def test_a_thread_whose_load_failed_runs_its_next_turn_once_its_rollout_reads_again(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "one")["outcome"] == "completed"
        assert run_turn(c, sid, "two")["outcome"] == "completed"
    finally:
        d.stop()
    [path] = rollouts(runtime_home(home, WS, sid))
    whole = path.read_bytes()
    lines = whole.split(b"\n")
    lines[-3] = b"{not json"  # a line in the middle no reader takes
    path.write_bytes(b"\n".join(lines))
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        broken = run_turn(c, sid, "three")
        assert broken["outcome"] == "failed"
        assert "corrupt rollout line" in broken["error"]
        path.write_bytes(whole)  # the rollout reads again
        again = run_turn(c, sid, "four")
        assert again["outcome"] == "completed", again["error"]
        assert again["messages"][-1]["text"] == "echo: four"
    finally:
        d.stop()
