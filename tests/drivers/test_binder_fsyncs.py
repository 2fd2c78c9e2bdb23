"""The binder's fsyncs, counted: a bind into a fresh target home fsyncs the copied
file once and every directory whose entries changed exactly once,
in two rounds whatever the number of files: every file's bytes and every new directory
together, then — after the renames, ancestors first — every target's directory together. No
name appears before every byte is durable. Syncs with no order between them run together (one
journal commit, not one each). Counts and order, never timings."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from drivers.binder import RolloutBinder
from tests.drivers.test_rollout_binder import CHILD, PARENT, REL, put, rollout_bytes
from tests.support.fsyncs import counting_fsyncs

pytestmark = pytest.mark.timeout(60)


def _key(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, int]]]:
    """("fsync", inode) and ("replace", target inode) in the order they ended."""
    events: list[tuple[str, tuple[int, int]]] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(a: str, b: str) -> None:
        real_replace(a, b)
        events.append(("replace", _key(Path(b))))

    def fsync(fd: int) -> None:
        real_fsync(fd)
        st = os.fstat(fd)
        events.append(("fsync", (st.st_dev, st.st_ino)))

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    return events


def _rounds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The width of every `sync_together` round, in order."""
    import drivers.binder as binder_module

    widths: list[int] = []
    real = binder_module.sync_together

    def sync_together(calls: Sequence[Callable[[], None]]) -> None:
        widths.append(len(calls))
        real(calls)

    monkeypatch.setattr(binder_module, "sync_together", sync_together)
    return widths


def test_fresh_target_each_changed_directory_once_after_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src" / "tutti-agent-home"
    put(src, CHILD, rollout_bytes(CHILD, 60))
    runtimes = tmp_path / "runtimes"
    runtimes.mkdir()
    dst = runtimes / "session-1" / "tutti-agent-home"  # nothing of it exists yet
    with counting_fsyncs(monkeypatch) as log:
        events = _events(monkeypatch)
        receipt = RolloutBinder().bind(src, dst, CHILD)
    target = dst / receipt.rollouts[0].relative_path
    day = target.parent
    created_parents = [runtimes, dst.parent, dst, dst / "sessions", day.parent.parent, day.parent]
    changed = [*created_parents, day]
    assert day == dst / REL
    assert [log.count(d) for d in changed] == [1] * len(changed)
    assert log.count(target) == 1  # the temp file, renamed onto the target
    assert (log.files, log.dirs) == (1, len(changed))
    # The file's bytes and every new directory durable before the name; then only its
    # directory, after the rename.
    named = events.index(("replace", _key(target)))
    assert {key for _, key in events[:named]} == {_key(p) for p in [target, *created_parents]}
    assert events[named + 1 :] == [("fsync", _key(day))]


def test_referenced_child_binds_in_two_rounds_every_name_after_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The law of the rounds: no name appears in the target before the bytes of every file
    are durable (round 1: both files and every new directory, together); the names appear
    ancestor first; round 2 fsyncs their directories together. Two rounds, for any number of
    files: `SYNC_ROUNDS`, what bench.sync_floor counts."""
    from drivers.binder import SYNC_ROUNDS

    src = tmp_path / "src" / "tutti-agent-home"
    put(src, PARENT, rollout_bytes(PARENT, 8))
    put(src, CHILD, rollout_bytes(CHILD, 3, start=5, forked_from=PARENT, ordinal_exclusive=5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    dst.mkdir(parents=True)  # created by the bind: sessions, 2026, 11, 29
    with counting_fsyncs(monkeypatch) as log:
        events = _events(monkeypatch)
        widths = _rounds(monkeypatch)
        receipt = RolloutBinder().bind(src, dst, CHILD)
    paths = {r.thread_id: dst / r.relative_path for r in receipt.rollouts}
    day = paths[CHILD].parent
    parents = [dst, dst / "sessions", dst / "sessions" / "2026", day.parent]
    first_name = events.index(("replace", _key(paths[PARENT])))
    assert events.index(("replace", _key(paths[CHILD]))) == first_name + 1  # ancestor first
    before = {key for _, key in events[:first_name]}
    assert before == {_key(p) for p in [paths[PARENT], paths[CHILD], *parents]}
    assert events[first_name + 2 :] == [("fsync", _key(day))]  # one directory, both names
    assert log.count(paths[PARENT]) == 1 and log.count(paths[CHILD]) == 1
    assert widths == [2 + len(parents), 1] and len(widths) == SYNC_ROUNDS


def test_a_grandchild_in_three_directories_still_binds_in_two_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivers.binder import SYNC_ROUNDS

    src = tmp_path / "src" / "tutti-agent-home"
    grand = "01a228cc-0000-7000-8000-000000000001"
    put(src, grand, rollout_bytes(grand, 4), rel=Path("sessions/2026/11/27"))
    put(
        src,
        PARENT,
        rollout_bytes(PARENT, 3, start=4, forked_from=grand, ordinal_exclusive=4),
        rel=Path("sessions/2026/11/28"),
    )
    put(src, CHILD, rollout_bytes(CHILD, 2, start=7, forked_from=PARENT, ordinal_exclusive=7))
    dst = tmp_path / "dst" / "tutti-agent-home"
    with counting_fsyncs(monkeypatch) as log:
        widths = _rounds(monkeypatch)
        RolloutBinder().bind(src, dst, CHILD)
    assert len(widths) == SYNC_ROUNDS == 2
    assert widths[1] == 3  # the three days' directories, together
    assert log.files == 3


def test_the_syncs_of_a_round_are_in_flight_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Referenced child's two files and the four directories the bind creates are fsynced
    at the same time (no name exists yet): each sync of the round waits at a barrier for the
    others, which a bind that ordered any of them never reaches (the barrier breaks at its
    timeout, and the bind fails). Then the day's directory once, after both renames."""
    import stat
    import threading

    src = tmp_path / "src" / "tutti-agent-home"
    put(src, PARENT, rollout_bytes(PARENT, 8))
    put(src, CHILD, rollout_bytes(CHILD, 3, start=5, forked_from=PARENT, ordinal_exclusive=5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    dst.mkdir(parents=True)  # created: sessions, 2026, 11, 29 → dirs dst, sessions, 2026, 11
    first = threading.Barrier(6, timeout=10)
    seen: list[bool] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        if len(seen) <= 6:
            first.wait()
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    receipt = RolloutBinder().bind(src, dst, CHILD)
    assert [r.action.value for r in receipt.rollouts] == ["copied", "copied"]
    assert sorted(seen[:6]) == [False, False, True, True, True, True]
    assert seen[6:] == [True]  # the day, once, for both names


def _spy_stats(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every `os.lstat` and `os.stat` call (`os.path.exists`/`isdir` included) as
    ("lstat" | "stat", path), in order: each one reaches the kernel (a spy, not a mock)."""
    calls: list[tuple[str, str]] = []
    real_lstat, real_stat = os.lstat, os.stat

    def lstat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        calls.append(("lstat", os.fspath(path)))  # type: ignore[arg-type]
        return real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]

    def stat_(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if not isinstance(path, int):
            calls.append(("stat", os.fspath(path)))  # type: ignore[arg-type]
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "stat", stat_)
    return calls


def test_each_path_component_is_checked_for_links_once_per_bind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The symlink checks lstat the homes' ancestors once per bind, shared ones once for both
    homes (the source and target homes are siblings under the daemon's runtimes); below a
    home nothing is lstat'ed but a path about to be written, right before the write — the
    lookup's walk descends no link and the reads open with `O_NOFOLLOW`. A link anywhere is
    still refused (test_rollout_binder's symlink tests)."""
    src = tmp_path / "src" / "tutti-agent-home"
    source = put(src, CHILD, rollout_bytes(CHILD, 5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    dst.mkdir(parents=True)
    calls = _spy_stats(monkeypatch)
    RolloutBinder().bind(src, dst, CHILD)
    seen = [path for kind, path in calls if kind == "lstat"]
    for ancestor in [*tmp_path.parents[:-1], tmp_path]:  # "/" is never looked at
        assert seen.count(str(ancestor)) == 1, ancestor  # once for both homes
    assert seen.count(str(src)) == 1 and seen.count(str(dst)) == 1
    below_source = [p for p in seen if p.startswith(str(src) + "/")]
    # The lookup's one `lstat` of each rollout root; the source's own path never.
    assert below_source == [str(src / "sessions"), str(src / "archived_sessions")], below_source
    assert str(source) not in seen
    # The target's components: only right before the write (the lookup's root lstat aside;
    # the check stops at `sessions`, missing: nothing below it can be a link yet).
    assert seen.count(str(dst / "sessions")) == 2


def test_the_lookup_stats_each_root_once_and_refuses_no_less(tmp_path: Path) -> None:
    """`rollout_matches` takes each root's type from one `lstat` (not `isdir` + `islink`):
    a missing root, a root that is a link (to a directory or not) and a home that is a
    file hold nothing, as before."""
    from drivers.binder import rollout_matches

    home = tmp_path / "home"
    put(home, CHILD, b"x")
    assert [p.name for p in rollout_matches(home, CHILD)] == [
        f"rollout-2026-11-29T19-33-09-{CHILD}.jsonl"
    ]
    other = tmp_path / "other"
    put(other, CHILD, b"x")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "sessions").symlink_to(other / "sessions")
    (linked / "archived_sessions").symlink_to(other / "missing")
    assert rollout_matches(linked, CHILD) == []
    afile = tmp_path / "afile"
    afile.write_bytes(b"")
    assert rollout_matches(afile, CHILD) == []


def test_the_lookup_stats_each_root_with_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivers.binder import rollout_matches

    home = tmp_path / "home"
    put(home, CHILD, b"x")
    calls = _spy_stats(monkeypatch)
    rollout_matches(home, CHILD)
    assert calls == [
        ("lstat", str(home / "sessions")),
        ("lstat", str(home / "archived_sessions")),
    ]


def test_dirs_ahead_walks_the_chain_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`DirsAhead` creates from the first missing component its symlink check met: each
    component is `lstat`ed once, down to the first missing one, and nothing is `stat`ed
    again on the way up (the check's walk and an `exists` probe up the chain were two)."""
    from drivers.binder import DirsAhead

    home = tmp_path / "runtimes" / "session-1" / "tutti-agent-home"
    (tmp_path / "runtimes").mkdir()
    path = home / "sessions" / "2026" / "11" / "29"
    calls = _spy_stats(monkeypatch)
    with counting_fsyncs(monkeypatch) as log:
        DirsAhead(path).ready()
    made = list(calls)
    assert path.is_dir()
    assert [kind for kind, _ in made] == ["lstat"] * len(made)
    paths = [p for _, p in made]
    assert paths == [*(str(a) for a in reversed(tmp_path.parents[:-1])), str(tmp_path)] + [
        str(tmp_path / "runtimes"),
        str(tmp_path / "runtimes" / "session-1"),  # the first missing: created from here
    ]
    assert log.dirs == 6  # runtimes, session-1, home, sessions, 2026, 11: each once
    # Nothing missing: nothing created, nothing fsynced.
    calls.clear()
    with counting_fsyncs(monkeypatch) as again:
        DirsAhead(path).ready()
    assert again.total == 0 and all(kind == "lstat" for kind, _ in calls)


def test_a_source_gone_since_the_lookup_is_missing_not_an_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's path is no longer `lstat`ed before its read: a source removed between
    the lookup and the read is still `source_rollout_missing`."""
    import drivers.binder as binder_module
    from drivers.binder import BinderError, BindFailure

    src = tmp_path / "src" / "tutti-agent-home"
    source = put(src, CHILD, rollout_bytes(CHILD, 5))
    real = binder_module.rollout_paths

    def lookup(home: str, thread_id: str) -> list[str]:
        found = real(home, thread_id)
        if home == str(src) and source.exists():
            source.unlink()
        return found

    monkeypatch.setattr(binder_module, "rollout_paths", lookup)
    with pytest.raises(BinderError) as refused:
        RolloutBinder().bind(src, tmp_path / "dst", CHILD)
    assert refused.value.failure is BindFailure.SOURCE_ROLLOUT_MISSING
    assert not (tmp_path / "dst").exists()


def test_dirs_ahead_makes_each_created_directory_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivers.binder import DirsAhead

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
    from drivers.binder import DirsAhead

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
    from drivers.binder import DirsAhead

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "home").symlink_to(elsewhere)
    DirsAhead(tmp_path / "home" / "sessions" / "2026").ready()
    assert list(elsewhere.iterdir()) == []


def test_begin_returns_with_the_names_in_place_and_their_sync_still_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`RolloutBinder.begin` of a large write (`NAMES_BACKGROUND_MIN_BYTES` or more) leaves the
    last round (the names' directories) running on the names' pool: the files are there and
    readable by name (what the readability proof needs) before it ends; `wait()` returns
    only after it."""
    import stat
    import threading

    import drivers.binder as binder_module

    monkeypatch.setattr(binder_module, "NAMES_BACKGROUND_MIN_BYTES", 0)  # every write is large
    src = tmp_path / "src" / "tutti-agent-home"
    put(src, PARENT, rollout_bytes(PARENT, 8))
    put(src, CHILD, rollout_bytes(CHILD, 3, start=5, forked_from=PARENT, ordinal_exclusive=5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    (dst / REL).mkdir(parents=True)
    release, ended = threading.Event(), threading.Event()
    real = os.fsync

    started = threading.Event()
    syncers: list[str] = []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            syncers.append(threading.current_thread().name)
            started.set()
            assert release.wait(20)
            real(fd)
            ended.set()
            return
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    receipt, names = RolloutBinder().begin(src, dst, CHILD)
    assert not ended.is_set()  # the day's fsync is held: begin did not wait for it
    assert started.wait(20)  # running already, nobody waiting: in the background
    assert syncers == [syncers[0]] and syncers[0].startswith("names-sync")
    for r in receipt.rollouts:
        assert (dst / r.relative_path).read_bytes() == (src / r.relative_path).read_bytes()
    waiter = threading.Thread(target=names.wait)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # wait() waits for the round
    release.set()
    waiter.join(20)
    assert not waiter.is_alive() and ended.is_set()


def test_a_small_bind_s_names_are_synced_by_the_thread_that_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind under `NAMES_BACKGROUND_MIN_BYTES` (a warm fork's child) hands its names' round
    to no other thread: `begin` returns with no directory fsynced, `wait()` fsyncs the names'
    directory once on the calling thread, a second `wait()` nothing. (Handed to the names'
    pool, the round cost the worker ~0.1 ms of CPU per warm fork at 16 clients — the submit,
    the future, the pool thread's wake-ups — where the proof it overlapped is shorter than
    the fsync; forkproc.)"""
    import stat
    import threading

    src = tmp_path / "src" / "tutti-agent-home"
    put(src, PARENT, rollout_bytes(PARENT, 8))
    put(src, CHILD, rollout_bytes(CHILD, 3, start=5, forked_from=PARENT, ordinal_exclusive=5))
    dst = tmp_path / "dst" / "tutti-agent-home"
    (dst / REL).mkdir(parents=True)
    real = os.fsync
    syncers: list[tuple[str, tuple[int, int]]] = []

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            syncers.append((threading.current_thread().name, (st.st_dev, st.st_ino)))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _, names = RolloutBinder().begin(src, dst, CHILD)
    assert syncers == []  # nothing ran the names' round yet, on any thread
    names.wait()
    assert syncers == [(threading.current_thread().name, _key(dst / REL))]
    names.wait()
    assert len(syncers) == 1


def _fsync_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of every `os.fsync`, in order (installed after `counting_fsyncs`, wraps it)."""
    import threading

    idents: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        idents.append(threading.get_ident())
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return idents


def test_dirs_ahead_fsyncs_every_created_parent_once_on_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh target home's chain (home, sessions, year, month, day under an existing
    runtimes directory) is made durable by five syncs, each parent once, all on the thread
    that calls `DirsAhead` (the fork's, while the provider works): no `sync_together`
    round — its hand-offs to the sync threads cost the worker more CPU per fork at 16
    clients than the overlap saved (docs/performance.md, forkw)."""
    import threading

    from drivers.binder import DirsAhead

    widths = _rounds(monkeypatch)
    path = tmp_path / "home" / "sessions" / "2026" / "12" / "02"
    with counting_fsyncs(monkeypatch) as log:
        threads = _fsync_threads(monkeypatch)
        DirsAhead(path).ready()
    assert widths == []
    assert threads == [threading.get_ident()] * 5
    parents = [tmp_path, *(path.parents[k] for k in range(3, -1, -1))]
    assert [log.count(d) for d in parents] == [1] * 5 and log.dirs == 5
    # Already there: nothing created, nothing synced.
    widths.clear()
    DirsAhead(path).ready()
    assert widths in ([], [0])


@pytest.mark.parametrize("failing", [0, 2])
def test_a_rounds_error_is_raised_once_every_sync_of_it_has_ended(failing: int) -> None:
    """`sync_together` raises the first error only after every sync of the round ended, the
    one on the caller's thread (0) or one on the sync threads (2) failing: a caller that
    fails closed never leaves a sync of its round running behind it."""
    import threading

    from drivers.binder import sync_together

    ended: list[int] = []
    gate = threading.Event()

    def sync(i: int) -> Callable[[], None]:
        def run() -> None:
            if i == 3:
                assert gate.wait(10)  # still running when the failing one has failed
            ended.append(i)
            if i == failing:
                gate.set()
                raise OSError(f"sync {i} failed")

        return run

    with pytest.raises(OSError, match=f"sync {failing} failed"):
        sync_together([sync(i) for i in range(4)])
    assert sorted(ended) == [0, 1, 2, 3]


def test_a_tutti_child_home_is_three_directories_made_and_synced_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tutti-agent's child rollout directory (`child_rollout_dir`) is its home's `sessions/`,
    whatever the day: a fresh target home under an existing workspace directory costs three
    `mkdir`s (`<session>`, the home, `sessions`) and three directory fsyncs on the calling
    thread — not six of each (the dated `sessions/YYYY/MM/DD` it had before). Counts, not
    timings."""
    from drivers.binder import DirsAhead
    from drivers.tutti_agent import TuttiAgentProvider

    target = tmp_path / "session-1" / "tutti-agent-home"
    ahead = TuttiAgentProvider({}).child_rollout_dir(target)
    assert ahead == target / "sessions"
    made: list[str] = []
    real_mkdir = os.mkdir

    def mkdir(path: str, mode: int = 0o777) -> None:
        made.append(str(path))
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", mkdir)
    widths = _rounds(monkeypatch)
    with counting_fsyncs(monkeypatch) as log:
        DirsAhead(ahead).ready()
    assert made == [str(target.parent), str(target), str(ahead)]
    assert widths == []
    assert [log.count(d) for d in (tmp_path, target.parent, target)] == [1, 1, 1]
    assert (log.files, log.dirs) == (0, 3)


def pathlib_entries(run: Callable[[], object]) -> int:
    """How many times `run` (on this thread) entered `pathlib` from outside it: each `Path`
    built, joined, sliced or turned into a string is one (counted by a profile hook, so any
    Python version's pathlib counts alike)."""
    import sys

    entries = 0

    def hook(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal entries
        if event == "call" and frame.f_code.co_filename.endswith("pathlib.py"):
            caller = frame.f_back
            if caller is None or not caller.f_code.co_filename.endswith("pathlib.py"):
                entries += 1

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entries


def test_a_bind_of_string_homes_builds_no_path(tmp_path: Path) -> None:
    """The bind works on the homes' strings: no `Path` is built for the homes, the lookups'
    matches, the relative paths or the targets (each one parsed the whole path again; 13
    `Path`s a warm fork's thread built, 4 now). A copy into a fresh target, then a rebind of
    the same child (the target found and compared)."""
    src = tmp_path / "runtimes" / "src" / "tutti-agent-home"
    put(src, CHILD, rollout_bytes(CHILD, 8))
    dst = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    binder, source_home, target_home = RolloutBinder(), str(src), str(dst)
    assert pathlib_entries(lambda: binder.bind(source_home, target_home, CHILD)) == 0
    assert pathlib_entries(lambda: binder.bind(source_home, target_home, CHILD)) == 0
    assert [p.name for p in (dst / REL).iterdir()] == [f"rollout-2026-11-29T19-33-09-{CHILD}.jsonl"]


def test_a_bind_into_ready_directories_probes_none_of_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The symlink check right before the write `lstat`s the target's directory: the write
    does not `stat` it again (`makedirs`' probe) — the warm fork's case, its directories made
    ahead (`DirsAhead`). Where the check met a missing directory, it is still created and made
    durable (`test_fresh_target_each_changed_directory_once_after_the_file`)."""
    from drivers.binder import DirsAhead

    src = tmp_path / "runtimes" / "src" / "tutti-agent-home"
    put(src, CHILD, rollout_bytes(CHILD, 8))
    dst = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    DirsAhead(dst / REL).ready()
    calls = _spy_stats(monkeypatch)
    with counting_fsyncs(monkeypatch) as log:
        receipt = RolloutBinder().bind(src, dst, CHILD)
    assert [path for kind, path in calls if kind == "stat"] == []
    assert (dst / receipt.rollouts[0].relative_path).is_file()
    assert (log.files, log.dirs) == (1, 1)  # the file, then its directory: nothing created


def test_a_sync_handed_to_the_sync_threads_wakes_one_of_them() -> None:
    """The eight sync threads idle: rounds of two syncs (one on the caller's thread, one handed
    over) each wake ONE sync thread, the one idle last, and the other seven sleep through them.
    On the `SimpleQueue` they all waited on, each handed sync woke a second thread for nothing
    (the taker's `get` hands the queue's lock on) and the syncs went to several threads."""
    import threading
    import time

    from drivers import binder
    from drivers.binder import sync_together
    from tests.support.wakeups import asleep, woken_since

    ran: list[str] = []

    def here() -> None:
        pass

    def handed() -> None:
        ran.append(threading.current_thread().name)

    def all_idle() -> None:
        deadline = time.monotonic() + 10
        while binder._sync_queue.waiting < binder._SYNC_THREADS and time.monotonic() < deadline:
            time.sleep(0.001)
        assert binder._sync_queue.waiting == binder._SYNC_THREADS

    sync_together([here, handed])  # starts the sync threads (once per process)
    all_idle()
    threads = [t for t in threading.enumerate() if t.name.startswith("fsync-")]
    assert len(threads) == binder._SYNC_THREADS
    ran.clear()
    before = asleep(threads)
    for _ in range(20):
        sync_together([here, handed])
        all_idle()
    woken = woken_since(threads, before)
    assert len(ran) == 20 and len(set(ran)) == 1, ran
    assert all(n == 0 for name, n in woken.items() if name != ran[0]), woken


def test_a_large_bind_s_names_round_wakes_one_names_thread(tmp_path: Path) -> None:
    """The names' pool (a large bind's last round, in the background) idle with four threads:
    each round wakes ONE of them, the one idle last, and the other three sleep through it. As
    a `ThreadPoolExecutor` its idle threads all waited on its queue's one lock, and a job
    woke a second thread for nothing."""
    import threading

    from drivers import binder
    from drivers.binder import NamesSyncing
    from tests.support.wakeups import asleep, woken_since

    NamesSyncing([str(tmp_path)]).wait()  # makes the pool (once per process)
    pool = binder._names_pool
    assert pool is not None
    gate, entered = threading.Event(), threading.Semaphore(0)

    def held() -> None:
        entered.release()
        assert gate.wait(20)

    for _ in range(4):  # four jobs at once: four threads
        pool.submit(held)
    for _ in range(4):
        assert entered.acquire(timeout=20)
    gate.set()
    threads = [t for t in threading.enumerate() if t.name.startswith("names-sync")]
    assert len(threads) == 4
    ran: list[str] = []
    real = binder.fsync_dirs
    before = asleep(threads)
    try:
        binder.fsync_dirs = lambda paths: (ran.append(threading.current_thread().name), real(paths))  # type: ignore[assignment,func-returns-value]
        for _ in range(20):
            NamesSyncing([str(tmp_path)]).wait()
    finally:
        binder.fsync_dirs = real
    woken = woken_since(threads, before)
    assert len(ran) == 20 and len(set(ran)) == 1, ran  # the one idle last, every time
    assert all(n == 0 for name, n in woken.items() if name != ran[0]), woken


def test_a_temp_name_costs_no_getpid_or_getrandom_and_is_renewed_in_a_forked_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`begin_atomic_write_all`'s temp name asks the kernel for neither the pid nor random
    bytes (two of the worker's system calls a warm fork); a forked child names its temp files
    with its own pid and a tag its parent does not draw next."""
    from drivers import binder
    from drivers.binder import atomic_write_all

    names: list[str] = []
    real_open = os.open

    def recording_open(path: str, *args: int) -> int:
        names.append(os.path.basename(path))
        return real_open(path, *args)

    def forbidden(*args: object) -> object:
        raise AssertionError("a system call the temp name does not need")

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "getpid", forbidden)
    monkeypatch.setattr(os, "urandom", forbidden)
    atomic_write_all([(tmp_path / "a.jsonl", b"x\n")])
    monkeypatch.undo()
    temp = [n for n in names if n.startswith(".a.jsonl.bind-")]
    assert len(temp) == 1 and temp[0].split("-")[1] == str(os.getpid()), names
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its pid and its next tag, to the parent
        try:
            os.write(write_fd, f"{binder._pid} {binder._temp_tag(32)}".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    child_pid, child_tag = os.read(read_fd, 100).decode().split()
    os.close(read_fd)
    assert int(child_pid) == pid
    assert int(child_tag) != binder._temp_tag(32)  # not the parent's sequence


def test_the_bind_takes_dirs_aheads_walk_and_lstats_only_what_it_did_not_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`begin(checked=DirsAhead.checked())`: the target home's chain, walked and made by the
    same fork's `DirsAhead`, is not `lstat`ed again; the source home's own components are,
    and so is the path about to be written, right before the write."""
    from drivers.binder import DirsAhead

    src = tmp_path / "runtimes" / "src" / "tutti-agent-home"
    put(src, CHILD, rollout_bytes(CHILD, 5))
    dst = tmp_path / "runtimes" / "dst" / "tutti-agent-home"
    dirs = DirsAhead(dst / "sessions")
    dirs.ready()
    calls = _spy_stats(monkeypatch)
    RolloutBinder().begin(src, dst, CHILD, checked=dirs.checked())[1].wait()
    seen = [path for kind, path in calls if kind == "lstat"]
    above = [p for p in seen if not p.startswith((str(src) + "/", str(dst) + "/"))]
    assert above == [str(src.parent), str(src)], above  # the source's own, nothing shared
    assert seen.count(str(dst / "sessions")) == 2  # the lookup's root, then before the write


def test_a_directory_dirs_ahead_found_made_by_another_is_lstated_again_at_the_bind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what its walk found no link, or it made itself, is vouched for: a component
    another made first (here a link planted in its place) is checked again by the bind,
    and refused."""
    from drivers.binder import BinderError, BindFailure, DirsAhead

    src = tmp_path / "runtimes" / "src" / "tutti-agent-home"
    put(src, CHILD, rollout_bytes(CHILD, 5))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tutti-agent-home" / "sessions").mkdir(parents=True)
    dst = tmp_path / "runtimes" / "dst" / "tutti-agent-home"
    real_mkdir = os.mkdir

    def mkdir(path: object, mode: int = 0o777) -> None:
        if os.fspath(path) == str(dst.parent):  # planted between the walk and the mkdir
            os.symlink(elsewhere, dst.parent)  # type: ignore[arg-type]
        real_mkdir(path, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", mkdir)
    dirs = DirsAhead(dst / "sessions")
    dirs.ready()
    checked = dirs.checked()
    assert str(dst.parent) not in checked and str(tmp_path / "runtimes") in checked
    with pytest.raises(BinderError) as refused:
        RolloutBinder().begin(src, dst, CHILD, checked=checked)
    assert refused.value.failure is BindFailure.SYMLINKED_PATH
    assert not list((elsewhere / "tutti-agent-home" / "sessions").iterdir())  # nothing written


def test_dirs_ahead_vouches_for_nothing_after_an_error(tmp_path: Path) -> None:
    from drivers.binder import DirsAhead

    (tmp_path / "file").write_bytes(b"")
    dirs = DirsAhead(tmp_path / "file" / "home" / "sessions")
    dirs.run()  # mkdir under a file fails (kept for `ready()`)
    assert dirs.checked() == {}
