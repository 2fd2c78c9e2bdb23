"""A provider whose disk is full mid-Session, through the real daemon and a real tutti-agent
app-server: its rollout's appends fail (its RLIMIT_FSIZE lowered to the rollout's size, so
every write past it fails with EFBIG, as on a full file system). The Turn settles `failed`
with the provider's reason at once — not `active` until `turn_inactivity_seconds` — and once
space returns the same app-server runs the next Turn, its rollout whole: every line one JSON
object, the ordinals one run with no repeat (a line the full disk cut is not left to glue
onto the next)."""

from __future__ import annotations

import contextlib
import json
import resource
from pathlib import Path

import pytest

from tests.daemon.test_hung_provider import _app_servers
from tests.support.daemon import DaemonProcess, create_session, run_turn, settle, submit, wait_for

pytestmark = pytest.mark.timeout(120)


def _limit(pids: list[int], size: int | None) -> None:
    """Each process's file size limit: `size` bytes, or lifted (None)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard if size is None else size, hard))


def test_a_turn_whose_rollout_cannot_be_written_fails_and_the_next_one_runs_on(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # Far past the test's own wait: only the provider's end of the Turn can settle it here.
    (home / "agenthost.toml").write_text("[daemon]\nturn_inactivity_seconds = 600\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "first")["outcome"] == "completed"
        pids = wait_for(lambda: _app_servers(sid), 10)
        (rollout,) = home.glob(f"runtimes/*/{sid}/tutti-agent-home/sessions/**/rollout-*.jsonl")
        _limit(pids, rollout.stat().st_size)  # the disk is full
        try:
            turn = submit(c, sid, "second")
            done = settle(c, sid, turn["turnId"], timeout=30)
        finally:
            _limit(pids, None)  # space returns
        assert done["outcome"] == "failed", done
        assert "rollout" in (done["error"] or ""), done
        third = run_turn(c, sid, "third")
        assert third["outcome"] == "completed", third
        assert _app_servers(sid) == pids  # the same app-server ran it
        lines = rollout.read_bytes().split(b"\n")
        assert lines[-1] == b""
        ordinals = [json.loads(line)["ordinal"] for line in lines[:-1]]
        assert ordinals == list(range(len(ordinals))), ordinals
    finally:
        d.stop()
