"""The fork laws beyond seed 000 (tests/daemon/test_fork_laws.py) on the real codex
app-server: one dispatch per boundary across point kinds, no delete of an unresolved source,
a resolve that takes only its own child and waits for a running fork, the capability field and
the seed's titles. In `make soak` (marked long)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from test_codex_daemon import codex_home, codex_source

from tests.daemon.test_fork_laws import SCENARIOS
from tests.support.daemon import DaemonProcess
from tests.support.homes import child_rollouts

pytestmark = [pytest.mark.codex, pytest.mark.long, pytest.mark.timeout(300)]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_codex_fork_laws(
    codex_daemon: DaemonProcess, scenario: Callable[..., None], tmp_path: Path
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    scenario(d, c, sid, turns, lambda: len(child_rollouts(codex_home(d, sid))))
