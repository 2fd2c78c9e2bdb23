"""A Claude Session's stop ends its CLIs within the driver's own bound, well inside the host's:
`session.stop` answers only once the CLI started ahead for the Session's next Turn
(`drivers.claude.warm`) and its running Turn's CLI have ended, killed when they ignore their
close and their SIGTERM (SIGSTOPped by the tests: neither reaches them); and a delete of such a
Session is answered at once, its folder goes only once no process of its CLI is left, and stays
gone."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from domain.procfs import alive_in_stat, read_proc_stat
from tests.claude.conftest import SLOW_PREFIX, ClaudeSession, Harness
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, wait_for
from tests.support.homes import processes_naming
from tests.support.invariants import assert_invariants

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]


def _running_cli(pid: int) -> bool:
    """`pid` runs the CLI itself (past the wrapper script's `sh` and `setpriv`)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return os.path.basename(argv0) not in (b"sh", b"setpriv", b"")


def _alive(pid: int) -> bool:
    """Neither gone nor a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _may_run_on(pid: int) -> bool:
    """Neither gone nor ending: a process SIGKILLed (the signal pending, or exiting while the
    kernel tears its memory down, which takes a while under load) runs none of its code
    again. The deleted folder's law counts processes so (`domain.procfs.alive_in_stat`)."""
    try:
        return alive_in_stat(read_proc_stat(pid))
    except OSError:
        return False


def _alive_after_stop(h: Harness, session: ClaudeSession, pid: int) -> list[int]:
    """`pid`'s process tree SIGSTOPped, then the Session stopped through the driver: the pids
    of that tree still alive when the stop returned (the rest let go again)."""
    stopped = _tree_stopped(pid)
    try:
        h.driver.stop_session({"agentSessionId": session.agent_session_id})
        return [p for p in stopped if _alive(p)]
    finally:
        for victim in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)


def test_a_delete_ends_a_parked_cli_that_ignores_its_close_before_the_folder_goes(
    claude_host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    d = claude_host_daemon
    c = d.client(timeout=60)
    sid = create_session(c, provider="claude-code", cwd=str(tmp_path / "cwd"))["agentSessionId"]
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    named = f"{sid}/claude-config"
    # The CLI started ahead for the next Turn, running; it then stops answering anything.
    cli = wait_for(lambda: [p for p in processes_naming(named) if _running_cli(p)], 30)
    stopped = processes_naming(named)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    folder = d.home / "runtimes" / WS / sid
    try:
        began = time.monotonic()
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
        answered_s = time.monotonic() - began
        wait_for(lambda: not folder.exists(), 60, interval=0.01)
        left = [p for p in stopped if _alive(p)]
        gone_s = time.monotonic() - began
    finally:
        for pid in stopped:  # what is left runs on (and would write, if it were able)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    print(f"cli {cli}: delete answered {answered_s:.2f} s, folder gone {gone_s:.2f} s")
    # The folder went once the stop was answered, which it is only once the CLI has ended:
    # the removal found nothing of it left to kill.
    assert not left, f"the CLI {left} of the deleted Session outlived its folder"
    assert "killed what still ran" not in d.tail_log(100_000), d.tail_log()
    wait_for(lambda: not [p for p in processes_naming(named) if _alive(p)], 30)
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))
    d.stop()
    assert_invariants(d.home)


def _tree_stopped(pid: int) -> list[int]:
    """SIGSTOPs `pid` and every process below it; their pids."""
    import psutil

    victims = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGSTOP)
    return victims


def test_a_stop_answers_once_its_parked_cli_that_ignores_its_close_is_killed(
    harness: Harness,
) -> None:
    h = harness
    session = h.start("parked-stopped")
    assert h.turn(session, "one")[1]["outcome"] == "completed"
    cli = wait_for(lambda: h.driver.turns.warm.parked(session.agent_session_id), 30)
    pid = wait_for(lambda: getattr(cli.transport._process, "pid", None), 30)
    wait_for(lambda: _running_cli(pid), 30)
    left = _alive_after_stop(h, session, pid)
    assert not left, f"the parked CLI {left} outlived its Session's stop"


def test_a_stop_answers_once_its_turns_cli_that_ignores_its_sigterm_is_killed(
    harness: Harness, gate: threading.Event
) -> None:
    h = harness
    session = h.start("turn-stopped")
    turn_id = f"turn-{uuid.uuid4()}"
    h.driver.start_turn(
        {
            "agentSessionId": session.agent_session_id,
            "turnId": turn_id,
            "text": f"{SLOW_PREFIX}a reply the model holds",
        },
        h.recorder,
    )
    active = h.driver._session(session.agent_session_id).active
    assert active is not None
    pid = wait_for(lambda: getattr(active.transport._process, "pid", None), 30)
    left = _alive_after_stop(h, session, pid)
    assert not left, f"the Turn's CLI {left} outlived its Session's stop"
    assert h.recorder.wait_completed(turn_id)["outcome"] == "interrupted"


def test_a_delete_whose_stop_the_worker_never_answers_kills_the_cli_before_the_folder_goes(
    claude_host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The worker takes the stop but never answers it (`worker.session.before_stop` hangs):
    past the host's bound the folder goes all the same, and what ran in it goes first."""
    d = claude_host_daemon
    c = d.client(timeout=60)
    sid = create_session(c, provider="claude-code", cwd=str(tmp_path / "cwd"))["agentSessionId"]
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    named = f"{sid}/claude-config"
    cli = wait_for(lambda: [p for p in processes_naming(named) if _running_cli(p)], 30)
    folder = d.home / "runtimes" / WS / sid
    c.call("debug.failpoints", {"points": {"worker.session.before_stop": "hang"}})
    try:
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
        wait_for(lambda: not folder.exists(), 60, interval=0.01)
        left = [p for p in cli if _may_run_on(p)]
    finally:
        c.call("debug.failpoints", {"points": {"worker.session.before_stop": "off"}})
    assert not left, f"the CLI {left} of the deleted Session outlived its folder"
    # Logged before the folder goes, but written by the daemon's log thread: looked for until
    # it is in the file.
    said = "killed what still ran in its runtime folder after its stop (not answered"
    with contextlib.suppress(AssertionError):
        wait_for(lambda: said in d.tail_log(100_000), 10)
    assert said in d.tail_log(100_000), d.tail_log()
    wait_for(lambda: not [p for p in processes_naming(named) if _alive(p)], 30)
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))
    d.stop()
    assert_invariants(d.home)


def test_a_worker_killed_as_it_takes_a_deletes_stop_leaves_no_cli_and_no_folder(
    claude_host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """`worker.session.before_stop` armed `kill`: the stop is sent again to the next worker,
    the CLI died with its worker, and the folder goes."""
    d = claude_host_daemon
    c = d.client(timeout=60)
    sid = create_session(c, provider="claude-code", cwd=str(tmp_path / "cwd"))["agentSessionId"]
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    named = f"{sid}/claude-config"
    wait_for(lambda: [p for p in processes_naming(named) if _running_cli(p)], 30)
    folder = d.home / "runtimes" / WS / sid
    c.call("debug.failpoints", {"points": {"worker.session.before_stop": "once:kill"}})
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    wait_for(lambda: not folder.exists(), 60)
    wait_for(lambda: not [p for p in processes_naming(named) if _alive(p)], 30)
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))
    d.stop()
    assert_invariants(d.home)


KILLED_WITHIN_S = 1.5
"""The bound on a stopped parked CLI's end once its Session's stop began: below the close's
first wait for its exit (`EXIT_WAIT_S`, 2 s), far above a SIGKILL on a loaded host."""


def test_a_stop_kills_a_parked_cli_seen_stopped_without_waiting_for_its_exit(
    harness: Harness,
) -> None:
    """A stopped CLI reads no end of input and handles no SIGTERM: the close kills it as soon
    as it sees it stopped, not after waiting for an exit it cannot make."""
    h = harness
    session = h.start("parked-stopped-at-once")
    assert h.turn(session, "one")[1]["outcome"] == "completed"
    cli = wait_for(lambda: h.driver.turns.warm.parked(session.agent_session_id), 30)
    pid = wait_for(lambda: getattr(cli.transport._process, "pid", None), 30)
    wait_for(lambda: _running_cli(pid), 30)
    stopped = _tree_stopped(pid)
    stopping = threading.Thread(
        target=h.driver.stop_session,
        args=({"agentSessionId": session.agent_session_id},),
        daemon=True,
    )
    try:
        stopping.start()
        wait_for(lambda: not _may_run_on(pid), KILLED_WITHIN_S, interval=0.01)
    finally:
        for victim in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
        stopping.join(15)
    assert not stopping.is_alive()
