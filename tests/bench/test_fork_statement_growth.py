"""`bench.fork_statement_growth`: the store's fork statements' VM steps a fork, early and late
in a run of forks of one source, and the one statement found growing with the source's forks."""

from __future__ import annotations

import pytest

from bench.fork_statement_growth import measure


def test_steps_are_counted_per_statement_in_each_window_and_the_most_grown_listed_first() -> None:
    growth = measure(forks=41, window=10)
    # Every fork writes its operation row with the same statement, whatever came before.
    insert = next(sql for sql in growth.early if sql.startswith("INSERT INTO fork_operations"))
    assert growth.early[insert] == growth.late[insert] > 0
    assert growth.total(growth.late) > growth.total(growth.early) > 0
    grown = growth.grown()
    deltas = [late - early for _, early, late in grown]
    assert deltas == sorted(deltas, reverse=True)


@pytest.mark.xfail(
    strict=True,
    reason="open: the child's title counts every earlier fork of its source at each prepare "
    "(storage/fork_prepare.py child_title; docs/reliability.md, 'Bugs this suite found')",
)
def test_a_prepares_work_does_not_grow_with_its_sources_earlier_forks() -> None:
    growth = measure(forks=301, window=50)
    # Forks 251-300 of the source against forks 1-50: the same statements, the same steps
    # but for what a bigger store's B-trees add (a few per cent at most).
    assert growth.total(growth.late) <= 1.1 * growth.total(growth.early)
