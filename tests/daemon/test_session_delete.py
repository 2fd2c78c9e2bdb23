"""`session.delete` removes the Session's runtime dir, `runtimes/<workspace>/<session>/` (the
provider's full transcript), through the real `agenthost serve`: at once,
for a fork source too (its committed child keeps working from its own home, after a restart),
and crash-safely (a daemon SIGKILLed between the commit and the removal finishes it at its
next start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, wait_for
from tests.support.homes import rollouts, runtime_home
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)


def session_dir(home: Path, sid: str) -> Path:
    return home / "runtimes" / WS / sid


def delete(c: Client, sid: str) -> None:
    reply = c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    assert reply == {"deleted": True}


def trash(home: Path) -> list[Path]:
    path = home / "runtimes" / ".trash"
    return list(path.iterdir()) if path.exists() else []


def test_delete_removes_the_sessions_runtime_dir(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    keep = create_session(c)["agentSessionId"]
    run_turn(c, sid, "a private transcript")
    run_turn(c, keep, "stays")
    assert rollouts(runtime_home(daemon.home, WS, sid))
    delete(c, sid)
    wait_for(lambda: not session_dir(daemon.home, sid).exists() and not trash(daemon.home))
    # Only that Session's: the other one keeps its home and runs on.
    assert rollouts(runtime_home(daemon.home, WS, keep))
    assert run_turn(c, keep, "again")["outcome"] == "completed"
    with pytest.raises(ApiError) as err:
        c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
    assert err.value.status == 404


def test_a_fork_source_is_removed_and_its_child_resumes_from_its_own_home(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid, turns = three_turn_source(c)
        _, op = fork(c, sid, turns[1]["turnId"])
        op = until_terminal(c, op)
        assert op["status"] == "committed"
        c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
        child = op["targetAgentSessionId"]
        delete(c, sid)
        wait_for(lambda: not session_dir(home, sid).exists())
    finally:
        d.stop()
    # A fresh daemon and app-server: the child can only read what its own home holds.
    d = DaemonProcess(home).start()
    try:
        turn = run_turn(d.client(), child, "/history")
    finally:
        d.stop()
    assert turn["outcome"] == "completed"
    assert turn["messages"][-1]["text"] == "history: first | second | /history"


def test_a_delete_killed_before_the_removal_finishes_at_the_next_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "a private transcript")
    c.call("debug.failpoints", {"points": {"host.session.delete.after_commit": "kill"}})
    c.submit("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    assert d.wait_exit(30) == -9  # SIGKILLed after the commit, before the removal
    d.kill()
    assert session_dir(home, sid).exists()
    d2 = DaemonProcess(home).start()
    try:
        assert not session_dir(home, sid).exists() and not trash(home)
        c2 = d2.client()
        with pytest.raises(ApiError) as err:
            c2.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
        assert err.value.status == 404
    finally:
        d2.stop()


def test_a_trash_that_is_not_a_directory_keeps_the_dir_and_the_daemon_serving(
    tmp_path: Path,
) -> None:
    """A file where `runtimes/.trash` goes: the delete still answers, the Session's dir is
    left whole (logged), the next start does not fail on it, and once the file is gone a
    start removes the dir."""
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "a private transcript")
        blocker = home / "runtimes" / ".trash"
        if blocker.is_dir():
            blocker.rmdir()
        blocker.write_text("not a directory\n")
        delete(c, sid)
        wait_for(lambda: "cannot move" in d.log_path.read_text(errors="replace"))
        assert session_dir(home, sid).exists()
        assert run_turn(c, create_session(c)["agentSessionId"], "still")["outcome"] == "completed"
    finally:
        d.stop()
    d = DaemonProcess(home).start()  # the start-up sweep meets the same file
    try:
        assert session_dir(home, sid).exists() and blocker.is_file()
        listed = d.client().call("session.list", {"workspaceId": WS})["sessions"]
        assert sid not in [s["agentSessionId"] for s in listed]
    finally:
        d.stop()
    blocker.unlink()
    d = DaemonProcess(home).start()
    try:
        assert not session_dir(home, sid).exists() and not trash(home)
    finally:
        d.stop()
