"""A directory whose subdirectories the file system spreads over its block groups.

ext4 (and ext2/3) place a file's inode in its directory's block group, and a new directory
near its parent's (the Orlov allocator), except below a directory flagged `FS_TOPDIR_FL`
(`chattr +T`) or the root: a directory made there goes to the flex group with the fewest
directories among those with free inodes and blocks above the average. The flag is not
inherited. A file system without it (tmpfs, btrfs, xfs) refuses or ignores the ioctl.

On an ext4 without a journal (`skips_recent_deletes`) the daemon flags each
`runtimes/<workspace>/` (`actors/context.py`): every Session's and fork child's directory made
in it is then placed on its own, its name's hash choosing where the search starts, and a fork's
new inodes skip few recently freed ones. Elsewhere nothing is skipped, and a spread `mkdir`
only costs more (it touches a group of its own).
Flagging `runtimes/` instead was measured worse: the workspace's directory then lands in the
same emptiest group run after run, where the last deletes were (docs/performance.md, topdir of
2026-12-06). `bench/fork_cpu.py --spread-home` uses it for the bench's home.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_TOPDIR_FL = 0x00020000
"""ext4's "top of a directory hierarchy" inode flag (`chattr +T`, `lsattr` shows `T`)."""


def dir_flags(path: Path) -> int | None:
    """`path`'s inode flags (`lsattr -d`), None where its file system keeps none."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        return int.from_bytes(buf, sys.byteorder)
    except OSError:
        return None
    finally:
        os.close(fd)


def spread_subdirs(path: Path) -> bool:
    """Best effort: flag the existing directory `path` `FS_TOPDIR_FL`, so each directory made
    in it is placed in a block group of its own. True when the flag is (or already was) set;
    False, logged at debug only, where the file system refuses it (`ENOTTY` on tmpfs,
    `EOPNOTSUPP`, `EPERM`, …): the placement is then the file system's usual one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        log.debug("cannot open %s to spread its subdirectories: %s", path, exc)
        return False
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        flags = int.from_bytes(buf, sys.byteorder)
        if flags & FS_TOPDIR_FL:
            return True
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, (flags | FS_TOPDIR_FL).to_bytes(4, sys.byteorder))
        return True
    except OSError as exc:
        log.debug("%s: the file system keeps its subdirectories' placement (%s)", path, exc)
        return False
    finally:
        os.close(fd)


def skips_recent_deletes(path: Path) -> bool:
    """Whether `path` is on an ext4 mounted without a journal, whose inode allocator skips
    every inode of a group freed in the last seconds (`recently_deleted`): the only file system
    where spreading directories was measured to pay. A mounted ext4 is listed in
    `/proc/fs/ext4/<device>`, its journal in `/proc/fs/jbd2/<device>-<inode>`. False when
    any of that cannot be read."""
    try:
        st = os.stat(path)
        block = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        device = os.path.basename(block)
        if not device or not os.path.isdir(f"/proc/fs/ext4/{device}"):
            return False
        journals = os.listdir("/proc/fs/jbd2") if os.path.isdir("/proc/fs/jbd2") else []
    except OSError:
        return False
    return not any(name.startswith(f"{device}-") for name in journals)
