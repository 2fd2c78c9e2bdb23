"""`laws_checked`: a soak's summary counts the laws its code checks, read from it (the soak
module, the cells it imports, the checker's functions they name, transitively), not a hand
list that leaves some out."""

from __future__ import annotations

from pathlib import Path

from tests.reliability import test_contention_soak
from tests.reliability.laws_checked import laws_checked
from tests.support.invariants import Law


def test_the_laws_are_those_the_checks_a_soak_names_reach(tmp_path: Path) -> None:
    soak = tmp_path / "soak.py"
    soak.write_text(
        "from tests.support.invariants import check_status_bounds\ncheck_status_bounds({})\n"
    )
    assert laws_checked(soak) == [Law.STATUS_BOUNDS]
    # A name of the checker's reaches what it calls: `check_processes` walks the processes.
    soak.write_text(
        "from tests.support.invariants import check_processes\ncheck_processes(h, None)\n"
    )
    assert Law.PROCESS_OWNED in laws_checked(soak)
    soak.write_text("import os\nprint(Law.FENCE)\n")  # a law the soak names itself
    assert laws_checked(soak) == [Law.FENCE]


def test_the_contention_soaks_summary_counts_every_law_it_checks() -> None:
    counted = set(test_contention_soak.checked_laws())
    # Checked by the soak's own calls and its cells' (the events heard, the interactions
    # answered, the processes and runtimes after the daemon), once left out of its summary.
    for law in (
        Law.EVENTS_BOUNDED,
        Law.TURN_EVENTS_HEARD,
        Law.INTERACTION_STATE,
        Law.INTERACTION_ANSWERED,
        Law.INTERRUPT_ANSWERED,
        Law.PROCESS_OWNED,
        Law.RUNTIME_PROCESSES_ENDED,
        Law.STATUS_BOUNDS,
        Law.LIST_PAGES,
    ):
        assert law in counted, law
    assert counted == set(laws_checked(Path(test_contention_soak.__file__)))
