"""Prints the reliability ledger (cells, trials, outcomes, invariant checks and violations) at
the end of any run that collected the reliability suite."""

from __future__ import annotations

from typing import Any

from tests.reliability.reliability_harness import LEDGER


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = LEDGER.table()
    if not lines:
        return
    terminalreporter.section("reliability summary")
    for line in lines:
        terminalreporter.write_line(line)
