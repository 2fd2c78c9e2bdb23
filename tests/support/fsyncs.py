"""Counting fsyncs by the file or directory they hit, for the count-based tests.

`FsyncLog` wraps the real `os.fsync` (every call still reaches the kernel: a spy, not a mock)
and records, per call, the inode the descriptor names, so a test can assert exactly which
files and directories a step made durable and how many times — counts, never timings."""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def _key(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@dataclass
class FsyncLog:
    calls: list[tuple[int, int, bool]] = field(default_factory=list)  # (dev, ino, is_dir)

    @property
    def total(self) -> int:
        return len(self.calls)

    @property
    def files(self) -> int:
        return sum(1 for *_, is_dir in self.calls if not is_dir)

    @property
    def dirs(self) -> int:
        return sum(1 for *_, is_dir in self.calls if is_dir)

    def count(self, path: Path) -> int:
        """fsyncs of `path` (identified by inode: a renamed temp file counts as its target)."""
        dev, ino = _key(path)
        return sum(1 for d, i, _ in self.calls if (d, i) == (dev, ino))

    def per_inode(self) -> Counter[tuple[int, int]]:
        return Counter((d, i) for d, i, _ in self.calls)

    def clear(self) -> None:
        self.calls.clear()


@contextmanager
def counting_fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncLog]:
    log = FsyncLog()
    real: Callable[[int], None] = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        log.calls.append((st.st_dev, st.st_ino, stat.S_ISDIR(st.st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        yield log
    finally:
        monkeypatch.setattr(os, "fsync", real)
