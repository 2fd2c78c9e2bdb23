"""Workspace checkpoints against real git and real repositories made here: what a checkpoint
captures (the user's .gitignore, the default excludes, the size limit, binary files, symlinks,
untracked and deleted files), that it never writes the user's repository, and that its files
come back byte for byte (materialize), as changes and diffs, and in place (restore)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.git_wrappers import SUBCOMMAND
from tests.support.worktree_repos import BINARY, git
from workspace.shadow import ChangeKind, Checkpoint, ShadowStore, Unavailable

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A user's repository: committed files, a .gitignore with an ignored directory, a
    binary file, a symlink, a big file, then uncommitted work (modified, untracked, deleted)."""
    r = tmp_path / "project"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / ".gitignore").write_text("ignored/\n*.log\n")
    (r / "src").mkdir()
    (r / "src" / "app.py").write_text("print('v1')\n")
    (r / "doomed.txt").write_text("to be deleted\n")
    (r / "logo.bin").write_bytes(BINARY)
    (r / "link").symlink_to("src/app.py")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "first")
    (r / "src" / "app.py").write_text("print('v2')\n")
    (r / "notes.md").write_text("untracked\n")
    (r / "doomed.txt").unlink()
    (r / "ignored").mkdir()
    (r / "ignored" / "cache.dat").write_text("not captured\n")
    (r / "run.log").write_text("not captured\n")
    (r / "node_modules").mkdir()
    (r / "node_modules" / "dep.js").write_text("excluded by default\n")
    (r / ".env").write_text("SECRET=1\n")
    (r / "big.dat").write_bytes(b"x" * 2048)
    return r


@pytest.fixture
def store(tmp_path: Path) -> ShadowStore:
    return ShadowStore(tmp_path / "home" / "checkpoints", size_limit=1024)


def tree_files(root: Path) -> dict[str, bytes | str]:
    """Every file and symlink under `root` (not `.git`): bytes, or `-> target` for links."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes()
    return out


def repo_state(r: Path) -> dict[str, str]:
    """What of the user's repository a checkpoint must never change."""
    gitdir = r / ".git"
    refs = git(r, "for-each-ref", "--format=%(refname) %(objectname)")
    return {
        "HEAD": (gitdir / "HEAD").read_text(),
        "head_commit": git(r, "rev-parse", "HEAD"),
        "index": hashlib.sha256((gitdir / "index").read_bytes()).hexdigest(),
        "refs": refs,
        "config": (gitdir / "config").read_text(),
        "stash": git(r, "stash", "list"),
        "status": git(r, "status", "--porcelain", "--ignored"),
    }


def test_checkpoint_captures_what_git_would_see_and_leaves_the_repository_alone(
    repo: Path, store: ShadowStore, tmp_path: Path
) -> None:
    before = repo_state(repo)
    cp = store.capture(repo)
    assert isinstance(cp, Checkpoint), cp
    assert repo_state(repo) == before
    assert cp.head_commit == git(repo, "rev-parse", "HEAD")
    assert cp.repo_root == str(repo.resolve())
    assert cp.too_large == ("big.dat",)
    out = store.materialize(repo, cp.commit, tmp_path / "copy")
    expected = {
        k: v
        for k, v in tree_files(repo).items()
        if not k.startswith(("ignored/", "node_modules/"))
        and k not in ("run.log", ".env", "big.dat")
    }
    assert tree_files(out) == expected
    assert (out / "logo.bin").read_bytes() == BINARY and (out / "link").is_symlink()
    assert "doomed.txt" not in tree_files(out)


def test_unchanged_tree_gives_the_same_checkpoint_and_changes_are_listed(
    repo: Path, store: ShadowStore
) -> None:
    first = store.capture(repo)
    again = store.capture(repo)
    assert isinstance(first, Checkpoint) and isinstance(again, Checkpoint)
    assert again.tree == first.tree
    (repo / "src" / "app.py").write_text("print('v3')\n")
    (repo / "notes.md").unlink()
    (repo / "new.txt").write_text("new\n")
    (repo / "logo.bin").write_bytes(BINARY[::-1])
    later = store.capture(repo)
    assert isinstance(later, Checkpoint)
    changes = {c.path: c.kind for c in store.changed_files(repo, first.commit, later.commit)}
    assert changes == {
        "src/app.py": ChangeKind.MODIFIED,
        "notes.md": ChangeKind.DELETED,
        "new.txt": ChangeKind.ADDED,
        "logo.bin": ChangeKind.MODIFIED,
    }
    text, truncated = store.diff(repo, first.commit, later.commit)
    assert not truncated
    assert "-print('v2')" in text and "+print('v3')" in text
    assert "Binary files" in text
    _, cut = store.diff(repo, first.commit, later.commit, max_bytes=10)
    assert cut


def test_restore_puts_the_files_back_and_can_itself_be_undone(
    repo: Path, store: ShadowStore
) -> None:
    start = store.capture(repo)
    assert isinstance(start, Checkpoint)
    wanted = tree_files(repo)
    (repo / "src" / "app.py").write_text("broken by the agent\n")
    (repo / "src" / "extra").mkdir()
    (repo / "src" / "extra" / "gen.py").write_text("generated\n")
    (repo / "notes.md").unlink()
    (repo / "link").unlink()
    (repo / "link").write_text("a file where the link was\n")
    (repo / "ignored" / "cache.dat").write_text("changed, but never captured\n")
    damaged = tree_files(repo)
    undo = store.restore(repo, start.commit, "s1/restore-1/before")
    assert isinstance(undo, Checkpoint)
    restored = tree_files(repo)
    assert restored == {**wanted, "ignored/cache.dat": damaged["ignored/cache.dat"]}
    assert not (repo / "src" / "extra").exists()
    # The restore's own checkpoint brings the damaged state back.
    store.restore(repo, undo.commit, "s1/restore-2/before")
    assert tree_files(repo) == damaged


def test_refs_keep_checkpoints_until_dropped_and_collected(repo: Path, store: ShadowStore) -> None:
    cp = store.capture(repo)
    assert isinstance(cp, Checkpoint)
    store.keep(repo, "s1/t1/after", cp.commit)
    (repo / "src" / "app.py").write_text("only in a dropped checkpoint\n")
    gone = store.capture(repo)
    assert isinstance(gone, Checkpoint)
    store.keep(repo, "s2/t1/after", gone.commit)
    # The shadow index keeps the newest state too: move it on before collecting.
    (repo / "src" / "app.py").write_text("print('v2')\n")
    store.capture(repo)
    assert store.drop(repo, "s2") == 1
    store.gc(repo)
    repo_dir = store.repo_dir(repo)
    env = {**os.environ, "GIT_DIR": str(repo_dir), "GIT_CONFIG_NOSYSTEM": "1"}

    def exists(obj: str) -> bool:
        return (
            subprocess.run(["git", "cat-file", "-e", obj], env=env, capture_output=True).returncode
            == 0
        )

    assert exists(cp.commit)
    assert not exists(gone.commit)


def test_unavailable_is_a_reason_not_an_exception(tmp_path: Path) -> None:
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    missing = store.capture(tmp_path / "nowhere")
    assert isinstance(missing, Unavailable) and missing.reason == "cwd_missing"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("a\n")
    cp = store.capture(plain)
    assert isinstance(cp, Checkpoint) and cp.head_commit is None and cp.repo_root is None
    slow = ShadowStore(tmp_path / "home" / "slow", timeout_s=0.000001)
    timed = slow.capture(plain)
    assert isinstance(timed, Unavailable) and timed.reason == "timed_out"


def test_a_workspace_holding_the_home_never_checkpoints_the_checkpoints(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    store = ShadowStore(work / ".agenthost" / "checkpoints")
    first = store.capture(work)
    second = store.capture(work)
    assert isinstance(first, Checkpoint) and isinstance(second, Checkpoint)
    assert first.tree == second.tree
    out = store.materialize(work, second.commit, tmp_path / "out")
    assert tree_files(out) == {"a.txt": b"a\n"}


def test_lock_files_a_killed_process_left_are_cleared(repo: Path, store: ShadowStore) -> None:
    first = store.capture(repo)
    assert isinstance(first, Checkpoint)
    store.keep(repo, "s/t/after", first.commit)
    shadow = store.repo_dir(repo)
    index_lock = shadow / "index.lock"
    ref_lock = shadow / "refs" / "agenthost" / "s" / "t" / "before.lock"
    index_lock.write_text("")
    ref_lock.write_text("")
    assert store.clear_stale_locks(repo) == 2
    (repo / "late.txt").write_text("after the kill\n")
    again = store.capture(repo)
    assert isinstance(again, Checkpoint) and again.tree != first.tree
    store.keep(repo, "s/t/before", again.commit)
    # A capture refused on a lock (its git met one) answers `git_failed` and removes the
    # repository's lock files: the folder's next capture is not refused on them.
    index_lock.write_text("")
    ref_lock.write_text("")
    (repo / "later.txt").write_text("after another kill\n")
    stuck = store.capture(repo)
    assert isinstance(stuck, Unavailable) and stuck.reason == "git_failed"
    assert not index_lock.exists() and not ref_lock.exists()
    last = store.capture(repo)
    assert isinstance(last, Checkpoint) and last.tree != again.tree


_VANISHING_GIT = (
    SUBCOMMAND
    + """\
# The real git, except that the next `add` of a shadow repository first sees the file named
# in {arm} deleted (as a build's temp file or an editor's swap file goes between the listing
# and the add); once.
if [ "$sub" = add ] && [ -n "$GIT_DIR" ] && [ -e "{arm}" ]; then
  read -r doomed < "{arm}"
  rm -f "{arm}" "$doomed"
fi
exec "{real}" "$@"
"""
)


def test_a_file_deleted_between_the_listing_and_the_add_does_not_fail_the_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An untracked file listed by the capture's `ls-files` and gone by its `add` (a build's
    temp file, an editor's swap file: the folder is live while a Turn settles) is simply not
    in the checkpoint. Before, `add` failed on its pathspec ("did not match any files") and
    the whole checkpoint was `unavailable: git_failed` — a Turn's `after` lost, no worktree
    fork through it."""
    import shutil as _shutil

    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    assert isinstance(store.capture(work), Checkpoint)
    (work / "b.txt").write_text("b\n")
    (work / "swap.tmp").write_text("a moment\n")
    bin_dir, arm = tmp_path / "bin", tmp_path / "arm"
    bin_dir.mkdir()
    real = _shutil.which("git")
    assert real is not None
    script = bin_dir / "git"
    script.write_text(_VANISHING_GIT.format(arm=arm, real=real))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    arm.write_text(f"{work / 'swap.tmp'}\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")  # finds the wrapper on PATH
    cp = store.capture(work)
    assert not arm.exists(), "the wrapper never ran: the test proves nothing"
    assert isinstance(cp, Checkpoint), cp
    assert sorted(os.listdir(store.materialize(work, cp.tree, tmp_path / "out"))) == [
        "a.txt",
        "b.txt",
    ]


_FILTERING_GIT = (
    SUBCOMMAND
    + """\
# The real git, except that the next `add` of a shadow repository runs with the clean filter
# `vanish` (which the folder's .gitattributes names for first.txt) set to {filter}: while git
# indexes first.txt, the file named in {arm} is deleted, after git listed it and before it
# reads it (a folder written while it is captured); once.
if [ "$sub" = add ] && [ -n "$GIT_DIR" ] && [ -e "{arm}" ]; then
  exec "{real}" -c filter.vanish.clean="{filter}" "$@"
fi
exec "{real}" "$@"
"""
)

_VANISH_FILTER = """#!/bin/sh
if [ -e "{arm}" ]; then
  read -r doomed < "{arm}"
  rm -f "{arm}" "$doomed"
fi
exec cat
"""


@pytest.mark.parametrize("tracked", [False, True], ids=["untracked", "tracked"])
def test_a_file_deleted_while_the_add_runs_does_not_fail_the_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracked: bool
) -> None:
    """A file the capture's `add` found (listed, matched) and that is gone when git reads it
    — deleted while the `add` runs — is simply not in the checkpoint (a tracked one recorded
    deleted). Before, git stopped on it ("unable to stat ...: No such file or directory") and
    the whole checkpoint was `unavailable: git_failed`."""
    import shutil as _shutil

    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    (work / ".gitattributes").write_text("first.txt filter=vanish\n")
    if tracked:
        (work / "first.txt").write_text("1\n")
        (work / "z-doomed.txt").write_text("z\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    assert isinstance(store.capture(work), Checkpoint)
    (work / "first.txt").write_text("first, now\n")
    (work / "z-doomed.txt").write_text("a moment\n")
    bin_dir, arm = tmp_path / "bin", tmp_path / "arm"
    bin_dir.mkdir()
    real = _shutil.which("git")
    assert real is not None
    vanish = tmp_path / "vanish.sh"
    vanish.write_text(_VANISH_FILTER.format(arm=arm))
    vanish.chmod(0o755)
    script = bin_dir / "git"
    script.write_text(_FILTERING_GIT.format(arm=arm, real=real, filter=vanish))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    arm.write_text(f"{work / 'z-doomed.txt'}\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")  # finds the wrapper on PATH
    cp = store.capture(work)
    assert not arm.exists(), "the filter never ran: the test proves nothing"
    assert isinstance(cp, Checkpoint), cp
    out = store.materialize(work, cp.tree, tmp_path / "out")
    assert sorted(os.listdir(out)) == [".gitattributes", "a.txt", "first.txt"]
    assert (out / "first.txt").read_text() == "first, now\n"


_OPEN_FAILING_GIT = (
    SUBCOMMAND
    + """\
# The real git, except that in the next `add` of a shadow repository the file named in {arm}
# (relative to the folder) is gone when git opens it, after git's `lstat` found it: its open
# answers ENOENT (strace's fault injection, matched by path), and the file is then deleted
# (`{keep}` = 1: kept, a failure that is not a vanished file); once.
if [ "$sub" = add ] && [ -n "$GIT_DIR" ] && [ -e "{arm}" ]; then
  read -r doomed < "{arm}"
  rm -f "{arm}"
  "{strace}" -f -qq -o /dev/null -P "$doomed" -e trace=openat \\
    -e inject=openat:error=ENOENT "{real}" "$@"
  rc=$?
  [ "{keep}" = 1 ] || rm -f "$doomed"
  exit $rc
fi
exec "{real}" "$@"
"""
)


def _strace_injects(tmp_path: Path) -> str:
    """strace's path, where it can inject a fault into a child (ptrace allowed); else skip."""
    import shutil as _shutil

    strace = _shutil.which("strace")
    if strace is None:
        pytest.skip("no strace: cannot make a file vanish between git's lstat and open")
    probe = tmp_path / "probe"
    probe.write_text("p\n")
    done = subprocess.run(
        [strace, "-qq", "-o", "/dev/null", "-P", str(probe), "-e", "trace=openat"]
        + ["-e", "inject=openat:error=ENOENT", "cat", str(probe)],
        capture_output=True,
        check=False,
    )
    if done.returncode == 0 or b"No such file" not in done.stderr:
        pytest.skip(f"strace cannot inject here: {done.stderr.decode(errors='replace')[:200]}")
    return strace


@pytest.mark.parametrize("gone", [True, False], ids=["gone", "still-there"])
def test_a_file_gone_between_gits_lstat_and_open_does_not_fail_the_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gone: bool
) -> None:
    """A file the capture's `add` found by its `lstat` and that is gone when git opens it to
    hash it (`error: open("…"): No such file or directory`, then `unable to index file`) is
    simply not in the checkpoint: the listing and the add are tried again without it. An open
    that fails so while the file is still there is a real failure (`git_failed`). Before, the
    first case failed the whole capture too (`unavailable: git_failed`)."""
    import shutil as _shutil

    strace = _strace_injects(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    (work / "b.txt").write_text("b\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    assert isinstance(store.capture(work), Checkpoint)
    (work / "doomed.txt").write_text("a moment\n")
    (work / "b.txt").write_text("b, now\n")
    bin_dir, arm = tmp_path / "bin", tmp_path / "arm"
    bin_dir.mkdir()
    real = _shutil.which("git")
    assert real is not None
    script = bin_dir / "git"
    script.write_text(
        _OPEN_FAILING_GIT.format(arm=arm, real=real, strace=strace, keep=0 if gone else 1)
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    arm.write_text("doomed.txt\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")  # finds the wrapper on PATH
    cp = store.capture(work)
    assert not arm.exists(), "the wrapper never ran: the test proves nothing"
    assert (work / "doomed.txt").exists() is not gone
    if not gone:
        assert isinstance(cp, Unavailable) and cp.reason == "git_failed", cp
        return
    assert isinstance(cp, Checkpoint), cp
    out = store.materialize(work, cp.tree, tmp_path / "out")
    assert sorted(os.listdir(out)) == ["a.txt", "b.txt"]
    assert (out / "b.txt").read_text() == "b, now\n"


_SWAPPING_GIT = (
    SUBCOMMAND
    + """\
# The real git, except that the next `read-tree` of a shadow repository first sees the
# directory named in {arm} replaced by a symlink to {outside} (someone else writing the folder
# while a restore runs); once.
if [ "$sub" = read-tree ] && [ -n "$GIT_DIR" ] && [ -e "{arm}" ]; then
  read -r swapped < "{arm}"
  rm -rf "{arm}" "$swapped"
  ln -s "{outside}" "$swapped"
fi
exec "{real}" "$@"
"""
)


def test_a_restore_never_removes_a_file_through_a_symlink_made_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory replaced by a symlink to a folder of the person's after the restore's own
    checkpoint (a tool, a forced restore beside another Session's Turn): the files the restore
    removes are removed in the folder, never through that symlink. Before, the restore
    unlinked the person's file of the same name in the symlink's target."""
    import shutil as _shutil

    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("k\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("the person's own\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    target = store.capture(work)
    assert isinstance(target, Checkpoint)
    (work / "d").mkdir()
    (work / "d" / "x.txt").write_text("to be undone\n")
    bin_dir, arm = tmp_path / "bin", tmp_path / "arm"
    bin_dir.mkdir()
    real = _shutil.which("git")
    assert real is not None
    script = bin_dir / "git"
    script.write_text(_SWAPPING_GIT.format(arm=arm, real=real, outside=outside))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    arm.write_text(f"{work / 'd'}\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")  # finds the wrapper on PATH
    undo = store.restore(work, target.commit, "s/restore-1/before")
    assert not arm.exists(), "the wrapper never ran: the test proves nothing"
    assert isinstance(undo, Checkpoint), undo
    assert (outside / "x.txt").read_text() == "the person's own\n"


def test_a_captured_file_grown_past_the_size_limit_is_left_out_not_failing_every_capture(
    tmp_path: Path,
) -> None:
    """A file captured while small that grows past the size limit (a database, a log the
    Turn's program writes) leaves the next checkpoints and is listed `tooLarge`. Before,
    `git rm --cached` refused it (the shadow index has no HEAD: its captured content differs
    from both) and every capture of the folder was `unavailable: git_failed` while it stayed
    that large."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    (work / "app.db").write_bytes(b"x" * 500)
    store = ShadowStore(tmp_path / "home" / "checkpoints", size_limit=1024)
    first = store.capture(work)
    assert isinstance(first, Checkpoint)
    (work / "app.db").write_bytes(b"y" * 2000)
    (work / "a.txt").write_text("a2\n")
    for _ in range(2):
        cp = store.capture(work)
        assert isinstance(cp, Checkpoint), cp
        assert cp.too_large == ("app.db",) or "app.db" in cp.too_large
        changes = {(c.path, c.kind) for c in store.changed_files(work, first.tree, cp.tree)}
        assert changes == {("a.txt", ChangeKind.MODIFIED), ("app.db", ChangeKind.DELETED)}


def test_a_file_ignored_after_its_first_capture_leaves_the_next_checkpoints(
    tmp_path: Path,
) -> None:
    """The person's `.gitignore` respected for a file it names only after a checkpoint took
    it (as for one ignored from the start): it leaves the next checkpoints. Before, the
    shadow index kept it tracked and every later checkpoint captured its new contents."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    (work / "secret.json").write_text("v1\n")
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    first = store.capture(work)
    assert isinstance(first, Checkpoint)
    (work / ".gitignore").write_text("secret.json\n")
    (work / "secret.json").write_text("v2\n")
    cp = store.capture(work)
    assert isinstance(cp, Checkpoint), cp
    changes = {(c.path, c.kind) for c in store.changed_files(work, first.tree, cp.tree)}
    assert changes == {(".gitignore", ChangeKind.ADDED), ("secret.json", ChangeKind.DELETED)}
    (work / "secret.json").write_text("v3\n")
    again = store.capture(work)
    assert isinstance(again, Checkpoint) and again.tree == cp.tree
