"""A Claude Session's provider session id is chosen once by the worker that first starts it:
a later `session.start` naming no id (a second preparation sent before the host recorded the
first's answer) answers that same id, so the id the host records is always the one whose
transcript holds the Session's Turns."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest

from drivers.claude_transcript import parse_entries
from tests.claude.conftest import ClaudeSession, Harness
from tests.reliability.reliability_harness import fork_latest_params, host_fired, worker_fired
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, settle, wait_for
from transport.client import ApiError

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]


def test_a_start_naming_no_id_of_a_held_session_answers_the_id_its_turns_are_in(
    harness: Harness,
) -> None:
    first = harness.start("again")
    assert harness.start("again").provider_session_id == first.provider_session_id
    harness.turn(first, "one")
    # Started once more naming no id, after a Turn: the id the host would record now is the
    # one whose transcript holds that Turn, and the next Turn resumes it.
    second = harness.start("again")
    assert second.provider_session_id == first.provider_session_id
    assert second.start_result["runtimeContext"]["resumeCursor"] == {
        "resume": first.provider_session_id
    }
    harness.turn(second, "two")
    files = sorted(f.stem for f in harness.transcript(first).parent.glob("*.jsonl"))
    assert files == [first.provider_session_id]
    roots = [e for e in parse_entries(harness.transcript(first).read_text()) if e.is_root_user]
    assert [r.uuid for r in roots] == [t for t, _ in first.turns + second.turns]


def test_concurrent_starts_naming_no_id_all_answer_one_id(harness: Harness) -> None:
    barrier = threading.Barrier(6)
    answers: list[ClaudeSession] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            barrier.wait(timeout=10)
            answers.append(harness.start("racing"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    ids = {a.provider_session_id for a in answers}
    assert len(answers) == 6 and len(ids) == 1, ids
    # The Turn runs on whichever state the worker holds now: its transcript is that one id's.
    session = answers[0]
    harness.turn(session, "one")
    files = [f.stem for f in harness.transcript(session).parent.glob("*.jsonl")]
    assert files == [session.provider_session_id]


def test_a_fork_prepared_beside_a_new_sessions_first_turn_leaves_it_its_turns_id(
    claude_host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A new Session's fork (`latestSettled`) and its first Turn both prepare its runtime
    naming no provider session id: the fork's answer held back in the worker (after its start
    put the Session in place) until the Turn's start answered and the Turn ran. The id the
    store records is the one whose transcript holds the Turn."""
    d = claude_host_daemon
    c = d.client(timeout=60)
    sid = create_session(c, provider="claude-code", cwd=str(tmp_path / "cwd"))["agentSessionId"]
    forking = _fork_held_at_its_start(d, sid, "once:sleep:3000")
    turn = run_turn(c, sid, "first")
    forking.join(timeout=60)
    assert turn["outcome"] == "completed", turn
    recorded = _recorded_id(d, sid)
    transcripts = d.home.glob(f"runtimes/{WS}/{sid}/claude-config/projects/*/*.jsonl")
    assert [p.stem for p in transcripts] == [recorded]


def _fork_held_at_its_start(d: DaemonProcess, sid: str, action: str) -> threading.Thread:
    """A fork (`latestSettled`) of the new Session `sid`, sent on its own thread once
    `worker.session.after_start` is armed with `action`; returned when its runtime's
    preparation reached that point. The fork is refused (no Turn settled when its runtime is
    prepared, or the Turn's claim) or forked through the Turn: either way after its runtime's
    preparation answered."""
    d.client().call("debug.failpoints", {"points": {"worker.session.after_start": action}})

    def fork() -> None:
        with contextlib.suppress(ApiError):
            d.client(timeout=60).call("fork.create", fork_latest_params(sid))

    forking = threading.Thread(target=fork)
    forking.start()
    wait_for(lambda: worker_fired(d, "worker.session.after_start"), 30)
    return forking


def _recorded_id(d: DaemonProcess, sid: str) -> str | None:
    with contextlib.closing(sqlite3.connect(d.home / "store.sqlite3")) as db:
        (recorded,) = db.execute(
            "SELECT provider_session_id FROM sessions WHERE session_id = ?", (sid,)
        ).fetchone()
    return str(recorded) if recorded else None


def _claude_worker_pid(d: DaemonProcess) -> int:
    workers = d.client().call("host.status", {})["workers"]
    return int(next(w["pid"] for w in workers if w["provider"] == "claude-code"))


def _start_read_before_the_id_was_recorded(
    d: DaemonProcess, cwd: Path
) -> tuple[str, str | None, str | None]:
    """A new Session's fork prepares its runtime (its answer held in the worker); a Turn's
    submit reads the Session row (no id yet) and is held before its claim; the fork's answer
    goes to the host (`ordered` below checks it was recorded first), then the Turn's
    `session.start` is held in the worker, which is killed: the start goes to the next worker.
    (sid, the id recorded when the Turn's start reached the first worker, the id at the end)."""
    c = d.client(timeout=60)
    sid = create_session(c, provider="claude-code", cwd=str(cwd))["agentSessionId"]
    arm = lambda points: c.call("debug.failpoints", {"points": points})  # noqa: E731
    forking = _fork_held_at_its_start(d, sid, "once:hang")
    arm({"host.turn.before_claim": "once:hang"})
    submitted = d.client(timeout=60).submit(
        "turn.submit",
        {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "input": [{"type": "text", "text": "first"}],
        },
    )
    wait_for(lambda: host_fired(d, "host.turn.before_claim"), 30)
    # The fork's start answers (the Turn's row is read already); the next start is held.
    arm({"worker.session.after_start": "once:hang"})
    time.sleep(2.0)  # the fork's answer reaches the host before the submit goes on
    arm({"host.turn.before_claim": "off"})
    wait_for(lambda: worker_fired(d, "worker.session.after_start"), 30)
    first = _recorded_id(d, sid)
    os.kill(_claude_worker_pid(d), signal.SIGKILL)
    arm({"worker.session.after_start": "off"})
    turn = settle(c, sid, submitted.result(timeout=60).result()["turn"]["turnId"])
    forking.join(timeout=60)
    assert turn["outcome"] == "completed", turn
    return sid, first, _recorded_id(d, sid)


def test_a_start_read_before_the_sessions_id_was_recorded_names_it_to_a_new_worker(
    claude_host_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A Turn's preparation whose Session row was read before a fork's preparation recorded
    the new Session's provider session id, sent after that answer (to a worker that was
    then replaced), names the recorded id: the next worker resumes it instead of drawing a
    second one."""
    d = claude_host_daemon
    for attempt in range(3):
        cwd = tmp_path / f"cwd{attempt}"
        cwd.mkdir()
        sid, first, last = _start_read_before_the_id_was_recorded(d, cwd)
        if first is not None:
            break  # the fork's answer was recorded before the Turn's start was sent
    else:
        pytest.fail("the fork's answer never reached the host before the Turn's start")
    assert last == first
    transcripts = d.home.glob(f"runtimes/{WS}/{sid}/claude-config/projects/*/*.jsonl")
    assert [p.stem for p in transcripts] == [first]
