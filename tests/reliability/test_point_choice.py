"""`PointChoice`: the crash soak's long profile arms each of its points at least once, whatever
the seed, on the soak's own schedule of rounds (the free rounds' leads, the first round's worker
point on its Claude fork, `CODEX_ROUND`'s on its Codex one); a round's pick is the least-armed
point it can reach."""

from __future__ import annotations

import pytest

from tests.reliability.point_choice import SESSION_START, PointChoice
from tests.reliability.reliability_harness import PointTally
from tests.reliability.test_crash_soak import FORK_POINTS, POINTS, WORKER_POINTS, free_round

LONG_ROUNDS = 60
LONG_CODEX_ROUND = 6


@pytest.mark.parametrize("seed", [5401, 1, 2**32 - 1])
def test_the_long_profiles_rounds_arm_every_point(seed: int) -> None:
    tally = PointTally()
    choice = PointChoice(POINTS, tally, seed)
    leads = []
    for n in range(1, LONG_ROUNDS + 1):
        if n in (1, LONG_CODEX_ROUND):
            tally.arm(choice.pick(WORKER_POINTS))
        elif free_round(n):
            lead = choice.lead(sum(free_round(m) for m in range(n, LONG_ROUNDS + 1)))
            assert len(set(lead)) == len(lead), lead
            leads.append(len(lead))
            for point in lead:
                tally.arm(point)
    assert choice.unarmed() == [], choice.summary()
    assert set(tally.armed) == set(POINTS) and SESSION_START in POINTS
    # The leads spread over the free rounds (at most 2 a round), each point once.
    # (the two worker points the Claude and Codex rounds armed are not led again).
    assert max(leads) <= 2 and sum(leads) == len(POINTS) - 2, leads
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
