"""A Codex `thread/fork` whose own file writes fail (the disk full as the child is written:
`EFBIG` past a byte, or no file descriptor left) against the real `codex app-server` 0.171.0:
the server answers `-32603` with the OS error, and may have left a child rollout behind (cut
short, or whole): the fork is `unknown` (a `fork.resolve` inspects, adopts or abandons the
child), never `rejected` with an orphan. A warm source and a transient one alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from codex_helpers import EventLog, MakeDriver, codex_bin, fork_request, home_of, open_session

from domain.enums import DeliveryDisposition
from drivers.binder import iter_rollouts

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]

RELAY = str(Path(__file__).with_name("codex_limit_relay.py"))


@pytest.mark.parametrize("limit", ["fsize:0", "fsize:500", "fsize:4000", "nofile:1"])
@pytest.mark.parametrize("warm", [True, False])
def test_a_fork_whose_child_cannot_be_written_is_unknown_with_what_it_left(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, limit: str, warm: bool
) -> None:
    driver = make_driver(command=[sys.executable, RELAY, limit, "--", codex_bin()])
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    if not warm:
        driver.stop_session({"agentSessionId": src.name})  # a transient server forks
    before = set(iter_rollouts(src.home))
    result = driver.fork(fork_request(src, src.turns[:1], home_of(tmp_path, "child")))
    assert result.disposition is DeliveryDisposition.UNKNOWN, result
    assert "(code -32603)" in (result.error or ""), result.error
    left = set(iter_rollouts(src.home)) - before
    # Past a byte: the child's file is left, cut short. No descriptor: none was made.
    assert len(left) == (1 if limit.startswith("fsize") else 0), left
    assert list(iter_rollouts(home_of(tmp_path, "child"))) == []
