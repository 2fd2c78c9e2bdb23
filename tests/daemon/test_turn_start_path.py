"""A Turn's start path through the real daemon on the Tutti Agent: its `before` checkpoint is
taken while its claim commits (nothing orders the two), under the id the claim then gives the
Turn, and the provider gets the Turn only once both are done; a capture begun for a submit that
creates no Turn (a replay) leaves no ref behind."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    wait_for,
)
from tests.support.git_repos import make_repo
from tests.support.invariants import assert_invariants
from workspace.shadow import ShadowStore


def _refs(daemon: DaemonProcess, repo: Path, sid: str) -> list[str]:
    return sorted(
        r for r in ShadowStore(daemon.home / "checkpoints").refs(repo) if r.startswith(f"{sid}/")
    )


def test_the_before_checkpoint_is_taken_while_the_claim_commits(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    c = daemon.client()
    sid = create_session(c, cwd=str(repo))["agentSessionId"]
    # The claim is held on the Session's thread before it begins.
    c.call("debug.failpoints", {"points": {"host.turn.before_claim": "hang"}})
    answered: dict[str, Any] = {}
    submitter = daemon.client()
    thread = threading.Thread(target=lambda: answered.update(submit(submitter, sid, "hello")))
    thread.start()
    try:
        # The `before` is captured and kept while no Turn exists yet.
        (held,) = wait_for(lambda: _refs(daemon, repo, sid), 20)
        assert held.startswith(f"{sid}/+"), held
        assert not answered
    finally:
        c.call("debug.failpoints", {"points": {"host.turn.before_claim": "off"}})
        thread.join(30)
    turn = settle(c, sid, answered["turnId"])
    assert turn["outcome"] == "completed", turn
    # The capture is the Turn's: its tree's ref, named by its record (and its `after`'s:
    # nothing changed the folder).
    assert _refs(daemon, repo, sid) == [held]
    tree = (
        ShadowStore(daemon.home / "checkpoints")
        ._git()
        .out(
            ["rev-parse", f"refs/agenthost/{held}"],
            env={"GIT_DIR": str(ShadowStore(daemon.home / "checkpoints").repo_dir(repo))},
        )
    )
    assert turn["workspace"]["before"] == tree


def test_a_replayed_submit_leaves_no_checkpoint_of_a_turn_it_did_not_create(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    c = daemon.client()
    sid = create_session(c, cwd=str(repo))["agentSessionId"]
    first = submit(c, sid, "hello", request_id="the-same-request")
    tree = settle(c, sid, first["turnId"])["workspace"]["after"]
    kept = _refs(daemon, repo, sid)
    assert kept == [f"{sid}/+{tree}"]
    # A change the replay's capture finds: it writes that tree's ref, which no Turn names.
    (repo / "a.txt").write_text("changed before the replay\n")
    again = submit(c, sid, "hello", request_id="the-same-request")
    assert again["turnId"] == first["turnId"]
    # Dropped once kept (or never kept).
    wait_for(lambda: _refs(daemon, repo, sid) == kept, 20)
    nxt = run_turn(c, sid, "next")["workspace"]
    assert nxt["before"] != tree
    assert _refs(daemon, repo, sid) == sorted([*kept, f"{sid}/+{nxt['before']}"])
    assert_invariants(daemon.home)


def test_a_daemon_killed_before_the_claim_leaves_no_turn_and_every_law_kept(
    tmp_path: Path,
) -> None:
    """Killed with the `before` capture begun and the claim not yet written: the submit was
    never answered, no Turn exists after the restart (a ref the capture may have kept names
    none, which no law forbids), the Session takes Turns again and every invariant holds."""
    home = tmp_path / "home"
    repo = make_repo(tmp_path / "repo")
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c, cwd=str(repo))["agentSessionId"]
        c.call("debug.failpoints", {"points": {"host.turn.before_claim": "once:kill"}})
        with contextlib.suppress(Exception):  # the daemon dies under the call
            submit(d.client(timeout=1.0), sid, "never claimed")
        wait_for(lambda: d.proc is not None and d.proc.poll() is not None, 20)
    finally:
        d.stop()
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        timeline = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})
        assert timeline["turns"] == []
        assert run_turn(c, sid, "after the restart")["outcome"] == "completed"
        assert_invariants(home)
    finally:
        d.stop()
