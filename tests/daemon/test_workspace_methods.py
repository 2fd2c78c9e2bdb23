"""`session.workspaceDiff` and `workspace.restore` through the real daemon on the Tutti Agent,
in real git repositories the tests make: what a Turn changed, between two Turns, bounded; a
restore that checkpoints first (and can be undone), that never touches what checkpoints do
not capture nor the person's repository, refused while a Turn runs or while other live
Sessions share the directory; typed errors for every bad id."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    timeline,
)
from tests.support.git_repos import git, make_repo, pending_request, turn_changing
from transport.client import ApiError


def _diff(client: Any, sid: str, **extra: Any) -> dict[str, Any]:
    return dict(
        client.call("session.workspaceDiff", {"workspaceId": WS, "agentSessionId": sid, **extra})
    )


def _restore(client: Any, sid: str, **extra: Any) -> dict[str, Any]:
    return dict(
        client.call("workspace.restore", {"workspaceId": WS, "agentSessionId": sid, **extra})
    )


def _error(fn: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn()
    return info.value


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_workspace_diff_of_a_turn_between_turns_and_bounded(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    client = daemon.client()
    sid = create_session(client, cwd=str(repo))["agentSessionId"]

    def _first() -> None:
        (repo / "a.txt").write_text("one\nmore\n")
        (repo / "b.txt").unlink()
        (repo / "pic.bin").write_bytes(bytes(range(256)) * 4)

    first = turn_changing(client, sid, _first)
    second = turn_changing(client, sid, lambda: (repo / "c.txt").write_text("three\n"))

    one = _diff(client, sid, turnId=first["turnId"])
    assert one["from"] == first["workspace"]["before"] and one["to"] == first["workspace"]["after"]
    assert sorted((c["path"], c["kind"]) for c in one["changedFiles"]) == [
        ("a.txt", "modified"),
        ("b.txt", "deleted"),
        ("pic.bin", "added"),
    ]
    assert "+more" in one["diff"] and "-two" in one["diff"] and not one["truncated"]
    assert "Binary files" in one["diff"]  # named, not shown

    # No turnId: the newest settled Turn.
    newest = _diff(client, sid)
    assert newest["turnId"] == second["turnId"]
    assert newest["changedFiles"] == [{"path": "c.txt", "kind": "added"}]

    # Between two Turns: the first's `after` to the second's `after`.
    between = _diff(client, sid, turnId=second["turnId"], fromTurnId=first["turnId"])
    assert between["changedFiles"] == [{"path": "c.txt", "kind": "added"}]
    whole = _diff(client, sid, turnId=second["turnId"], fromTurnId=first["turnId"], maxBytes=10)
    assert whole["truncated"] and len(whole["diff"].encode()) <= 10

    # Typed errors, and the daemon keeps serving.
    missing = _error(lambda: _diff(client, sid, turnId="no-such-turn"))
    assert (missing.status, missing.reason) == (404, "turn_not_found")
    unknown = "00000000-0000-4000-8000-000000000000"
    gone = _error(lambda: _diff(client, unknown))
    assert (gone.status, gone.reason) == (404, "workspace_agent_session_not_found")
    bad = _error(lambda: _diff(client, sid, maxBytes=-1))
    assert (bad.status, bad.reason) == (400, "invalid_argument")

    # A Turn whose checkpoint is unavailable says why.
    lost = tmp_path / "lost"
    lost.mkdir()
    other = create_session(client, cwd=str(lost))["agentSessionId"]
    shutil.rmtree(lost)
    turn = run_turn(client, other, "hello")
    err = _error(lambda: _diff(client, other, turnId=turn["turnId"]))
    assert (err.status, err.reason) == (409, "workspace_checkpoint_missing")
    assert err.params["workspaceReason"] == "cwd_missing" and err.params["turnId"]
    assert _diff(client, sid)["turnId"] == second["turnId"]


def test_restore_puts_files_back_checkpoints_first_and_can_be_undone(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    head, index = git(repo, "rev-parse", "HEAD"), (repo / ".git" / "index").read_bytes()
    original = _files(repo)
    client = daemon.client()
    sid = create_session(client, cwd=str(repo))["agentSessionId"]

    def _change() -> None:
        (repo / "a.txt").write_text("changed by the turn\n")
        (repo / "b.txt").unlink()
        (repo / "sub").mkdir()
        (repo / "sub" / "new.txt").write_text("new\n")

    turn = turn_changing(client, sid, _change)
    # After the Turn: the person edits on, and an ignored file appears.
    (repo / "a.txt").write_text("edited after the turn\n")
    (repo / "ignored" / "late.log").write_text("not captured\n")
    after_edits = _files(repo)

    done = _restore(client, sid, turnId=turn["turnId"], which="before")
    assert done["restored"] == turn["workspace"]["before"] and done["which"] == "before"
    assert sorted((c["path"], c["kind"]) for c in done["changedFiles"]) == [
        ("a.txt", "modified"),
        ("b.txt", "added"),
        ("sub/new.txt", "deleted"),
    ]
    now = _files(repo)
    # Back to the Turn's start; what checkpoints never capture is left alone.
    assert {k: v for k, v in now.items() if k != "ignored/late.log"} == original
    assert now["ignored/late.log"] == b"not captured\n"
    assert not (repo / "sub").exists()

    # The restore is undone from its own checkpoint: the edits made after the Turn return.
    undo = _restore(client, sid, tree=done["undo"]["tree"])
    assert _files(repo) == after_edits
    assert undo["undo"]["tree"] == turn["workspace"]["before"]

    # Nothing of the person's repository was written.
    assert git(repo, "rev-parse", "HEAD") == head
    assert (repo / ".git" / "index").read_bytes() == index
    assert git(repo, "for-each-ref", "--format=%(refname)") == "refs/heads/main"
    assert git(repo, "stash", "list") == ""

    bad = _error(lambda: _restore(client, sid, tree="f" * 40))
    assert (bad.status, bad.reason) == (409, "workspace_checkpoint_missing")
    both = _error(lambda: _restore(client, sid))
    assert (both.status, both.reason) == (400, "invalid_argument")


def test_restore_is_refused_while_a_turn_runs_and_in_a_shared_directory(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    client = daemon.client()
    sid = create_session(client, cwd=str(repo))["agentSessionId"]
    turn = turn_changing(client, sid, lambda: (repo / "a.txt").write_text("x\n"))

    # A Turn running: refused, and the files stay as they are.
    running = submit(client, sid, "/ask wait?")["turnId"]
    pending_request(client, sid, running)
    busy = _error(lambda: _restore(client, sid, turnId=turn["turnId"], which="before"))
    assert (busy.status, busy.reason) == (409, "agent_session_busy")
    assert busy.params["turnId"] == running
    assert (repo / "a.txt").read_text() == "x\n"
    client.call("turn.interrupt", {"workspaceId": WS, "agentSessionId": sid, "turnId": running})
    settle(client, sid, running)

    # Another live Session works in the same directory: refused unless forced.
    other = create_session(client, cwd=str(repo))["agentSessionId"]
    shared = _error(lambda: _restore(client, sid, turnId=turn["turnId"], which="before"))
    assert (shared.status, shared.reason) == (409, "workspace_shared")
    assert shared.params["agentSessionIds"] == [other]
    assert (repo / "a.txt").read_text() == "x\n"
    forced = _restore(client, sid, turnId=turn["turnId"], which="before", force=True)
    assert forced["changedFiles"] == [{"path": "a.txt", "kind": "modified"}]
    assert (repo / "a.txt").read_text() == "one\n"


def test_a_fork_childs_copied_turn_says_its_checkpoint_is_the_sources(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    client = daemon.client()
    sid = create_session(client, cwd=str(repo))["agentSessionId"]
    first = turn_changing(client, sid, lambda: (repo / "c.txt").write_text("three\n"))
    _, op = fork(client, sid, first["turnId"])
    op = until_terminal(client, op)
    assert op["status"] == "committed", op
    child = op["targetAgentSessionId"]
    (copied,) = [t for t in timeline(client, child)]
    err = _error(lambda: _diff(client, child, turnId=copied["turnId"]))
    assert (err.status, err.reason) == (409, "workspace_checkpoint_missing")
    assert err.params == {"turnId": copied["turnId"], "workspaceReason": "forked"}, err.params
    assert "source session" in str(err)
    # The source's own Turn still answers its diff.
    assert _diff(client, sid, turnId=first["turnId"])["changedFiles"] == [
        {"path": "c.txt", "kind": "added"}
    ]
