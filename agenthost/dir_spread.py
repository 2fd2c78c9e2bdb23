"""A directory whose subdirectories the file system spreads over its block groups.

ext4 (and ext2/3) place a file's inode in its directory's block group, and a new directory
near its parent's (the Orlov allocator), except below a directory flagged `FS_TOPDIR_FL`
(`chattr +T`) or the root: a directory made there goes to a group of its own choosing (free
inodes and blocks above the average, the fewest directories). The flag is not inherited.

Why the daemon sets it on `runtimes/`: on an ext4 without a journal each new inode skips, one
inode-table read at a time, every inode of its group freed in the last seconds (minutes while
that block is not yet written back), and a fork makes five (the child's directory, its provider
home, the home's `sessions`, the binder's temp file, the provider's child file). A home under
a directory other programs churn (`/tmp`, a desktop's home directory) would put every
workspace's directory in the churned group; flagged, each `runtimes/<workspace>` is placed
apart, and its Sessions' and fork children's directories and files follow it there. A file
system without the flag (tmpfs, btrfs, xfs, NFS) refuses or ignores the ioctl: nothing changes.
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
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
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
