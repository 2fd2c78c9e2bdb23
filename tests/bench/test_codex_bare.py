"""The codex entry of benchmark 1: its bare side makes the provider calls the Codex driver
makes for a fork (`tests/codex/test_codex_fork_round_trips.py` counts the driver's): the
source's Turns listed a page at a time once while it is unchanged, no `thread/read`, and per
fork a `thread/fork` with `excludeTurns`, the child's Turns listed, the child unsubscribed; in
a folder of its own, as the daemon's Sessions, not in the checkout's git work tree."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import drivers.codex.command
from bench.providers import REPO, BareAppServer, provider
from tests.codex.codex_helpers import calls, relayed

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]


def test_the_bare_codex_fork_makes_the_drivers_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.jsonl"
    # The real Codex behind the relay that logs each request (the bare side runs the command
    # `default_command` names, plus `app-server`).
    relay = relayed("none", log)
    monkeypatch.setattr(drivers.codex.command, "default_command", lambda: relay)
    entry = provider("codex")
    assert entry.unavailable() is None
    with entry.environment() as config:
        bare = entry.bare(tmp_path / "bare", 2, config)
        assert isinstance(bare, BareAppServer)
        try:
            before = len(calls(log))
            for _ in range(3):
                assert bare.fork_once() > 0
        finally:
            bare.close()
    made = calls(log)[before:]
    assert Counter(c["method"] for c in made) == {
        "thread/fork": 3,
        "thread/turns/list": 4,
        "thread/unsubscribe": 3,
    }
    listed = [c["params"]["threadId"] for c in made if c["method"] == "thread/turns/list"]
    assert listed.count(bare.thread_id) == 1 and len(set(listed)) == 4
    assert all(c["params"].get("excludeTurns") for c in made if c["method"] == "thread/fork")
    # In a folder as the daemon's Sessions are (no git work tree: Codex's fork runs `git`
    # there), not the checkout.
    (started,) = calls(log, "thread/start")
    cwd = Path(started["params"]["cwd"])
    assert cwd.is_dir() and not cwd.is_relative_to(REPO), cwd
