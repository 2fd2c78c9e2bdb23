"""On an ext4 without a journal the daemon flags each `$AGENTHOST_HOME/runtimes/<workspace>/`
`FS_TOPDIR_FL` before a Session's directory is made in it, through the real `agenthost serve`:
each Session's and fork child's directory is then placed in a block group of its own
(docs/design/drivers.md, "Where a runtime directory's inodes go"). A file system that refuses
the flag (tmpfs) still serves Sessions and Turns, and nothing is logged above debug about it."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.dir_spread import FS_TOPDIR_FL, dir_flags, skips_recent_deletes, spread_subdirs
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(120)

SHM = Path("/dev/shm")


def flags_settable(where: Path) -> bool:
    """Whether `where`'s file system takes `FS_TOPDIR_FL` at all (a probe directory)."""
    probe = where / f"probe-{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    try:
        return spread_subdirs(probe) and (dir_flags(probe) or 0) & FS_TOPDIR_FL != 0
    finally:
        probe.rmdir()


def topdir(path: Path) -> bool:
    return bool((dir_flags(path) or 0) & FS_TOPDIR_FL)


def test_each_workspace_directory_is_flagged_before_its_sessions(daemon: DaemonProcess) -> None:
    if not flags_settable(daemon.home.parent) or not skips_recent_deletes(daemon.home.parent):
        pytest.skip(f"{daemon.home.parent} is not on an ext4 without a journal")
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "hello")  # the runtime's start makes the Session's directory
    runtimes = daemon.home / "runtimes"
    ws_dir = runtimes / WS
    assert (ws_dir / sid).is_dir()
    assert topdir(ws_dir), (ws_dir, dir_flags(ws_dir))
    # Only the workspace's directory: the flag is not inherited, nor set above it.
    assert not topdir(runtimes) and not topdir(ws_dir / sid)
    assert ws_dir.stat().st_mode & 0o777 == 0o700
    other = create_session(c, ws="ws-other")["agentSessionId"]
    run_turn(c, other, "hello", ws="ws-other")
    assert topdir(runtimes / "ws-other") and (runtimes / "ws-other" / other).is_dir()


@pytest.fixture
def shm_home() -> Iterator[Path]:
    if not SHM.is_dir() or flags_settable(SHM):
        pytest.skip("/dev/shm is not a file system that refuses FS_TOPDIR_FL (tmpfs) here")
    base = SHM / f"agenthost-topdir-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o700)
    try:
        yield base / "home"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_file_system_without_the_flag_still_serves_sessions(shm_home: Path) -> None:
    assert not skips_recent_deletes(shm_home.parent)  # tmpfs: nothing to spread for
    d = DaemonProcess(shm_home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "hello")
        assert (shm_home / "runtimes" / WS / sid).is_dir()
    finally:
        d.stop()
    assert not topdir(shm_home / "runtimes" / WS)
    alarming = [
        line
        for line in d.log_path.read_text(errors="replace").splitlines()
        if ("WARNING" in line or "ERROR" in line or "Traceback" in line)
    ]
    assert alarming == [], alarming
