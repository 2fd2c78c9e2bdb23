"""`bench/fork_hops.py` stamps one warm fork end to end through a real daemon and its real
worker (tutti-agent), on one clock: the worker's points are there, in the order of the path
(figures not asserted: timings of a loaded machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_fork_hops_places_the_workers_stamps_between_the_daemons(tmp_path: Path) -> None:
    out_json = tmp_path / "hops.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "fork_hops.py"),
            "--forks",
            "10",
            "--turns",
            "2",
            "--json",
            str(out_json),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out_json.read_text())
    offsets = result["offsetsP50Ms"]
    path = [
        "sup.send",
        "w.recv",
        "w.fork",
        "w.answered",
        "w.bind",
        "w.proof",
        "w.send",
        "sup.complete",
        "commit.begin",
        "loop.send_reply",
    ]
    missing = [p for p in path if p not in offsets]
    assert not missing, (missing, sorted(offsets))
    assert [offsets[p] for p in path] == sorted(offsets[p] for p in path)
    assert result["bareP50Ms"] > 0 and result["hostP50Ms"] > offsets["loop.send_reply"]


def test_a_worker_stamp_before_the_forks_own_send_is_not_taken_for_the_forks() -> None:
    """A message sent before a fork's window (a previous fork's) can be received inside it
    on a loaded machine; the fork's `w.recv` is the one after its own `sup.send`."""
    sys.path.insert(0, str(REPO))
    from bench.fork_hops import _split

    stamps = [
        ("workers.fork", 1.0),
        ("w.recv", 1.5),  # a previous fork's message, received late
        ("sup.send", 2.0),
        ("w.recv", 2.5),
        ("w.fork", 2.6),
        ("w.send", 4.0),
        ("sup.complete", 4.5),
    ]
    out = _split("tutti-agent", [(0.0, 5.0)], stamps, [1.0], 1.0)
    offsets = out["offsetsP50Ms"]
    assert offsets["w.recv"] == 2.5 and offsets["sup.send"] == 2.0, offsets
    assert list(offsets) == [
        "workers.fork",
        "sup.send",
        "w.recv",
        "w.fork",
        "w.send",
        "sup.complete",
    ]


def test_a_completion_before_the_forks_answer_is_not_taken_for_the_forks() -> None:
    """Another request's answer completed inside a fork's window (a previous fork's follow-up,
    late on a loaded machine) is not the fork's: its `sup.complete` is the one after its own
    `w.send` (taken first, it put `sup.complete` before `w.send` and failed the path's order)."""
    sys.path.insert(0, str(REPO))
    from bench.fork_hops import _split

    stamps = [
        ("sup.send", 2.0),
        ("w.recv", 2.5),
        ("sup.complete", 3.0),  # another request's answer
        ("w.send", 4.0),
        ("sup.complete", 4.5),
    ]
    out = _split("tutti-agent", [(0.0, 5.0)], stamps, [1.0], 1.0)
    offsets = out["offsetsP50Ms"]
    assert offsets["sup.complete"] == 4.5, offsets
    assert list(offsets) == ["sup.send", "w.recv", "w.send", "sup.complete"]


def test_the_reply_leg_counts_an_events_batch_begun_before_the_reply_s_send() -> None:
    """The reply's leg is the loop's send less the responder's answer, per fork; a fork whose
    events thread began its batch before that send is counted, one that began after is not."""
    sys.path.insert(0, str(REPO))
    from bench.fork_hops import _split

    stamps = [
        ("responder.result", 1.0),
        ("loop.drain", 1.1),
        ("events.batch", 1.2),
        ("loop.send_reply", 1.3),
        ("responder.result", 11.0),
        ("loop.drain", 11.05),
        ("loop.send_reply", 11.1),
        ("events.batch", 11.4),
    ]
    out = _split("tutti-agent", [(0.0, 5.0), (10.0, 15.0)], stamps, [1.0], 1.0)
    assert out["replyLegs"] == 2 and out["eventsBeforeReply"] == 1
    assert out["replyLegP50Ms"] == pytest.approx(0.2)
    assert out["loopDrainsPerFork"] == 1.0


@pytest.mark.claude
@pytest.mark.timeout(300)
def test_claude_fork_steps_times_both_sides() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.claude_fork_steps", "--forks", "3", "--turns", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "steps p50" in out.stdout and "fork p50" in out.stdout, out.stdout
    assert "move, waited" in out.stdout and "verify" in out.stdout, out.stdout
