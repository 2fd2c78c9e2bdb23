"""`bench.mutation_tail`: the tail of phase A's mutations attributed to the suspects stamped
beside them — a suspect that overlaps only the slowest requests takes their excess over p50,
one that overlaps every request alike takes none."""

from __future__ import annotations

from typing import Any

from bench.mutation_tail import _union_overlap, attribute, store_waits


def _requests() -> list[dict[str, Any]]:
    """100 renames 10 ms long, one after another, and 2 of them 40 ms (the slowest 2 %)."""
    out: list[dict[str, Any]] = []
    t = 0.0
    for i in range(100):
        ms = 40.0 if i in (30, 70) else 10.0
        out.append({"kind": "session.updateTitle", "t0": t, "t1": t + ms, "status": 200})
        t += ms + 1.0
    return out


def _row(
    kind: str, t0: float, ms: float, detail: Any = "", proc: str = "daemon:1"
) -> dict[str, Any]:
    return {"kind": kind, "t0": t0, "t1": t0 + ms, "ms": ms, "detail": detail, "proc": proc}


def test_a_pause_over_the_slowest_requests_alone_takes_their_excess() -> None:
    requests = _requests()
    slow = [r for r in requests if r["t1"] - r["t0"] > 20]
    rows = [_row("gc", r["t0"] + 5.0, 30.0, "gen2 0") for r in slow]
    # A COMMIT inside every request, 2 ms each: as much beside the typical as the slowest.
    rows += [_row("commit", r["t0"] + 1.0, 2.0, 3) for r in requests]
    got = attribute(requests, rows, tail=0.02)
    by_cause = {row["cause"]: row for row in got["table"]}
    assert got["tailN"] == 2
    assert got["excessMs"] == 30.0
    assert by_cause["gc gen2 (daemon)"]["share"] == 1.0
    assert by_cause["gc gen2 (daemon)"]["tailHit"] == 2
    assert by_cause["group COMMIT"]["share"] == 0.0


def test_the_daemons_late_wake_up_is_split_into_its_run_queue_and_gil_parts() -> None:
    requests = _requests()
    slow = [r for r in requests if r["t1"] - r["t0"] > 20]
    # 30 ms late, 20 of them on a run queue (no CPU), 10 waiting for the interpreter.
    rows = [_row("lag", r["t0"] + 5.0, 30.0, 20.0) for r in slow]
    by_cause = {row["cause"]: row for row in attribute(requests, rows)["table"]}
    assert round(by_cause["lag: no CPU"]["tailMs"], 6) == 20.0
    assert round(by_cause["lag: GIL"]["tailMs"], 6) == 10.0


def test_overlapping_stamps_of_one_kind_count_once() -> None:
    assert _union_overlap([(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)], 2.0, 25.0) == 18.0
    assert _union_overlap([(0.0, 1.0)], 2.0, 25.0) == 0.0


def test_a_mutations_write_counts_the_fork_bodies_it_ran_behind_and_the_commits_it_waited() -> None:
    """Phase B's store queue from the callers' side: a rename's write that waited while a fork's
    commit body ran before its own body counts that body (and its ms) and the two COMMITs
    that ended inside it; a write after it with nothing before its body counts none."""
    fork = "ForkCommit.commit_fork.<locals>.<lambda>"
    rename = "SessionStore.update_title.<locals>.body"
    rows = [
        _row("write", 0.0, 20.0, rename),
        _row("body", 1.0, 4.0, fork),
        _row("commit", 5.0, 3.0, 2),
        _row("body", 9.0, 1.0, rename),
        _row("commit", 11.0, 4.0, 1),
        _row("write", 30.0, 5.0, rename),
        _row("body", 30.5, 0.5, rename),
        _row("commit", 31.0, 3.0, 1),
    ]
    got = store_waits(rows, 0.0, 40.0)
    assert got["writes"] == 2
    assert got["forkBodiesBehind"] == 0.5  # one fork body over two writes
    assert got["forkBodyMsBehind"] == 2.0
    assert got["behindAny"] == 0.5
    assert got["commitsWaited"] == 1.5  # two COMMITs, then one
    assert got["commitsWaited2"] == 0.5
    assert got["afterBodyP99"] == 10.0  # from its body's end (10) to its return (20)
    assert got["commits"] == 3 and round(got["membersMean"], 6) == round(4 / 3, 6)


def test_phase_b_names_the_fork_sagas_suspects() -> None:
    """A fork's commit body, its other steps' bodies, its actor messages and its requests are
    phase B's suspects, each under its own name; a mutation's body is none."""
    requests = _requests()
    slow = [r for r in requests if r["t1"] - r["t0"] > 20]
    rows = [
        _row("body", r["t0"] + 5.0, 30.0, "ForkCommit.commit_fork.<locals>.<lambda>") for r in slow
    ]
    rows += [_row("body", r["t0"], 1.0, "ForkPrepare.prepare_fork.<locals>.body") for r in slow]
    rows += [_row("actor_message", r["t0"], 2.0, "ForkCreate s1") for r in slow]
    rows += [_row("request", r["t0"], 0.5, "fork.create") for r in slow]
    rows += [_row("body", r["t0"], 1.0, "SessionStore.update_title.<locals>.body") for r in slow]
    by_cause = {row["cause"]: row for row in attribute(requests, rows)["table"]}
    assert by_cause["fork commit body"]["share"] == 1.0
    assert set(by_cause) == {
        "fork commit body",
        "fork step body",
        "fork saga actor message",
        "fork request dispatch",
    }
