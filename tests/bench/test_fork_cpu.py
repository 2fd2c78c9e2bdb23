"""`bench/fork_cpu.py` reads the daemon tree's CPU per fork from its threads' run time
(nanoseconds, not the 10 ms ticks of `/proc/PID/stat`) over a fixed number of forks: a thread
born in the window counts from 0, one that ended is named as lost, and a real daemon's warm
forks all commit and are all counted."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from actors.dir_spread import FS_IOC_SETFLAGS, FS_TOPDIR_FL, dir_flags, spread_subdirs
from bench.fork_cpu import (
    TreeReading,
    _figures,
    difference,
    main,
    read_tree,
    spread_parent,
    thread_times,
)


def test_a_live_threads_wake_ups_and_run_time_are_counted_in_nanoseconds() -> None:
    go, done, leave = threading.Event(), threading.Event(), threading.Event()

    def sleeper() -> None:
        go.wait()
        for _ in range(20):
            time.sleep(0.001)  # blocks every time: a voluntary switch each (an Event may not)
        done.set()
        leave.wait()

    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    before = thread_times(os.getpid())
    go.set()
    assert done.wait(10)
    after = thread_times(os.getpid())
    leave.set()
    t.join(5)
    assert t.native_id in before and t.native_id in after
    ns0, cs0 = before[t.native_id]
    ns1, cs1 = after[t.native_id]
    assert cs1 - cs0 >= 20  # the sleeper woke at least once per sleep
    assert ns1 > ns0
    assert sum(ns for ns, _ in after.values()) % 10_000_000 != 0  # not a tick count


def test_a_thread_born_in_the_window_counts_from_zero_and_an_ended_one_is_named() -> None:
    before = TreeReading({1: "daemon"}, {(1, 1): (1_000, 5), (1, 2): (7_000, 9)}, {1: 0.0})
    after = TreeReading({1: "daemon"}, {(1, 1): (3_000, 8), (1, 3): (500, 2)}, {1: 0.01})
    got = difference(before, after)
    assert got["daemon"] == pytest.approx((2_000 + 500) / 1e9)
    assert got["cs:daemon"] == 3 + 2
    assert got["ended"] == 1  # thread 2's share of the window is lost, and said so
    assert got["reaped"] == pytest.approx(0.01)


def test_the_tree_is_read_by_kind() -> None:
    reading = read_tree(os.getpid())
    assert os.getpid() in reading.kind
    assert (os.getpid(), threading.get_native_id()) in reading.threads


def test_the_spread_parent_is_marked_top_of_a_hierarchy_once(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    flags = dir_flags(probe)
    if flags is None:
        pytest.skip("this file system keeps no inode flags")
    fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, (flags | FS_TOPDIR_FL).to_bytes(4, sys.byteorder))
    except OSError:
        pytest.skip("this file system refuses the flag")
    finally:
        os.close(fd)
    parent = spread_parent(tmp_path)
    assert parent.parent == tmp_path
    got = dir_flags(parent)
    assert got is not None and got & FS_TOPDIR_FL
    assert spread_parent(tmp_path) == parent  # made once, reused
    assert dir_flags(parent) == got


def test_a_file_system_refusing_the_flag_still_gives_the_spread_parent() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    base = shm / f"fork-cpu-test-{os.getpid()}"
    base.mkdir()
    try:
        if spread_subdirs(base):
            pytest.skip("/dev/shm takes FS_TOPDIR_FL here (not tmpfs)")
        parent = spread_parent(base)  # no error: the placement is then the parent's
        assert parent.is_dir() and parent.parent == base
        assert not (dir_flags(parent) or 0) & FS_TOPDIR_FL
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(300)
def test_a_real_daemons_fixed_forks_all_commit_and_are_counted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--clients", "1,2", "--forks", "3,2", "--spread-home"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[2] for ln in lines] == ["clients=1", "clients=2"]
    assert "forks=3/3" in lines[0] and "forks=4/4" in lines[1]
    # Each client's warm-up: three forks before its window (the first level's source made
    # them again at the second level).
    assert " before=3 " in lines[0] and " before=6 " in lines[1]
    for ln in lines:
        assert "daemon=" in ln and "worker=" in ln and "app-server=" in ln
        assert " ended=0 " in ln  # a warm fork ends no thread of the tree


@pytest.mark.timeout(300)
def test_an_aged_source_is_forked_that_many_times_before_the_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--clients", "1", "--forks", "2", "--aged", "7"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert " forks=2/2 before=7 " in line


def test_a_pairs_sample_is_the_last_level_lines_ms_a_fork_by_process_kind() -> None:
    out = (
        "probe=14ms load=5.33 clients=1 forks=200/200 before=0 | app-server=1.0ms daemon=2.0ms"
        " worker=1.5ms tree=4.5ms | cs:daemon=35.4 | ended=0 reaped=0.00ms\n"
        "probe=15ms load=5.10 clients=16 forks=640/640 before=48 | app-server=1.107ms"
        " daemon=2.531ms worker=1.623ms tree=5.261ms | cs:app-server=7.0 | ended=0"
        " reaped=0.00ms\n"
    )
    assert _figures(out) == {
        "app-server": 1.107,
        "daemon": 2.531,
        "worker": 1.623,
        "tree": 5.261,
    }
