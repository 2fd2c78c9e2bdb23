"""A Codex app-server that misbehaves on its stdout, through the real daemon: the pinned
`codex app-server` behind the soaks' relay (`provider_chaos.codex_front`, the same JSON lines
as Tutti Agent's) writes one endless line, garbage between its lines, notifications whose
params are no object, closes its stdout at a `turn/start` or once the Turn started, or
answers `turn/start` without a turn id (and names the Turn nowhere after). Each
round is judged by the soaks' law, `provider_fault_settles`: the Turn settles in its bound
(`failed provider_protocol_error` where the pipe broke, `completed` where the reader skips the
lines), the broken runtime goes, the next Turn completes on a new one, the worker's memory
stays bounded. With `provider_stopped_seconds = 2` (the contention soak's): the closed stdout
is named before the liveness check would call the runtime unresponsive."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.provider_chaos import (
    CODEX,
    FAULTS,
    codex_front,
    every_fault,
)
from tests.support.invariants import provider_log_problems

pytestmark = [pytest.mark.timeout(240)]


@pytest.mark.parametrize("stopped_limit", [None, 2], ids=["default", "stopped-2s"])
def test_every_stdout_fault_of_a_codex_app_server_settles_as_the_law_says(
    tmp_path: Path, stopped_limit: int | None
) -> None:
    chaos = every_fault(tmp_path / "home", CODEX, codex_front(tmp_path / "arms"), stopped_limit)
    violations = chaos.violations
    summary = chaos.summary()
    assert violations == [], (violations, summary)
    assert [f.fault for f in chaos.faults] == list(FAULTS), summary
    assert all(f.provider == CODEX and not f.disturbed for f in chaos.faults), chaos.faults
    # Every breaking fault met the relay and was named by the reader, not the liveness check.
    for fault in ("endless", "close", "close_mid", "noid"):
        assert chaos.calls[f"codex {fault} failed provider_protocol_error"] == 1, summary
    for fault in ("garbage", "notobject", "stderr"):
        assert chaos.calls[f"codex {fault} completed None"] == 1, summary
    # The stderr flood (past twice the bound) kept to the bound of the app-server's log.
    assert provider_log_problems(tmp_path / "home") == []
