"""The fork laws beyond seed 000 (tests/daemon/test_fork_laws.py) on the real Claude Agent
SDK and CLI: one dispatch per boundary across point kinds, no delete of an unresolved source,
a resolve that takes only its own child and waits for a running fork, the capability field and
the seed's titles. In `make soak` (marked long)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from test_claude_daemon import child_transcripts, claude_daemon, claude_source  # noqa: F401

from model_fakes.messages import MessagesServer
from tests.daemon.test_fork_laws import SCENARIOS
from tests.support.daemon import DaemonProcess

pytestmark = [pytest.mark.claude, pytest.mark.long, pytest.mark.timeout(300)]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_claude_fork_laws(
    claude_daemon: tuple[DaemonProcess, MessagesServer],  # noqa: F811
    scenario: Callable[..., None],
    tmp_path: Path,
) -> None:
    d, _ = claude_daemon
    c = d.client()
    sid, turns = claude_source(d, tmp_path / "cwd")
    scenario(d, c, sid, turns, lambda: len(child_transcripts(d.home)))
