"""A Claude Session's provider session id is chosen once by the worker that first starts it:
a later `session.start` naming no id (a second preparation sent before the host recorded the
first's answer) answers that same id, so the id the host records is always the one whose
transcript holds the Session's Turns."""

from __future__ import annotations

import threading

import pytest

from drivers.claude_transcript import parse_entries
from tests.claude.conftest import ClaudeSession, Harness

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
