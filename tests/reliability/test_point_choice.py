"""`PointChoice`: the crash soak's long profile arms each of its points at least once, whatever
the seed, on the soak's own schedule of rounds and its draw of plans (the free rounds' leads,
the first round's worker point on its Claude fork, `CODEX_ROUND`'s on its Codex one, a Claude
or Codex round's fork point), and keeps rounds that SIGKILL the daemon at a random moment free
of leads while the others can take them; a round's pick is the least-armed point it can
reach."""

from __future__ import annotations

import random

import pytest

from tests.reliability.point_choice import SESSION_START, PointChoice
from tests.reliability.point_flows import FLOWS
from tests.reliability.reliability_harness import PointTally
from tests.reliability.test_crash_soak import FORK_POINTS, POINTS, WORKER_POINTS, free_round

LONG_ROUNDS = 60
LONG_CODEX_ROUND = 6
PLANS = ["kill_daemon", "kill_daemon", "kill_worker", "arm_failpoint"]
"""The soak's draw of a round's plan."""


@pytest.mark.parametrize("seed", [5401, 1, 2, 3, 4, 2**32 - 1])
def test_the_long_profiles_rounds_arm_every_point(seed: int) -> None:
    rng = random.Random(seed)
    tally = PointTally()
    choice = PointChoice(POINTS, tally, seed)
    kills_kept = 0
    for n in range(1, LONG_ROUNDS + 1):
        if not free_round(n):
            continue
        plan = rng.choice(PLANS)
        early = None
        if n in (1, LONG_CODEX_ROUND):
            early = choice.pick(WORKER_POINTS)
        elif plan == "arm_failpoint" and rng.random() < 0.4:  # a Claude or Codex round's
            early = choice.pick(FORK_POINTS)
        if early is not None:
            tally.arm(early)
        free_left = sum(free_round(m) for m in range(n, LONG_ROUNDS + 1))
        lead = choice.lead(free_left, spare=plan == "kill_daemon" or early is not None)
        assert len(set(lead)) == len(lead), lead
        kills_kept += plan == "kill_daemon" and not lead
        for point in lead:
            tally.arm(point)
        if plan == "arm_failpoint" and early is None:
            tally.arm(choice.pick())  # the round's own, at its chaos step
    assert choice.unarmed() == [], choice.summary()
    assert set(tally.armed) == set(POINTS) and SESSION_START in POINTS
    assert kills_kept > 0, "no round kept its kill at a random moment"
    assert choice.summary().startswith(
        f"failpoints of the soak's {len(POINTS)}: armed {len(POINTS)},"
    )


def test_a_pick_is_the_least_armed_of_what_the_round_reaches() -> None:
    tally = PointTally()
    choice = PointChoice(POINTS, tally, 7)
    for _ in range(2 * len(WORKER_POINTS)):
        tally.arm(choice.pick(WORKER_POINTS))
    assert all(tally.armed[p] == 2 for p in WORKER_POINTS), tally.armed
    # A fork's points never include the session start's (its cell is a new Session's).
    assert SESSION_START not in FORK_POINTS and set(WORKER_POINTS) <= set(FORK_POINTS)
    assert choice.pick(FORK_POINTS, but=FORK_POINTS[1:]) == FORK_POINTS[0]


def test_a_spared_round_leads_only_when_the_rounds_after_it_cannot() -> None:
    choice = PointChoice(POINTS, PointTally(), 3)
    left = len(POINTS)
    assert choice.lead(40, spare=True) == []  # 28 fit in 2 × 19 later rounds
    assert len(choice.lead(40)) == -(-left // 20)
    assert len(choice.lead(3, spare=True)) == -(-left // 2)  # they cannot: it takes its share
    assert len(choice.lead(1, spare=True)) == left  # the last free round takes all


def test_every_point_the_soak_arms_has_a_directed_flow() -> None:
    """A point armed with no flow of its own waits for the random load to reach it, which may
    not come before a restart or a stall round turns it off: a new point of `POINTS` fails
    here until `point_flows.FLOWS` says how to reach it."""
    assert sorted(set(POINTS) - set(FLOWS)) == []
    assert sorted(set(FLOWS) - set(POINTS)) == []
