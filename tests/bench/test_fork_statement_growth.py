"""`bench.fork_statement_growth`: the store's fork statements' VM steps a fork, early and late
in a run of forks of one source."""

from __future__ import annotations

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
