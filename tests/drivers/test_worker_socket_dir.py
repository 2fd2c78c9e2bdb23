"""Where a worker's ipc socket lives when its run dir's path is too long: one directory in the
temp dir named for the run dir, taken again by the next start and removed by a clean close;
one that is not safely ours (a link, another mode) is passed over for a fresh one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.supervisor import WorkerSupervisor
from drivers.worker_spawn import SOCKET_DIR_MARKER, fallback_socket_dir, socket_dir

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run dir too long for an ipc path; its socket directories removed after the test."""
    path = tmp_path / ("r" * 120)
    yield path
    shutil.rmtree(fallback_socket_dir(path), ignore_errors=True)
    if os.path.islink(fallback_socket_dir(path)):
        os.unlink(fallback_socket_dir(path))


def test_a_long_run_dirs_socket_dir_is_named_for_it_and_taken_again(run_dir: Path) -> None:
    first, owned = socket_dir(run_dir)
    assert owned and first == fallback_socket_dir(run_dir)
    assert (first.stat().st_mode & 0o777) == 0o700
    assert (first / SOCKET_DIR_MARKER).read_text() == str(run_dir)
    (first / "w-tutti-agent-3.sock").touch()  # what a SIGKILLed daemon's worker left
    again, _ = socket_dir(run_dir)
    assert again == first and not (again / "w-tutti-agent-3.sock").exists()


@pytest.mark.parametrize("unsafe", ["link", "mode"])
def test_a_named_dir_not_safely_ours_is_passed_over_for_a_fresh_one(
    run_dir: Path, tmp_path: Path, unsafe: str
) -> None:
    named = fallback_socket_dir(run_dir)
    if unsafe == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        named.symlink_to(tmp_path / "elsewhere")
    else:
        named.mkdir()
        named.chmod(0o755)
    path, owned = socket_dir(run_dir)
    try:
        assert owned and path != named and path.name.startswith("ahw-")
        assert (path / SOCKET_DIR_MARKER).read_text() == str(run_dir)
        assert not (tmp_path / "elsewhere" / SOCKET_DIR_MARKER).exists()
    finally:
        shutil.rmtree(path)


def test_a_clean_close_removes_the_socket_dir(run_dir: Path) -> None:
    sup = WorkerSupervisor(run_dir)
    assert fallback_socket_dir(run_dir).is_dir()
    sup.close()
    assert not fallback_socket_dir(run_dir).exists()


def test_a_socket_dir_removed_under_a_live_supervisor_is_made_again_only_if_ours(
    run_dir: Path, tmp_path: Path
) -> None:
    """A cleaner removed it and a link took its (predictable) name: the next spawn binds in a
    fresh directory, never through the link."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    sup = WorkerSupervisor(run_dir)
    try:
        named = fallback_socket_dir(run_dir)
        shutil.rmtree(named)
        named.symlink_to(elsewhere)
        sup.restore_dirs()
        assert sup.request("tutti-agent", "worker.ping", {}, 20.0).result(30) is not None
        assert list(elsewhere.iterdir()) == []
    finally:
        sup.close()
    marked = [
        d
        for d in Path(tempfile.gettempdir()).glob("ahw-*")
        if (d / SOCKET_DIR_MARKER).is_file() and (d / SOCKET_DIR_MARKER).read_text() == str(run_dir)
    ]
    assert marked == []  # the fresh one removed by the close too
