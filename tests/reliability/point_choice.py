"""Which failpoints the crash soak's rounds arm (`PointChoice`): the least-armed point of those a
round's cell can reach (its `PointTally`'s counts; ties broken by a generator of the seed's own,
so the soak's other draws are unchanged), and, as a free round's load starts (neither a stall,
a full-disk nor a stop round), as many of the points never armed yet as the free rounds left
must take for every point to be armed once in the run (`lead`): random picks armed 4 of 25 in
a 60-round run. A round whose plan SIGKILLs the daemon at a random moment arms none while the
other rounds can take them (a point armed there would fire first: one long run led every free
round and kept no such kill), and once each point was armed no free round arms any at its
start. Each point is armed just before its directed flow (`point_flows`), so it fires.

`worker.session.after_start` (`SESSION_START`: the worker's answer to a `session.start` held
after the driver chose the provider session id) is reached by a new Claude Code Session's
first Turn submitted beside a fork of it through `latestSettled`."""

from __future__ import annotations

import random

from tests.reliability.reliability_harness import PointTally

SESSION_START = "worker.session.after_start"
LEAD_MAX = 2
"""The unarmed points a spared round counts on each later round to take (`PointChoice.lead`)."""


class PointChoice:
    def __init__(
        self, points: tuple[str, ...], tally: PointTally, seed: int, *, most: int | None = None
    ) -> None:
        self.points = points
        self.tally = tally
        self.rng = random.Random(f"points-{seed}")
        self.most = most
        """The most points a round leads (the short profile's one free round: not all)."""

    def pick(self, among: tuple[str, ...] | None = None, but: tuple[str, ...] = ()) -> str:
        """The least-armed point of `among` (all the soak's points by default) not in `but`."""
        pool = sorted(set(among or self.points) - set(but))
        low = min(self.tally.armed[p] for p in pool)
        return self.rng.choice([p for p in pool if self.tally.armed[p] == low])

    def unarmed(self) -> list[str]:
        return [p for p in self.points if not self.tally.armed[p]]

    def lead(self, free_left: int, *, spare: bool = False) -> list[str]:
        """The points a free round arms as its load starts, `free_left` free rounds left with
        this one: none once every point was armed. A round to `spare` (its plan SIGKILLs the
        daemon at a random moment, or it armed a point on its seed fork already) arms none
        while the unarmed points fit in the rounds after it (`LEAD_MAX` in each of the half
        of them expected not to be spared); any other round arms its share of the unarmed
        points over the rounds not spared, this one included (the last free round takes all
        that are left, spared or not)."""
        left = len(self.unarmed())
        if spare and left <= LEAD_MAX * ((free_left - 1) // 2):
            return []
        picked: list[str] = []
        share = -(-left // max(1, (free_left + 1) // 2))
        for _ in range(share if self.most is None else min(share, self.most)):
            picked.append(self.pick(but=tuple(picked)))
        return picked

    def summary(self) -> str:
        """How many of the points the run armed and how many fired, and those never armed."""
        fired = sum(1 for p in self.points if self.tally.fired[p])
        return (
            f"failpoints of the soak's {len(self.points)}:"
            f" armed {len(self.points) - len(self.unarmed())}"
            f", fired {fired}; never armed: {self.unarmed() or 'none'}"
        )
