"""What a Turn's captures of an unchanged folder ask of the kernel, call by call: in a busy
daemon each call lets the interpreter go and takes it back (docs/performance.md, ckpt), so a
`stat`, an `open` or a Python file object no law needs is a cost of the checkpoint thread.
The calls are counted where Python makes them (`os.*` and `open`), on the `before` and
`after` jobs as the pool runs them."""

from __future__ import annotations

import builtins
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import actors.checkpoints as checkpoints_module
from actors.checkpoints import TurnCheckpoints
from tests.workspace.test_capture_cost import age, aged_store, repo
from workspace.shadow import Checkpoint

pytestmark = pytest.mark.timeout(60)

__all__ = ["repo"]  # the fixture, used by name

COUNTED = ("lstat", "stat", "open", "pread", "fstat", "mkdir", "replace", "fdopen", "write")


class Calls:
    """Every counted call made while installed: `(name, path or descriptor)`; `open` is the
    builtin (a Python file object), the rest are `os`'s."""

    def __init__(self) -> None:
        self.made: list[tuple[str, object]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                first = args[0] if args else None
                self.made.append((name, first if isinstance(first, int) else os.fspath(first)))
                return real(*args, **kwargs)

            return call

        for name in COUNTED:
            if name == "open":
                monkeypatch.setattr(builtins, "open", counting("open", builtins.open))
            monkeypatch.setattr(os, name, counting(f"os.{name}", getattr(os, name)))

    def named(self, name: str) -> list[object]:
        return [arg for n, arg in self.made if n == name]


@pytest.fixture
def turns(tmp_path: Path, repo: Path) -> Iterator[TurnCheckpoints]:
    """A home's checkpoints with `repo` aged and captured on the pool until its stat snapshot
    answers (the state of every Turn's captures in a folder nobody edits)."""
    age()
    t = TurnCheckpoints(aged_store(tmp_path))
    try:
        for turn in ("t0", "t1"):
            got = t.capture(str(repo), "s1", turn, "before").result(30)
            assert isinstance(got.checkpoint, Checkpoint)
        yield t
    finally:
        t.pool.shutdown(wait=True)


def test_an_unchanged_capture_reads_the_index_key_with_four_calls_and_no_file_object(
    turns: TurnCheckpoints, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shadow index's key (its size and checksum) is `open`, `fstat`, `pread`, `close`:
    no Python file object (which adds an `fstat`, an `ioctl` and two `lseek`s)."""
    index = str(turns.shadow.repo_dir(repo) / "index")
    calls = Calls()
    calls.install(monkeypatch)
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    monkeypatch.undo()
    assert isinstance(got.checkpoint, Checkpoint)
    assert index not in calls.named("open")
    assert calls.named("os.open").count(index) == 1
    assert len(calls.named("os.pread")) == 1


def test_a_turn_on_an_unchanged_folder_writes_no_file_for_its_checkpoints(
    turns: TurnCheckpoints, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Turn whose folder nobody changed names the tree its previous Turn kept, whose ref
    is there: its `before` and its `after` (on the pool, or on the asking thread) open no
    file under the checkpoint store to write, make no directory, rename nothing and write
    nothing, and start no git (the refs a repository holds are known in memory)."""
    home = str(turns.shadow.root)
    calls = Calls()
    calls.install(monkeypatch)
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    tree = got.checkpoint.tree
    after = turns.capture(str(repo), "s1", "t2", "after", tree).result(30)
    got = turns.capture(str(repo), "s1", "t3", "before").result(30)
    here = turns.capture_after_here(str(repo), "s1", "t3", tree)
    monkeypatch.undo()
    assert isinstance(after.checkpoint, Checkpoint) and after.checkpoint.tree == tree
    assert here is not None and here.checkpoint == after.checkpoint
    opened = [p for p in calls.named("os.open") if str(p).startswith(home)]
    index = str(turns.shadow.repo_dir(repo) / "index")
    assert set(opened) == {index}  # the index's key, read only
    assert calls.named("os.mkdir") == []
    assert calls.named("os.replace") == []
    assert calls.named("os.write") == []


def test_a_changed_folders_ref_is_one_write_to_its_lock_and_a_rename_with_no_file_object(
    turns: TurnCheckpoints, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed folder's `after` writes its tree's one ref (no directory of the Turn's):
    written to the lock's descriptor, then renamed, no `os.fdopen` (a file object's `fstat`,
    `ioctl` and `lseek`)."""
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    (repo / "a.txt").write_text("alpha, changed by the turn\n")
    calls = Calls()
    calls.install(monkeypatch)
    after = turns.capture(str(repo), "s1", "t2", "after", got.checkpoint.tree).result(30)
    monkeypatch.undo()
    assert isinstance(after.checkpoint, Checkpoint)
    assert calls.named("os.fdopen") == []
    refs = turns.shadow.repo_dir(repo) / "refs" / "agenthost" / "s1"
    tree = after.checkpoint.commit
    assert calls.named("os.replace") == [str(refs / f"+{tree}.lock")]
    assert calls.named("os.mkdir") == []  # the Session's directory is there
    assert (refs / f"+{tree}").read_text() == tree + "\n"


def test_a_capture_job_of_a_known_unchanged_folder_looks_at_the_folder_and_the_exclude_once(
    turns: TurnCheckpoints, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Turn's `before` and `after` jobs: the folder is not `stat`ed for `is_dir` (the
    snapshot's `lstat` of it answers), and its shadow repository's exclude file is `stat`ed
    once a job (the capture's look; the `keep` after it, under the same hold of the folder's
    lock, takes the repository as the capture found it)."""
    real = os.path.realpath(repo)
    exclude = str(turns.shadow.repo_dir(repo) / "info" / "exclude")
    calls = Calls()
    calls.install(monkeypatch)
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    after = turns.capture(str(repo), "s1", "t2", "after", got.checkpoint.tree).result(30)
    monkeypatch.undo()
    assert isinstance(after.checkpoint, Checkpoint)
    stats = calls.named("os.stat")
    assert stats.count(real) == 0
    assert stats.count(exclude) == 0  # the snapshot's `lstat` of it: the next test
    # Two a job: the folder resolved (`realpath`'s last step) and the snapshot's key.
    assert calls.named("os.lstat").count(real) == 4


def test_a_known_folder_removed_is_still_recorded_missing(
    turns: TurnCheckpoints, repo: Path
) -> None:
    """The `is_dir` the snapshot saves is still asked when the snapshot does not answer: a
    folder removed after its captures is `cwd_missing`, as an unknown one is, and no ref is
    kept for it."""
    moved = repo.with_name("elsewhere")
    repo.rename(moved)
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    assert got.checkpoint.reason == "cwd_missing"  # type: ignore[union-attr]
    assert "does not exist" in got.checkpoint.message  # type: ignore[union-attr]
    moved.rename(repo)
    assert turns.shadow.refs(repo) == [f"s1/+{turns.shadow.capture(repo).commit}"]  # type: ignore[union-attr]


def test_a_paused_folders_after_is_refused_without_resolving_it(
    turns: TurnCheckpoints, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder whose last captures on the asking thread were slow (`HERE_BUDGET_S`) has its
    `after`s sent to the pool for a while; that refusal, on the Session actor's thread,
    makes no system call (the folder is not resolved for it: its pool job resolves it)."""
    monkeypatch.setattr(checkpoints_module, "HERE_BUDGET_S", 0.0)
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    for _ in range(checkpoints_module.HERE_SLOW_RUN):
        assert turns.capture_after_here(str(repo), "s1", "t2", got.checkpoint.tree) is not None
    got = turns.capture(str(repo), "s1", "t3", "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    calls = Calls()
    calls.install(monkeypatch)
    refused = turns.capture_after_here(str(repo), "s1", "t3", got.checkpoint.tree)
    made = list(calls.made)
    monkeypatch.undo()
    assert refused is None
    assert made == []


def test_a_snapshot_that_answers_checks_the_shadow_repository_by_its_lstat_alone(
    turns: TurnCheckpoints, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shadow repository's exclude file is one of the stat snapshot's keys: a capture
    the snapshot answers (pool or here) looks at it once, by that `lstat`, with no `stat`
    of it (`_repo`'s signature)."""
    exclude = str(turns.shadow.repo_dir(repo) / "info" / "exclude")
    calls = Calls()
    calls.install(monkeypatch)
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    here = turns.capture_after_here(str(repo), "s1", "t2", got.checkpoint.tree)
    monkeypatch.undo()
    assert here is not None
    assert exclude not in calls.named("os.stat")
    assert calls.named("os.lstat").count(exclude) == 2


def test_an_exclude_file_rewritten_under_a_snapshot_is_mended_before_the_capture(
    turns: TurnCheckpoints, repo: Path
) -> None:
    """The snapshot that stands for the `_repo` look fails on any rewrite of the exclude
    file: the capture then mends the file and asks git, and what it excludes stays out."""
    exclude = turns.shadow.repo_dir(repo) / "info" / "exclude"
    wanted = exclude.read_text()
    (repo / ".env").write_text("SECRET=1\n")
    exclude.write_text("# emptied by someone else\n")
    got = turns.capture(str(repo), "s1", "t2", "before").result(30)
    assert isinstance(got.checkpoint, Checkpoint)
    assert exclude.read_text() == wanted
    env = {**os.environ, "GIT_DIR": str(turns.shadow.repo_dir(repo))}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", got.checkpoint.tree],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert ".env" not in names and "a.txt" in names
    assert turns.capture_after_here(str(repo), "s1", "t2", got.checkpoint.tree) is None
