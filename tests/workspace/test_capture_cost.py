"""What a checkpoint costs in git processes, against real git (a logging `git` first on PATH
that runs the real one), and that its shortcuts never answer with a stale tree or HEAD: the
tree the shadow index last wrote is reused only while that index is byte for byte the same
and `ls-files` finds nothing changed; HEAD is read from the repository's files, exact
whatever their timestamps."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import workspace.shadow as shadow_module
from actors.checkpoints import TurnCheckpoints, commit_ref
from tests.support.worktree_repos import git
from workspace.shadow import Checkpoint, ShadowStore

pytestmark = pytest.mark.timeout(60)


class GitLog:
    """Every git process started while it is on PATH, as its arguments after the `-c`s."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def clear(self) -> None:
        self.path.write_text("")

    def commands(self) -> list[str]:
        out = []
        for line in self.path.read_text().splitlines():
            words = line.split("\t")
            while words and words[0] == "-c":
                words = words[2:]
            out.append(words[0] if words else "")
        return out


@pytest.fixture
def git_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GitLog]:
    real = shutil.which("git")
    assert real is not None
    bin_dir = tmp_path / "logging-bin"
    bin_dir.mkdir()
    log = GitLog(tmp_path / "git.log")
    log.clear()
    wrapper = bin_dir / "git"
    wrapper.write_text(
        f"#!/bin/sh\n(IFS='\t'; printf '%s\\n' \"$*\") >> '{log.path}'\nexec '{real}' \"$@\"\n"
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield log


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "project"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "a.txt").write_text("alpha\n")
    (r / "b.txt").write_text("bravo\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "first")
    return r


def shadow_files(store: ShadowStore, cwd: Path, tree: str) -> dict[str, str]:
    """The files of a checkpoint as the shadow store holds them."""
    env = {**os.environ, "GIT_DIR": str(store.repo_dir(cwd))}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", "-z", tree],
        env=env,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return {
        n: subprocess.run(
            ["git", "cat-file", "blob", f"{tree}:{n}"], env=env, check=True, capture_output=True
        ).stdout.decode()
        for n in names.split("\0")
        if n
    }


def capture(store: ShadowStore, cwd: Path) -> Checkpoint:
    cp = store.capture(cwd)
    assert isinstance(cp, Checkpoint), cp
    return cp


def test_the_next_turns_before_with_nothing_changed_starts_only_ls_files(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    turns = TurnCheckpoints(store)
    try:
        first = turns.capture(str(repo), "s1", "t1", "before").result(30)
        assert isinstance(first.checkpoint, Checkpoint)
        (repo / "a.txt").write_text("alpha, edited by the turn\n")
        after = turns.capture(str(repo), "s1", "t1", "after", first.checkpoint.tree).result(30)
        assert isinstance(after.checkpoint, Checkpoint)
        assert after.changed == ({"path": "a.txt", "kind": "modified"},)

        git_log.clear()
        nxt = turns.capture(str(repo), "s1", "t2", "before").result(30)
        assert git_log.commands() == ["ls-files"]
        assert isinstance(nxt.checkpoint, Checkpoint)
        assert nxt.checkpoint.tree == after.checkpoint.tree
        assert nxt.checkpoint.head_commit == git(repo, "rev-parse", "HEAD")
        assert nxt.checkpoint.repo_root == os.path.realpath(repo)
    finally:
        turns.pool.shutdown()
    # The refs were written as git reads them.
    shadow = {"GIT_DIR": str(store.repo_dir(repo))}
    for tree in [first.checkpoint.tree, after.checkpoint.tree]:
        ref = f"refs/agenthost/{commit_ref('s1', tree)}"
        got = subprocess.run(
            ["git", "rev-parse", ref], env={**os.environ, **shadow}, capture_output=True, text=True
        )
        assert got.stdout.strip() == tree
    # One ref a tree per Session: t2's `before` is t1's `after`, kept by the same ref.
    assert sorted(store.refs(repo)) == sorted(
        commit_ref("s1", t) for t in (first.checkpoint.tree, after.checkpoint.tree)
    )


def test_a_change_of_same_size_and_same_mtime_is_still_captured(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """git's index compares ctime, inode and size as well as mtime, and compares the content
    of a file whose mtime is not older than the index (its racy-index rule): the shortcut
    starts from that answer, so a rewrite that keeps the size and puts the mtime back is
    still seen, within the same second as the index or long after it."""
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    target = repo / "a.txt"
    for when in ("now", "an hour ago"):
        if when == "an hour ago":
            old = target.stat().st_mtime_ns - 3600 * 10**9
            os.utime(target, ns=(old, old))
        first = capture(store, repo)
        again = capture(store, repo)
        assert again.tree == first.tree
        before = target.stat()
        content = target.read_text()
        changed = content[:-2] + ("Z" if content[-2] != "Z" else "Y") + "\n"
        assert len(changed) == len(content)
        target.write_text(changed)
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert target.stat().st_mtime_ns == before.st_mtime_ns
        assert target.stat().st_size == before.st_size
        seen = capture(store, repo)
        assert seen.tree != first.tree, when
        assert shadow_files(store, repo, seen.tree)["a.txt"] == changed


def test_the_reused_tree_follows_any_change_of_the_shadow_index(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """A shadow index changed behind the store's back (here: a file dropped from it and newly
    excluded, so `ls-files` finds nothing to add) is a new key: its own tree is written."""
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    first = capture(store, repo)
    assert set(shadow_files(store, repo, first.tree)) == {"a.txt", "b.txt"}
    shadow = store.repo_dir(repo)
    subprocess.run(
        ["git", "rm", "-q", "--cached", "b.txt"],
        cwd=repo,
        env={**os.environ, "GIT_DIR": str(shadow), "GIT_WORK_TREE": str(repo)},
        check=True,
    )
    store.excludes = (*store.excludes, "/b.txt")
    git_log.clear()
    later = capture(store, repo)
    # The second `ls-files`: the store's excludes changed, so what they now ignore is asked.
    assert git_log.commands() == ["ls-files", "ls-files", "write-tree"]
    assert set(shadow_files(store, repo, later.tree)) == {"a.txt"}
    git_log.clear()
    assert capture(store, repo).tree == later.tree
    assert git_log.commands() == ["ls-files"]


def test_the_shadow_repository_is_checked_once_and_mended_when_changed_behind_the_store(
    tmp_path: Path, repo: Path, git_log: GitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git is looked for on PATH once per store, and a directory's shadow repository and
    exclude file are checked in full once: later captures take them on the word of one stat.
    An exclude file rewritten behind the store's back, or a repository removed, fails that
    stat's comparison and is mended before the capture (nothing excluded gets captured)."""
    import workspace.git as git_module

    looked_up: list[str | None] = []
    real_binary = git_module.git_binary

    def counting() -> str | None:
        looked_up.append(found := real_binary())
        return found

    monkeypatch.setattr(git_module, "git_binary", counting)
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    (repo / ".env").write_text("SECRET=1\n")
    first = capture(store, repo)
    capture(store, repo)
    assert len(looked_up) == 1
    exclude = store.repo_dir(repo) / "info" / "exclude"
    wanted = exclude.read_text()
    assert ".env" in wanted.splitlines()
    assert ".env" not in shadow_files(store, repo, first.tree)

    exclude.write_text("# emptied by someone else\n")
    (repo / "c.txt").write_text("charlie\n")
    again = capture(store, repo)
    assert exclude.read_text() == wanted
    assert set(shadow_files(store, repo, again.tree)) == {"a.txt", "b.txt", "c.txt"}

    shutil.rmtree(store.repo_dir(repo))
    git_log.clear()
    remade = capture(store, repo)
    assert "init" in git_log.commands()
    assert exclude.read_text() == wanted
    assert set(shadow_files(store, repo, remade.tree)) == {"a.txt", "b.txt", "c.txt"}
    assert len(looked_up) == 1


def test_head_is_read_from_the_repository_files_exactly(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """Commits, a branch switch, a detached HEAD, packed refs, a linked worktree and a
    repository made around a plain folder: each capture's HEAD and top are git's, and git is
    asked where the repository lies only once per directory (or when a `.git` changes)."""
    store = ShadowStore(tmp_path / "home" / "checkpoints")

    def check(cwd: Path, top: Path | None) -> list[str]:
        git_log.clear()
        cp = capture(store, cwd)
        commands = git_log.commands()
        if top is None:
            assert (cp.head_commit, cp.repo_root) == (None, None)
        else:
            assert cp.repo_root == os.path.realpath(top)
            heads = subprocess.run(
                ["git", "rev-parse", "--verify", "-q", "HEAD"],
                cwd=cwd,
                capture_output=True,
                text=True,
            ).stdout.strip()
            assert cp.head_commit == (heads or None)
        return commands

    assert "rev-parse" in check(repo, repo)
    assert "rev-parse" not in check(repo, repo)
    (repo / "c.txt").write_text("charlie\n")
    git(repo, "add", "c.txt")
    git(repo, "commit", "-q", "-m", "second")
    assert "rev-parse" not in check(repo, repo)
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "d.txt").write_text("delta\n")
    git(repo, "add", "d.txt")
    git(repo, "commit", "-q", "-m", "third")
    assert "rev-parse" not in check(repo, repo)
    git(repo, "checkout", "-q", "--detach", "main")
    assert "rev-parse" not in check(repo, repo)
    git(repo, "checkout", "-q", "other")
    git(repo, "pack-refs", "--all", "--prune")
    assert not (repo / ".git" / "refs" / "heads" / "other").exists()
    assert "rev-parse" not in check(repo, repo)
    git(repo, "checkout", "-q", "--orphan", "unborn")
    assert "rev-parse" not in check(repo, repo)
    git(repo, "checkout", "-q", "-f", "main")

    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked), "other")
    check(linked, linked)
    (linked / "e.txt").write_text("echo\n")
    git(linked, "add", "e.txt")
    git(linked, "commit", "-q", "-m", "on side")
    assert "rev-parse" not in check(linked, linked)
    (repo / "sub").mkdir()
    assert "rev-parse" in check(repo / "sub", repo)
    assert "rev-parse" not in check(repo / "sub", repo)

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "f.txt").write_text("foxtrot\n")
    check(plain, None)
    assert "rev-parse" not in check(plain, None)
    git(plain, "init", "-q", "-b", "main")
    assert "rev-parse" in check(plain, plain)
    git(plain, "add", "f.txt")
    git(plain, "commit", "-q", "-m", "first")
    assert "rev-parse" not in check(plain, plain)
    nested = plain / "inner"
    nested.mkdir()
    git(nested, "init", "-q", "-b", "main")
    (nested / "g.txt").write_text("golf\n")
    assert "rev-parse" in check(nested, nested)


def test_a_kept_ref_respects_a_lock_left_behind(tmp_path: Path, repo: Path) -> None:
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    cp = capture(store, repo)
    store.keep(repo, "s/t/before", cp.commit)
    lock = store.repo_dir(repo) / "refs" / "agenthost" / "s" / "t" / "after.lock"
    lock.write_text("")
    with pytest.raises(Exception, match="lock"):
        store.keep(repo, "s/t/after", cp.commit)
    assert store.refs(repo) == ["s/t/before"]
    assert store.clear_stale_locks(repo) == 1
    store.keep(repo, "s/t/after", cp.commit)
    assert sorted(store.refs(repo)) == ["s/t/after", "s/t/before"]


def test_an_empty_folder_captured_again_starts_only_ls_files(
    tmp_path: Path, git_log: GitLog
) -> None:
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    empty = tmp_path / "empty"
    empty.mkdir()
    first = capture(store, empty)
    git_log.clear()
    assert capture(store, empty).tree == first.tree
    assert git_log.commands() == ["ls-files"]
    (empty / "new.txt").write_text("new\n")
    later = capture(store, empty)
    assert shadow_files(store, empty, later.tree) == {"new.txt": "new\n"}
    (empty / "new.txt").unlink()
    assert capture(store, empty).tree == first.tree


def test_a_reused_tree_outlives_a_collection_with_no_ref_kept(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """`git gc` keeps what the shadow index names (its cached trees too), so a tree reused
    after a collection that no ref kept is still in the store, whole."""
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    (repo / "sub").mkdir()
    (repo / "sub" / "c.txt").write_text("charlie\n")
    first = capture(store, repo)
    store.gc(repo)
    git_log.clear()
    again = capture(store, repo)
    assert git_log.commands() == ["ls-files"]
    assert again.tree == first.tree and store.has(repo, again.tree)
    store.keep(repo, "s/t/before", again.commit)
    out = store.materialize(repo, again.commit, tmp_path / "out")
    assert (out / "sub" / "c.txt").read_text() == "charlie\n"
    assert (out / "a.txt").read_text() == "alpha\n"


MARGIN_NS = 50_000_000
"""The racy margin these tests give a store: files older than it are taken on their stat."""


def aged_store(tmp_path: Path) -> ShadowStore:
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    store.racy_margin_ns = MARGIN_NS
    return store


def age() -> None:
    """Let everything written so far become older than the racy margin."""
    time.sleep(2 * MARGIN_NS / 1e9)


def test_a_directory_unchanged_since_a_clean_capture_starts_no_git(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """Once a capture found the directory's entries older than the racy margin, the next
    capture with not one of them changed answers the same tree (and HEAD) without git; the
    tree's ref is written without git too (the repository's refs read from its files)."""
    (repo / "sub").mkdir()
    (repo / "sub" / "c.txt").write_text("charlie\n")
    age()
    store = aged_store(tmp_path)
    first = capture(store, repo)
    git_log.clear()
    again = capture(store, repo)
    assert git_log.commands() == []
    assert again == first
    assert again.head_commit == git(repo, "rev-parse", "HEAD")
    git_log.clear()
    turns = TurnCheckpoints(store)
    try:
        kept = turns.capture(str(repo), "s1", "t1", "after", first.tree).result(30)
    finally:
        turns.pool.shutdown()
    assert isinstance(kept.checkpoint, Checkpoint) and kept.checkpoint.tree == first.tree
    assert kept.changed == ()
    assert git_log.commands() == []
    assert store.refs(repo) == [commit_ref("s1", first.tree)]


@pytest.mark.parametrize(
    "change",
    [
        "rewrite_same_size_same_mtime",
        "new_file_in_subdirectory",
        "new_file_in_new_directory",
        "delete",
        "chmod",
        "replace_by_rename",
        "gitignore_unignores",
    ],
)
def test_any_change_after_a_clean_capture_is_captured_by_git(
    tmp_path: Path, repo: Path, git_log: GitLog, change: str
) -> None:
    """Whatever changed — a rewrite that keeps the size and puts the mtime back, a file added
    in a directory or a new one below it, one deleted, a mode changed, a file replaced by a
    rename, a `.gitignore` that no longer ignores a file — the capture after it asks git and
    holds the files as they are; and while the changed entries are younger than the racy
    margin, no capture takes them on their stat."""
    (repo / "sub").mkdir()
    (repo / "sub" / "c.txt").write_text("charlie\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "sub" / "kept.log").write_text("log\n")
    age()
    store = aged_store(tmp_path)
    first = capture(store, repo)
    assert "sub/kept.log" not in shadow_files(store, repo, first.tree)
    git_log.clear()
    assert capture(store, repo) == first
    assert git_log.commands() == []
    expected = shadow_files(store, repo, first.tree)
    target = repo / "sub" / "c.txt"
    if change == "rewrite_same_size_same_mtime":
        before = target.stat()
        target.write_text("charliE\n")
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert target.stat().st_mtime_ns == before.st_mtime_ns
        expected["sub/c.txt"] = "charliE\n"
    elif change == "new_file_in_subdirectory":
        (repo / "sub" / "d.txt").write_text("delta\n")
        expected["sub/d.txt"] = "delta\n"
    elif change == "new_file_in_new_directory":
        (repo / "sub" / "deep").mkdir()
        (repo / "sub" / "deep" / "e.txt").write_text("echo\n")
        expected["sub/deep/e.txt"] = "echo\n"
    elif change == "delete":
        target.unlink()
        del expected["sub/c.txt"]
    elif change == "chmod":
        target.chmod(0o755)
    elif change == "replace_by_rename":
        (repo / "sub" / "tmp").write_text("charlX\n")
        os.utime(repo / "sub" / "tmp", ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns))
        os.replace(repo / "sub" / "tmp", target)
        expected["sub/c.txt"] = "charlX\n"
    elif change == "gitignore_unignores":
        (repo / ".gitignore").write_text("*.tmp\n")
        expected[".gitignore"] = "*.tmp\n"
        expected["sub/kept.log"] = "log\n"
    git_log.clear()
    seen = capture(store, repo)
    assert git_log.commands()[:1] == ["ls-files"]
    assert seen.tree != first.tree
    assert shadow_files(store, repo, seen.tree) == expected
    if change == "chmod":
        listing = subprocess.run(
            ["git", "ls-tree", "-r", seen.tree],
            env={**os.environ, "GIT_DIR": str(store.repo_dir(repo))},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "100755 blob" in listing and "sub/c.txt" in listing, listing
    assert capture(store, repo).tree == seen.tree
    age()
    # Once the changed entries are old enough, the next capture takes the snapshot (a walk
    # that found them young is retried then, not backed off) and the one after uses it.
    assert capture(store, repo).tree == seen.tree
    git_log.clear()
    assert capture(store, repo).tree == seen.tree
    assert git_log.commands() == []


def test_entries_changed_within_the_racy_margin_are_never_taken_on_their_stat(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """A file changed within the racy margin of a capture could change again within the
    filesystem clock's granularity and keep its stat: while one is that young, every capture
    asks git."""
    store = ShadowStore(tmp_path / "home" / "checkpoints")
    store.racy_margin_ns = 3600 * 10**9
    first = capture(store, repo)
    for _ in range(3):
        git_log.clear()
        assert capture(store, repo).tree == first.tree
        assert git_log.commands() == ["ls-files"]


def test_excluded_directories_are_not_walked_and_large_trees_are_left_to_git(
    tmp_path: Path, repo: Path, git_log: GitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the excludes leave out (`node_modules/`, the checkpoints themselves) may change
    without a capture asking git; a file over the size limit, or a tree of more entries than
    a snapshot holds, leaves no snapshot (git is asked every time)."""
    (repo / "node_modules").mkdir()
    age()
    store = aged_store(tmp_path)
    first = capture(store, repo)
    (repo / "node_modules" / "dep.js").write_text("x\n")
    git_log.clear()
    assert capture(store, repo) == first
    assert git_log.commands() == []

    store.size_limit = 3
    (repo / "big.txt").write_text("too large\n")
    age()
    capture(store, repo)
    git_log.clear()
    assert capture(store, repo).too_large == ("big.txt",)
    assert git_log.commands()[:1] == ["ls-files"]

    monkeypatch.setattr(shadow_module, "STAT_WALK_LIMIT", 3)
    small = aged_store(tmp_path / "other")
    capture(small, repo)
    git_log.clear()
    capture(small, repo)
    assert git_log.commands()[:1] == ["ls-files"]


def test_a_gitignore_that_re_includes_leaves_no_snapshot(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """A `.gitignore` negation takes precedence over the shadow repository's excludes, so a
    directory they name (`build/`) may be captured after all: with one, nothing is taken on
    a snapshot that did not walk it, and a change inside it is captured."""
    (repo / ".gitignore").write_text("!build/\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.txt").write_text("one\n")
    age()
    store = aged_store(tmp_path)
    first = capture(store, repo)
    assert shadow_files(store, repo, first.tree)["build/out.txt"] == "one\n"
    (repo / "build" / "out.txt").write_text("two\n")
    git_log.clear()
    seen = capture(store, repo)
    assert git_log.commands()[:1] == ["ls-files"]
    assert shadow_files(store, repo, seen.tree)["build/out.txt"] == "two\n"


def test_a_negation_that_cannot_re_include_a_skipped_directory_keeps_the_snapshot(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """`!keep.txt` (no wildcard, no skipped directory's name) cannot re-include anything
    below `build/` or `node_modules/`: the snapshot is taken and used."""
    (repo / ".gitignore").write_text("*.txt\n!keep.txt\n")
    (repo / "keep.txt").write_text("kept\n")
    age()
    store = aged_store(tmp_path)
    first = capture(store, repo)
    assert shadow_files(store, repo, first.tree)["keep.txt"] == "kept\n"
    git_log.clear()
    assert capture(store, repo) == first
    assert git_log.commands() == []
    for pattern in ("!*.log\n", "!node_modules\n"):
        (repo / ".gitignore").write_text(pattern)
        age()
        for _ in range(shadow_module.SNAPSHOT_BACKOFF_MAX + 4):
            git_log.clear()
            capture(store, repo)
            assert git_log.commands()[:1] == ["ls-files"], pattern


def test_a_repository_inside_leaves_no_snapshot(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """A repository inside the directory is captured as its HEAD (a gitlink), which a commit
    there changes without changing any entry a snapshot would walk: with one, every capture
    asks git, and the new HEAD is captured."""
    inner = repo / "inner"
    inner.mkdir()
    git(inner, "init", "-q", "-b", "main")
    (inner / "x.txt").write_text("x\n")
    git(inner, "add", "-A")
    git(inner, "commit", "-q", "-m", "one")
    age()
    store = aged_store(tmp_path)
    first = capture(store, repo)
    git(inner, "commit", "-q", "--allow-empty", "-m", "two")
    head = git(inner, "rev-parse", "HEAD")
    age()
    git_log.clear()
    seen = capture(store, repo)
    assert git_log.commands()[:1] == ["ls-files"]
    listing = subprocess.run(
        ["git", "ls-tree", seen.tree, "inner"],
        env={**os.environ, "GIT_DIR": str(store.repo_dir(repo))},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert head in listing and seen.tree != first.tree, listing


def test_a_snapshot_follows_a_shadow_index_changed_behind_the_store(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """The snapshot holds the key of the shadow index its tree is written in: any other
    writer of that index (a second store on the same home) makes the next capture ask git."""
    age()
    store = aged_store(tmp_path)
    first = capture(store, repo)
    other = aged_store(tmp_path)
    (repo / "n.txt").write_text("november\n")
    capture(other, repo)
    (repo / "n.txt").unlink()
    age()
    git_log.clear()
    again = capture(store, repo)
    assert git_log.commands()[:1] == ["ls-files"]
    assert again.tree == first.tree


def test_a_directory_changed_before_every_capture_is_walked_ever_more_rarely(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk that served no capture makes the next captures skip it, twice as many each
    time up to a bound: a directory an agent rewrites between every two captures costs few
    walks. A walk that met an entry too young to take is retried once that entry is old
    enough, not sooner: rewritten just before every capture, the directory is walked about
    once per racy margin."""
    walks: list[str] = []
    real_walk = shadow_module._stat_walk

    def counting(*args: object, **kwargs: object) -> object:
        walks.append("walk")
        return real_walk(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shadow_module, "_stat_walk", counting)
    age()
    store = aged_store(tmp_path)
    for i in range(20):
        (repo / "a.txt").write_text(f"alpha {i}\n")
        age()  # old enough to be taken: each snapshot is then invalidated by the next change
        cp = capture(store, repo)
        assert shadow_files(store, repo, cp.tree)["a.txt"] == f"alpha {i}\n"
    assert 1 <= len(walks) <= 6, walks

    walks.clear()
    young = aged_store(tmp_path / "young")
    young.racy_margin_ns = 10 * 10**9
    for i in range(20):
        (repo / "a.txt").write_text(f"bravo {i}\n")
        cp = capture(young, repo)
        assert shadow_files(young, repo, cp.tree)["a.txt"] == f"bravo {i}\n"
    assert len(walks) == 1, walks


def test_a_discarded_before_drops_the_tree_ref_it_wrote_and_no_other_turns(
    tmp_path: Path, repo: Path, git_log: GitLog
) -> None:
    """A `before` discarded (its Turn never created) drops the tree ref its capture wrote,
    and leaves one it found already there (an earlier Turn's tree), or one another Turn
    named since; `git gc` packing the refs leaves them known to the next store."""
    age()
    store = aged_store(tmp_path)
    turns = TurnCheckpoints(store)
    try:
        before = turns.capture(str(repo), "s1", "t1", "before").result(30)
        assert isinstance(before.checkpoint, Checkpoint)
        (repo / "a.txt").write_text("alpha, changed\n")
        after = turns.capture(str(repo), "s1", "t1", "after", before.checkpoint.tree).result(30)
        assert isinstance(after.checkpoint, Checkpoint)
        turns.settled("s1", "t1")
        kept = sorted(commit_ref("s1", c.tree) for c in (before.checkpoint, after.checkpoint))
        assert sorted(store.refs(repo)) == kept

        # The folder unchanged: the discarded `before` names t1's `after`, which stays.
        early = turns.capture(str(repo), "s1", "t2", "before")
        turns.discard(early, str(repo), "s1", "t2", "before")
        early.result(30)
        # Changed: the discarded `before` wrote its tree's ref, and drops it.
        (repo / "b.txt").write_text("bravo, changed\n")
        late = turns.capture(str(repo), "s1", "t3", "before")
        turns.discard(late, str(repo), "s1", "t3", "before")
        new_tree = late.result(30).checkpoint.tree  # type: ignore[union-attr]
        deadline = time.monotonic() + 20
        while commit_ref("s1", new_tree) in store.refs(repo) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(store.refs(repo)) == kept

        # Written by a capture then named by another Turn: the discard leaves it.
        (repo / "b.txt").write_text("bravo, again\n")
        shared = turns.capture(str(repo), "s1", "t4", "before")
        tree = shared.result(30).checkpoint.tree  # type: ignore[union-attr]
        turns.capture(str(repo), "s1", "t5", "before").result(30)
        turns.discard(shared, str(repo), "s1", "t4", "before")
    finally:
        turns.pool.shutdown(wait=True)  # the discard's job runs first
    assert commit_ref("s1", tree) in store.refs(repo)
    store.gc(repo)
    assert not any((store.repo_dir(repo) / "refs" / "agenthost").rglob("+*"))  # packed
    again = aged_store(tmp_path)
    again.capture(repo)
    git_log.clear()
    assert not again.keep_commit(repo, commit_ref("s1", tree), tree)
    assert git_log.commands() == []


def test_a_checked_repository_is_taken_on_one_stat_of_its_held_exclude_path(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once checked, `_repo` and `capture_unchanged` look at the exclude file by the path
    string held with the repository: the look builds no `Path` (two a Turn before: turnall),
    and an exclude file rewritten behind the store's back is still mended."""
    import pathlib

    store = ShadowStore(tmp_path / "home" / "checkpoints")
    capture(store, repo)
    real = os.path.realpath(repo)
    shadow = store.repo_dir(repo)
    built: list[object] = []
    join = pathlib.PurePath.__truediv__

    def counting(self: pathlib.PurePath, key: str) -> pathlib.PurePath:
        built.append(key)
        return join(self, key)

    monkeypatch.setattr(pathlib.PurePath, "__truediv__", counting)
    assert store._repo(store._git(), repo, real) == shadow
    store.capture_unchanged(repo, real, 1000)
    assert built == []
    monkeypatch.undo()
    exclude = store.repo_dir(repo) / "info" / "exclude"
    wanted = exclude.read_text()
    exclude.write_text("# emptied by someone else\n")
    store._repo(store._git(), repo, real)
    assert exclude.read_text() == wanted
