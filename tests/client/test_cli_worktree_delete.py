"""`agenthost delete` of a worktree fork's child as a person runs it: on a terminal it asks
whether to remove the worktree too; a worktree holding work no checkpoint has is refused in
words that name both ways out; `--worktree remove --force` removes it anyway."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.client.test_cli_worktree import as_json, cli
from tests.support.daemon import DaemonProcess
from tests.support.worktree_repos import make_repo

pytestmark = pytest.mark.timeout(120)


def on_tty(home: Path, ws: str, args: list[str], answers: list[bytes]) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, typing each answer after the next `[y/N] ` shows."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost", "--home", str(home), "--workspace", ws, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    seen, typed = b"", 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        if typed < len(answers) and seen.count(b"[y/N] ") > typed:
            time.sleep(0.3)  # after input() reads, not before
            os.write(master, answers[typed])
            typed += 1
    code = proc.wait(timeout=30)
    os.close(master)
    return code, seen.decode(errors="replace")


def fork_child(home: Path, ws: str, sid: str) -> tuple[str, Path]:
    done = cli(home, ws, "fork", sid, "--through", "1", "--worktree")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    child = next(line.split()[1] for line in lines if line.startswith("child "))
    files = next(line for line in lines if line.startswith("files: "))
    return child, Path(files.removeprefix("files: ").partition(" on branch ")[0])


def parser_source(home: Path, ws: str, tmp_path: Path) -> str:
    """A session "Parser" working in a new repository, one turn (it wrote a file) to fork
    through; its id."""
    repo = make_repo(tmp_path / "project")
    sid = as_json(home, ws, "new", "--title", "Parser", "--cwd", str(repo))["session"][
        "agentSessionId"
    ]
    as_json(home, ws, "say", sid, "/write src/app.py print('at turn 1')")
    return str(sid)


def test_delete_asks_about_the_worktree_and_refuses_unsaved_work_in_words(
    daemon: DaemonProcess, ws: str, tmp_path: Path
) -> None:
    home = daemon.home
    sid = parser_source(home, ws, tmp_path)

    kept, kept_tree = fork_child(home, ws, sid)
    code, out = on_tty(home, ws, ["delete", kept], [b"y\n", b"n\n"])
    assert code == 0, out
    assert f"remove its worktree {kept_tree} too? [y/N]" in out
    assert f"worktree kept: {kept_tree} (branch agenthost/" in out
    assert kept_tree.is_dir()

    child, tree = fork_child(home, ws, sid)
    (tree / "scratch.txt").write_text("by hand, after the fork\n")
    code, out = on_tty(home, ws, ["delete", child], [b"y\n", b"y\n"])
    assert code == 1, out
    assert (
        f"agenthost: workspace_worktree_dirty: not deleted: the worktree {tree} holds changes"
        " made after its last checkpoint; keep it (agenthost delete"
    ) in " ".join(out.split())
    assert "--worktree remove --force" in out
    assert tree.is_dir() and as_json(home, ws, "show", child)

    done = cli(home, ws, "delete", child, "--yes", "--worktree", "remove", "--force")
    assert done.returncode == 0, done.stderr
    assert f"worktree {tree} removed" in done.stdout
    assert not tree.exists()


def test_delete_with_remove_keeps_a_worktree_another_session_works_in_and_names_it(
    daemon: DaemonProcess, ws: str, tmp_path: Path
) -> None:
    """A shared fork of the worktree child works in its tree: `--worktree remove` deletes the
    child, keeps the tree and says which session works there; that session goes on."""
    home = daemon.home
    sid = parser_source(home, ws, tmp_path)
    child, tree = fork_child(home, ws, sid)
    as_json(home, ws, "say", child, "/write child.txt from the child")
    shared = cli(home, ws, "fork", child, "--latest")
    assert shared.returncode == 0, shared.stderr
    grandchild = next(
        line.split()[1] for line in shared.stdout.splitlines() if line.startswith("child ")
    )

    done = cli(home, ws, "delete", child, "--yes", "--worktree", "remove", "--force")
    assert done.returncode == 0, done.stderr
    assert f"worktree kept: {tree} (branch agenthost/" in done.stdout
    assert f"other sessions work in it: {grandchild}" in done.stdout
    assert tree.is_dir()
    assert as_json(home, ws, "say", grandchild, "still here")["turn"]["outcome"] == "completed"


def test_delete_says_when_git_could_not_remove_the_worktree(
    daemon: DaemonProcess, ws: str, tmp_path: Path
) -> None:
    """A worktree git cannot remove (a file in it nothing can unlink): the session is deleted
    and the CLI says the worktree could not be removed and why — never "kept" — and
    `agenthost status` names it while the daemon tries again."""
    from tests.support.worktree_repos import make_unremovable

    home = daemon.home
    sid = parser_source(home, ws, tmp_path)
    child, tree = fork_child(home, ws, sid)
    as_json(home, ws, "say", child, "/write child.txt from the child")
    undo = make_unremovable(tree / "child.txt")
    try:
        done = cli(home, ws, "delete", child, "--yes", "--worktree", "remove")
        assert done.returncode == 0, done.stderr
        assert f"worktree {tree} could not be removed: " in done.stdout, done.stdout
        assert "the daemon tries again in the background" in done.stdout
        assert "worktree kept" not in done.stdout
        assert tree.is_dir()
        # `agenthost status` names it while the daemon tries again.
        status = cli(home, ws, "status")
        assert status.returncode == 0, status.stderr
        assert (
            "worktrees being removed: 1 (the daemon tries again in the background)\n"
            f"  {tree}: git could not remove it yet: "
        ) in status.stdout, status.stdout
    finally:
        undo()


def test_status_says_why_each_worktree_is_still_being_removed(tmp_path: Path) -> None:
    """Two trees left `removing`: one a session works in (started there while its child's
    tree was kept, then left `removing` as a kill mid-delete leaves it: the start keeps it),
    one git cannot remove (a file in it nothing can unlink). `agenthost status` names each
    with its reason — the session working there, git's error. Before, both read "git could
    not yet", which for the first was untrue and sent a person after the wrong cause."""
    import apsw

    from tests.support.worktree_repos import make_unremovable

    ws = "ws-status"
    d = DaemonProcess(tmp_path / "home").start()
    try:
        home = d.home
        sid = parser_source(home, ws, tmp_path)
        used, used_tree = fork_child(home, ws, sid)
        assert cli(home, ws, "delete", used, "--yes", "--worktree", "keep").returncode == 0
        user = as_json(home, ws, "new", "--title", "There", "--cwd", str(used_tree))["session"][
            "agentSessionId"
        ]
        d.kill()
        with apsw.Connection(str(home / "store.sqlite3")) as conn:
            conn.execute(
                "UPDATE fork_operations SET workspace_state = 'removing', deleted_tree_path = ?"
                " WHERE target_session_id = ?",
                (str(used_tree), used),
            )
        d.start()
        pinned, pinned_tree = fork_child(home, ws, sid)
        undo = make_unremovable(pinned_tree / "src" / "app.py")
        try:
            done = cli(home, ws, "delete", pinned, "--yes", "--worktree", "remove")
            assert done.returncode == 0, done.stderr
            status = cli(home, ws, "status")
        finally:
            undo()
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        head = "worktrees being removed: 2 (the daemon tries again in the background)"
        assert head in lines, status.stdout
        at = lines.index(head)
        why = dict(line.strip().split(": ", 1) for line in lines[at + 1 : at + 3])
        assert why[str(used_tree)] == f"kept while another session works in it ({user})", why
        error = why[str(pinned_tree)].removeprefix("git could not remove it yet: ")
        assert error != why[str(pinned_tree)] and "app.py" in error, why
    finally:
        d.stop()
