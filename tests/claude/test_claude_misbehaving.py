"""A Claude Code CLI that misbehaves on its stdout, through the real daemon: the SDK's bundled
`claude` behind the soaks' relay in its stream-json dialect (`provider_chaos.claude_front`)
writes one endless line, lines the SDK skips (`garbage`), what it cannot read on from
(`notobject`: wrong-shaped messages, bytes that are not UTF-8), or closes its stdout at the
Turn's prompt or once the Turn started. Each round is judged by the soaks' law,
`provider_fault_settles`, Claude's row: the Turn settles in its bound, `failed
provider_protocol_error` where the SDK cannot read on (the CLI killed), `completed` where it
skips the lines; the next Turn completes on a new CLI; the worker's memory stays bounded.

Was: the endless line and the unreadable messages failed the Turn untyped (`CLIJSONDecodeError`,
`UnicodeDecodeError`, an `AttributeError` of the driver's own), and a closed stdout left the
Turn active for good (the SDK waits for the CLI's exit after its stdout ends) or, mid-Turn,
failed `model_timeout` 30 s on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.provider_chaos import (
    CLAUDE,
    FAULTS,
    claude_front,
    every_fault,
)
from tests.support.invariants import CLAUDE_BREAKING_FAULTS

pytestmark = [pytest.mark.timeout(300)]


# The short stopped limit's trial runs in `make soak`: a stopped CLI under a short limit is
# pinned in `make test` by tests/claude/test_claude_stopped.py.
@pytest.mark.parametrize(
    "stopped_limit",
    [None, pytest.param(2, marks=pytest.mark.long)],
    ids=["default", "stopped-2s"],
)
def test_every_stdout_fault_of_a_claude_cli_settles_as_the_law_says(
    tmp_path: Path, stopped_limit: int | None
) -> None:
    chaos = every_fault(tmp_path / "home", CLAUDE, claude_front(tmp_path / "arms"), stopped_limit)
    violations = chaos.violations
    summary = chaos.summary()
    assert violations == [], (violations, summary)
    assert [f.fault for f in chaos.faults] == list(FAULTS), summary
    assert all(f.provider == CLAUDE and not f.disturbed for f in chaos.faults), chaos.faults
    for fault in FAULTS:
        said = (
            "failed provider_protocol_error"
            if fault in CLAUDE_BREAKING_FAULTS
            else "completed None"
        )
        assert chaos.calls[f"claude-code {fault} {said}"] == 1, summary
