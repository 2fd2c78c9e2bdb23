"""The binder's fsyncs, counted (issue 20): a bind into a fresh target home fsyncs the copied
file once and every directory whose entries changed exactly once, and the directories only
after the file — created first, fsynced last, so the file's fsync commits the mkdirs and the
directory fsyncs find little left to do. Syncs with no order between them run together (one
journal commit, not one each); a Referenced child's ancestor is still made durable (its
directory fsynced) before the child's name appears. Counts and order, never timings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drivers.binder import RolloutBinder
from tests.drivers.test_rollout_binder import CHILD, PARENT, REL, put, rollout_bytes
from tests.support.fsyncs import counting_fsyncs

pytestmark = pytest.mark.timeout(60)


def _key(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_fresh_target_each_changed_directory_once_after_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src" / "tutti-agent-home"
    put(src, CHILD, rollout_bytes(CHILD, 60))
    runtimes = tmp_path / "runtimes"
    runtimes.mkdir()
    dst = runtimes / "session-1" / "tutti-agent-home"  # nothing of it exists yet
    with counting_fsyncs(monkeypatch) as log:
        receipt = RolloutBinder().bind(src, dst, CHILD)
    target = dst / receipt.rollouts[0].relative_path
    day = target.parent
    changed = [runtimes, dst.parent, dst, dst / "sessions", day.parent.parent, day.parent, day]
    assert day == dst / REL
    assert [log.count(d) for d in changed] == [1] * len(changed)
    assert log.count(target) == 1  # the temp file, renamed onto the target
    assert (log.files, log.dirs) == (1, len(changed))
    # The file first, then every directory: no fsync between two mkdirs.
    assert [is_dir for *_, is_dir in log.calls] == [False] + [True] * len(changed)


def test_referenced_child_ancestor_durable_before_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The law of the rounds: the child's name appears in the target only after the
    ancestor's file and directory are durable; the child's bytes may be fsynced earlier
    (under a temp name, with the ancestor's), and its directory is fsynced after its rename."""
    import drivers.rollout_files as rollout_files

    src = tmp_path / "src" / "tutti-agent-home"
    put(src, PARENT, rollout_bytes(PARENT, 8))
    put(src, CHILD, rollout_bytes(CHILD, 3, start=5, forked_from=PARENT, ordinal_exclusive=5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    events: list[tuple[str, object]] = []
    real_replace = os.replace

    def replace(a: str, b: str) -> None:
        real_replace(a, b)
        events.append(("replace", _key(Path(b))))

    monkeypatch.setattr(rollout_files.os, "replace", replace)
    with counting_fsyncs(monkeypatch) as log:
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            real_fsync(fd)
            st = os.fstat(fd)
            events.append(("fsync", (st.st_dev, st.st_ino)))

        monkeypatch.setattr(os, "fsync", fsync)
        receipt = RolloutBinder().bind(src, dst, CHILD)
    paths = {r.thread_id: dst / r.relative_path for r in receipt.rollouts}
    day = paths[CHILD].parent
    child_named = events.index(("replace", _key(paths[CHILD])))
    before = events[:child_named]
    # Ancestor's bytes, its name, then its directory: all before the child's name exists.
    assert ("fsync", _key(paths[PARENT])) in before
    assert before.index(("replace", _key(paths[PARENT]))) < before.index(("fsync", _key(day)))
    # The child's directory once more after its rename, and nothing else after it.
    assert events[child_named + 1 :] == [("fsync", _key(day))]
    assert log.count(paths[PARENT]) == 1 and log.count(paths[CHILD]) == 1


def test_the_syncs_of_a_round_are_in_flight_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: a Referenced child's two files are fsynced at the same time (neither name
    exists yet), and so are the directories made durable after the ancestor's rename — each
    sync of a round waits at a barrier for the others, which a one-after-the-other bind never
    reaches (the barrier breaks at its timeout, and the bind fails)."""
    import stat
    import threading

    src = tmp_path / "src" / "tutti-agent-home"
    put(src, PARENT, rollout_bytes(PARENT, 8))
    put(src, CHILD, rollout_bytes(CHILD, 3, start=5, forked_from=PARENT, ordinal_exclusive=5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    dst.mkdir(parents=True)  # created: sessions, 2026, 11, 29 → dirs dst, sessions, 2026, 11
    files = threading.Barrier(2, timeout=10)
    dirs = threading.Barrier(5, timeout=10)  # the day (after the rename) and 4 parents
    seen_dirs: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            seen_dirs.append(fd)
            if len(seen_dirs) <= 5:
                dirs.wait()
        else:
            files.wait()
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    receipt = RolloutBinder().bind(src, dst, CHILD)
    assert [r.action.value for r in receipt.rollouts] == ["copied", "copied"]
    assert len(seen_dirs) == 6  # the first round's five, then the day again for the child


def test_each_path_component_is_checked_for_links_once_per_write_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: the symlink checks lstat each home's own ancestors once, and below a home
    only the components under it (the plan, then again right before the write) — not every
    component from the root five times over. A link anywhere is still refused
    (test_rollout_binder's symlink tests)."""
    import drivers.rollout_files as rollout_files

    src = tmp_path / "src" / "tutti-agent-home"
    put(src, CHILD, rollout_bytes(CHILD, 5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    dst.mkdir(parents=True)
    seen: list[str] = []
    real = os.lstat

    def lstat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        seen.append(os.fspath(path))  # type: ignore[arg-type]
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rollout_files.os, "lstat", lstat)
    RolloutBinder().bind(src, dst, CHILD)
    for ancestor in [*tmp_path.parents[:-1], tmp_path]:  # "/" is never looked at
        assert seen.count(str(ancestor)) == 2, ancestor  # once per home
    assert seen.count(str(src)) == 1 and seen.count(str(dst)) == 1
    assert seen.count(str(dst / "sessions")) == 2  # the plan, and right before the write


def test_dirs_ahead_makes_each_created_directory_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivers.rollout_files import DirsAhead

    path = tmp_path / "home" / "sessions" / "2026" / "11"
    with counting_fsyncs(monkeypatch) as log:
        DirsAhead(path).ready()
    assert path.is_dir()
    parents = [tmp_path, tmp_path / "home", tmp_path / "home" / "sessions", path.parent]
    assert [log.count(d) for d in parents] == [1] * 4 and log.dirs == 4


def test_dirs_ahead_that_fails_part_way_still_makes_what_it_created_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure in the background (here the second mkdir) leaves the first directory
    created; `ready()` fsyncs its parent itself before the caller writes anything."""
    from drivers.rollout_files import DirsAhead

    real_mkdir = os.mkdir
    made: list[str] = []

    def mkdir(path: str, mode: int = 0o777) -> None:
        if made:
            raise PermissionError(13, "refused", path)
        real_mkdir(path, mode)
        made.append(path)

    monkeypatch.setattr(os, "mkdir", mkdir)
    path = tmp_path / "a" / "b" / "c"
    with counting_fsyncs(monkeypatch) as log:
        DirsAhead(path).ready()
    assert (tmp_path / "a").is_dir() and not (tmp_path / "a" / "b").exists()
    assert log.count(tmp_path) == 1 and log.dirs == 1


def test_dirs_ahead_creates_nothing_through_a_symlink(tmp_path: Path) -> None:
    from drivers.rollout_files import DirsAhead

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "home").symlink_to(elsewhere)
    DirsAhead(tmp_path / "home" / "sessions" / "2026").ready()
    assert list(elsewhere.iterdir()) == []
