"""Prints the reliability ledger (cells, trials, outcomes, invariant checks and violations) at
the end of any run that collected the reliability suite, and a failed soak's seed, where it
failed and how to replay it (`REPLAY`) as its report's "soak replay" section."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests.reliability.reliability_harness import LEDGER, REPLAY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = LEDGER.table()
    if not lines:
        return
    terminalreporter.section("reliability summary")
    for line in lines:
        terminalreporter.write_line(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    words = item.stash.get(REPLAY, None)
    if words is not None and report.failed:
        report.sections.append(("soak replay", words()))
