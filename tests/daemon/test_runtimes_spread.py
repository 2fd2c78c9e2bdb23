"""The daemon flags `$AGENTHOST_HOME/runtimes` `FS_TOPDIR_FL`, through the real `agenthost
serve`: on ext4 each workspace's directory made in it (and so its Sessions' and fork
children's inodes) is then placed in a block group of its own, away from the groups other
programs' deletes churn (docs/design/drivers.md, "Where a runtime directory's inodes go"). A
file system that refuses the flag (tmpfs) still serves Sessions, and nothing is logged above
debug about it."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.dir_spread import FS_IOC_SETFLAGS, FS_TOPDIR_FL, dir_flags, spread_subdirs
from tests.support.daemon import DaemonProcess, create_session

pytestmark = pytest.mark.timeout(90)

SHM = Path("/dev/shm")


def flags_settable(where: Path) -> bool:
    """Whether `where`'s file system takes `FS_TOPDIR_FL` at all (a probe directory)."""
    probe = where / f"probe-{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    try:
        return spread_subdirs(probe) and (dir_flags(probe) or 0) & FS_TOPDIR_FL != 0
    finally:
        probe.rmdir()


def test_the_daemon_flags_runtimes_topdir(daemon: DaemonProcess) -> None:
    if not flags_settable(daemon.home.parent):
        pytest.skip(f"{daemon.home.parent}'s file system keeps no FS_TOPDIR_FL")
    runtimes = daemon.home / "runtimes"
    flags = dir_flags(runtimes)
    assert flags is not None and flags & FS_TOPDIR_FL, (runtimes, flags)
    # Set on an existing `runtimes/` too (a home made before), at each start.
    daemon.stop()
    flags &= ~FS_TOPDIR_FL
    fd = os.open(runtimes, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags.to_bytes(4, sys.byteorder))
    finally:
        os.close(fd)
    assert not (dir_flags(runtimes) or 0) & FS_TOPDIR_FL
    daemon.start()
    assert (dir_flags(runtimes) or 0) & FS_TOPDIR_FL
    create_session(daemon.client())


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
    d = DaemonProcess(shm_home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert c.call("session.get", {"workspaceId": "ws-test", "agentSessionId": sid})
    finally:
        d.stop()
    assert not (dir_flags(shm_home / "runtimes") or 0) & FS_TOPDIR_FL
    alarming = [
        line
        for line in d.log_path.read_text(errors="replace").splitlines()
        if ("WARNING" in line or "ERROR" in line or "Traceback" in line)
    ]
    assert alarming == [], alarming
