"""Every Turn checkpoints its Session's working directory at its start and when it settles
(docs/design/workspace.md), through the real daemon on the Tutti Agent: the record on the
Turn (`workspace` in `session.timeline`), the refs in the home's shadow store, and a Turn
that completes whatever happens to its checkpoint (missing directory, checkpoints off)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    respond,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.git_repos import GIT_ENV, git, make_repo, pending_request
from workspace.shadow import ShadowStore


def test_a_turn_that_changes_files_records_before_after_and_changed_files(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    head = git(repo, "rev-parse", "HEAD")
    index_before = (repo / ".git" / "index").read_bytes()
    client = daemon.client()
    sid = create_session(client, cwd=str(repo))["agentSessionId"]

    # The Turn waits on a question: its `before` was taken before the provider got it (the
    # record is written with the settlement).
    turn_id = submit(client, sid, "/ask go on?")["turnId"]
    request_id = pending_request(client, sid, turn_id)
    assert turn_of(client, sid, turn_id)["workspace"] is None

    # What the Turn does to the files, once the provider has it (its tools would do the same).
    (repo / "a.txt").write_text("one, changed\n")
    (repo / "b.txt").unlink()
    (repo / "new.txt").write_text("added\n")
    (repo / "ignored" / "y.log").write_text("still ignored\n")
    respond(client, sid, turn_id, request_id, {"text": "yes"})
    turn = settle(client, sid, turn_id)
    assert turn["outcome"] == "completed", turn

    ws = turn["workspace"]
    assert ws["cwd"] == os.path.realpath(repo)
    assert ws["before"] and ws["after"] and ws["after"] != ws["before"]
    assert sorted((c["path"], c["kind"]) for c in ws["changedFiles"]) == [
        ("a.txt", "modified"),
        ("b.txt", "deleted"),
        ("new.txt", "added"),
    ]
    assert ws["headCommit"] == head
    assert ws["repoRoot"] == os.path.realpath(repo)
    assert ws["tooLarge"] == []

    # The refs that keep both checkpoints (one a tree, the Session's) are in the home's
    # shadow store.
    shadow = ShadowStore(daemon.home / "checkpoints")
    refs = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname) %(objectname)"],
        env={**GIT_ENV, "GIT_DIR": str(shadow.repo_dir(repo))},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    assert f"refs/agenthost/{sid}/+{ws['before']} {ws['before']}" in refs
    assert f"refs/agenthost/{sid}/+{ws['after']} {ws['after']}" in refs
    # The checkpoint is the Turn's files: the diff between them says what changed.
    text, _ = shadow.diff(repo, ws["before"], ws["after"])
    assert "+one, changed" in text and "+added" in text

    # Nothing of the person's repository was written.
    assert git(repo, "rev-parse", "HEAD") == head
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert git(repo, "for-each-ref", "--format=%(refname)") == "refs/heads/main"

    # The next Turn's `before` is the previous one's `after`: nothing changed between them.
    nxt = run_turn(client, sid, "hello")["workspace"]
    assert nxt["before"] == ws["after"] == nxt["after"] and nxt["changedFiles"] == []


def test_a_missing_working_directory_is_recorded_unavailable_and_the_turn_completes(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    client = daemon.client()
    sid = create_session(client, cwd=str(gone))["agentSessionId"]
    shutil.rmtree(gone)
    turn = run_turn(client, sid, "hello")
    assert turn["outcome"] == "completed", turn
    assert turn["workspace"]["state"] == "unavailable", turn["workspace"]
    assert turn["workspace"]["reason"] == "cwd_missing"
    assert str(gone) in turn["workspace"]["message"]


def test_checkpoints_off_record_disabled_and_the_turn_completes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[workspace]\ncheckpoints = false\n")
    repo = make_repo(tmp_path / "repo")
    daemon = DaemonProcess(home).start()
    try:
        client = daemon.client()
        sid = create_session(client, cwd=str(repo))["agentSessionId"]
        turn = run_turn(client, sid, "hello")
        assert turn["outcome"] == "completed", turn
        assert turn["workspace"] == {
            "state": "unavailable",
            "reason": "disabled",
            "message": turn["workspace"]["message"],
        }
        assert not (home / "checkpoints").exists() or not any((home / "checkpoints").iterdir())
    finally:
        daemon.stop()


def test_the_workspace_record_is_on_the_timeline_of_every_client(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A plain directory (not a repository) is checkpointed too: no HEAD, no repository."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.md").write_text("hi\n")
    client = daemon.client()
    sid = create_session(client, cwd=str(plain))["agentSessionId"]
    turn = run_turn(client, sid, "hello")
    ws = turn["workspace"]
    assert ws["after"] and ws["headCommit"] is None and ws["repoRoot"] is None
    other = daemon.client()
    page = other.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})
    assert page["turns"][-1]["workspace"] == ws


def _shadow_git(home: Path, cwd: Path, *args: str, check: bool = True) -> str:
    shadow = ShadowStore(home / "checkpoints")
    return subprocess.run(
        ["git", *args],
        env={**GIT_ENV, "GIT_DIR": str(shadow.repo_dir(cwd))},
        check=check,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_deleting_a_session_drops_its_checkpoints_and_a_sweep_collects_them(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[workspace]\ngc_interval_s = 0.5\n")
    repo = make_repo(tmp_path / "repo")
    daemon = DaemonProcess(home).start()
    try:
        client = daemon.client()
        keep = create_session(client, cwd=str(repo))["agentSessionId"]
        gone = create_session(client, cwd=str(repo))["agentSessionId"]
        kept = run_turn(client, keep, "hello")["workspace"]
        # The doomed Session's Turn changes a file: its `before` holds a blob nothing else does.
        (repo / "a.txt").write_text("only in the deleted session's before\n")
        turn_id = submit(client, gone, "/ask go on?")["turnId"]
        request_id = pending_request(client, gone, turn_id)
        (repo / "a.txt").write_text("rewritten\n")
        respond(client, gone, turn_id, request_id, {"text": "yes"})
        doomed = settle(client, gone, turn_id)["workspace"]
        assert doomed["changedFiles"] == [{"path": "a.txt", "kind": "modified"}]
        before_blob = _shadow_git(home, repo, "rev-parse", f"{doomed['before']}:a.txt")
        sweeps = client.call("host.status")["checkpoints"]["sweeps"]
        size = client.call("host.status")["checkpoints"]["bytes"]
        assert size > 0

        client.call("session.delete", {"workspaceId": WS, "agentSessionId": gone})

        def _refs() -> list[str]:
            return _shadow_git(home, repo, "for-each-ref", "--format=%(refname)").split()

        wait_for(lambda: not any(f"/{gone}/" in r for r in _refs()), 30)
        # The other Session's checkpoints stay.
        assert any(f"/{keep}/" in r for r in _refs())
        # A later sweep collects the blob only the deleted Session's checkpoint kept.
        wait_for(lambda: client.call("host.status")["checkpoints"]["sweeps"] > sweeps + 1, 30)
        probe = subprocess.run(
            ["git", "cat-file", "-e", before_blob],
            env={**GIT_ENV, "GIT_DIR": str(ShadowStore(home / "checkpoints").repo_dir(repo))},
            capture_output=True,
        )
        assert probe.returncode != 0, "the deleted Session's blob was not collected"
        # What the kept Session's checkpoint holds is still whole.
        assert _shadow_git(home, repo, "ls-tree", "-r", "--name-only", kept["after"]).split() == [
            ".gitignore",
            "a.txt",
            "b.txt",
            "untracked.txt",
        ]
    finally:
        daemon.stop()


def test_a_checkpoint_past_its_bound_is_recorded_timed_out_and_the_turn_completes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[workspace]\ntimeout_s = 0.5\n")
    repo = make_repo(tmp_path / "repo")
    # The after-capture is held on its thread well past the bound.
    daemon = DaemonProcess(home, failpoints="host.checkpoint.after=once:sleep:3000").start()
    try:
        client = daemon.client()
        sid = create_session(client, cwd=str(repo))["agentSessionId"]
        turn = run_turn(client, sid, "hello")
        assert turn["outcome"] == "completed", turn
        assert turn["workspace"]["state"] == "unavailable", turn["workspace"]
        assert turn["workspace"]["reason"] == "timed_out"
        assert "timeout_s" in turn["workspace"]["message"]
        # The next Turn is checkpointed again (the held capture holds one checkpoint thread of
        # two, and no lock: nothing is stuck behind it).
        nxt = run_turn(client, sid, "again")
        assert nxt["workspace"]["after"], nxt["workspace"]
    finally:
        daemon.stop()


def test_a_folder_older_than_the_racy_margin_is_recorded_exactly_whichever_thread_captures(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """In a folder whose files are older than the captures' racy margin, an unchanged one's
    `after` is taken on the Session actor's thread (`capture_after_here`), a changed one's by
    git on the pool: the records and refs are the same either way (one ref a tree: the quiet
    Turns share the first one's)."""
    repo = make_repo(tmp_path / "repo")
    time.sleep(2.5)  # past the 2 s racy margin: the captures keep a stat snapshot
    client = daemon.client()
    sid = create_session(client, cwd=str(repo))["agentSessionId"]
    shadow = ShadowStore(daemon.home / "checkpoints")

    def refs() -> list[str]:
        return subprocess.run(
            ["git", "for-each-ref", "--format=%(refname) %(objectname)"],
            env={**GIT_ENV, "GIT_DIR": str(shadow.repo_dir(repo))},
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\n")

    quiet = [run_turn(client, sid, "hello") for _ in range(3)]
    trees = {t["workspace"]["before"] for t in quiet} | {t["workspace"]["after"] for t in quiet}
    assert len(trees) == 1 and None not in trees, [t["workspace"] for t in quiet]
    for t in quiet:
        assert t["workspace"]["changedFiles"] == []
    tree = trees.copy().pop()
    assert [r for r in refs() if r] == [f"refs/agenthost/{sid}/+{tree} {tree}"]

    turn_id = submit(client, sid, "/ask go on?")["turnId"]
    request_id = pending_request(client, sid, turn_id)
    (repo / "a.txt").write_text("one, changed again\n")
    respond(client, sid, turn_id, request_id, {"text": "yes"})
    ws = settle(client, sid, turn_id)["workspace"]
    assert ws["before"] in trees and ws["after"] not in trees
    assert ws["changedFiles"] == [{"path": "a.txt", "kind": "modified"}]
    assert f"refs/agenthost/{sid}/+{ws['after']} {ws['after']}" in refs()
    text, _ = shadow.diff(repo, ws["before"], ws["after"])
    assert "+one, changed again" in text


def test_a_folder_holding_the_daemons_home_checkpoints_none_of_the_home(tmp_path: Path) -> None:
    """A Session in a folder that holds the agenthost home (a Session in `~` with the default
    home `~/.local/share/agenthost`): its Turns' checkpoints leave the whole home out — the
    store and its WAL, which every Turn writes, the runtimes, the logs — not only the
    checkpoints, so a quiet Turn lists nothing changed and the shadow index holds no path of
    the home."""
    repo = make_repo(tmp_path / "repo")
    d = DaemonProcess(repo / ".ah").start()  # short: its socket paths have a bound
    try:
        client = d.client()
        sid = create_session(client, cwd=str(repo))["agentSessionId"]
        for text in ("one", "two"):
            turn = run_turn(client, sid, text)
            assert turn["outcome"] == "completed", turn
            assert turn["workspace"]["changedFiles"] == [], turn["workspace"]
        listed = subprocess.run(
            ["git", "ls-files"],
            env={
                **GIT_ENV,
                "GIT_DIR": str(ShadowStore(d.home / "checkpoints").repo_dir(repo)),
                "GIT_WORK_TREE": str(repo),
            },
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert listed and not [p for p in listed if p.startswith(".ah/")], listed
    finally:
        d.stop()
