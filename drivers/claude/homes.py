"""A Claude fork child's home made ahead of the fork (`SpareHomes`): the directories the move
would otherwise create on the fork's path (`<session>/claude-config/projects/<cwd>`) made
and made durable on a thread of its own after a fork has answered, and renamed into place by
the next fork like it — one `rename` and one fsync of its parent on that fork's path instead
of four `mkdir`s and four parents' fsyncs (docs/design/drivers.md, "A Claude child's home
made ahead").

A spare is `<parent>/.claude-spare-<tag>-<n>/<rest>`, where `<parent>/<first missing>/<rest>` is
the child's project directory of the fork that asked for it: the workspace's `runtimes/`
directory, the Session's directory that was missing, `claude-config/projects/<cwd>` below
it. Its every directory's entry is fsynced when it is made (`_make`), so after the rename
only the parent's entry is new. What a spare is and is not:

- **Never a child's**: it is renamed onto the fork's first missing directory *before* the
  child's transcript is moved in, so no transcript is ever in a spare; its name starts with
  `.`, which no Session id does (the daemon's Session directories are `<session>`).
- **Taken only from this process's memory**, never found on disk: a spare left by a killed
  worker or daemon is never used, and the daemon's start-up sweep removes it
  (`actors.runtime_dirs.sweep`, by a rename into `runtimes/.trash` first); an orderly close
  removes this worker's own (`close`).
- **Bounded**: `PER_KEY` spares per (parent, rest) and `TOTAL` in all; a new key beyond the
  total evicts (removes) the spares of the key used least recently — a worktree fork's child
  directory is its own tree's, so its spare is never asked for again.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from drivers.binder import assert_no_symlink, fsync_dir

PREFIX = ".claude-spare-"
"""A spare's directory name starts with this (and so with `.`, which no Session id does)."""
PER_KEY = 2
"""Spares kept ready per child directory shape: two forks of one source at once each take one."""
TOTAL = 8
"""Spares kept ready in all."""

_Key = tuple[str, str]


class SpareHomes:
    """`take(child_dir)` on a fork's path, `replenish(first_missing, child_dir)` after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: OrderedDict[_Key, list[str]] = OrderedDict()
        self._pending: dict[_Key, int] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        # Spare names: this process's random tag once, then a counter (no `getrandom` a
        # spare; a clash with a name on disk fails that spare's `mkdir`, and it is not made).
        self._tag = os.urandom(6).hex()
        self._names = itertools.count()
        # Parents whose components were each `lstat`ed once and none was a link.
        self._checked: set[str] = set()

    @staticmethod
    def _first_missing(path: str) -> str | None:
        """The highest missing directory of `path`'s chain (None: `path` exists)."""
        first = None
        probe = path
        while not os.path.exists(probe):
            first = probe
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        return first

    @staticmethod
    def _key(first_missing: str, path: str) -> _Key:
        return os.path.dirname(first_missing), path[len(first_missing) :]

    def take(self, child_dir: str) -> tuple[str | None, list[str] | None]:
        """Puts a ready spare in place of `child_dir`'s first missing directory. Returns that
        directory (None: `child_dir` exists) and the directories whose entries the rename
        changed (to fsync once before anything counts on it), None when no spare was used
        (the caller makes the chain itself)."""
        path = os.path.abspath(child_dir)
        first = self._first_missing(path)
        if first is None:
            return None, None
        key = self._key(first, path)
        with self._lock:
            ready = self._ready.get(key)
            spare = ready.pop() if ready else None
        if spare is None:
            return first, None
        try:
            # `first` was missing just now and only this fork makes its target's directories:
            # the rename makes it, the spare's chain below already durable. (Were it to appear
            # meanwhile empty, rename replaces an empty directory: nothing is lost; not empty,
            # the rename fails and the caller makes the chain.)
            os.rename(spare, first)
        except OSError:
            self._remove(spare)
            return first, None
        return first, [os.path.dirname(first)]

    def replenish(self, first_missing: str, child_dir: str) -> None:
        """A spare for the next fork whose child directory is shaped like `child_dir` (its
        first missing directory `first_missing`'s parent the same, the same chain below it),
        made on the spares' own thread, up to `PER_KEY` ready. Nothing when enough are ready or
        being made."""
        first, path = os.path.abspath(first_missing), os.path.abspath(child_dir)
        if path != first and not path.startswith(first + "/"):
            return
        key = self._key(first, path)
        with self._lock:
            if self._closed:
                return
            pending = self._pending.get(key, 0)
            wanted = PER_KEY - len(self._ready.get(key, ())) - pending
            if wanted <= 0:
                return
            self._pending[key] = pending + wanted
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="claude-spare-homes")
            pool = self._pool
        for _ in range(wanted):
            pool.submit(self._make, key)

    def _make(self, key: _Key) -> None:
        parent, rest = key
        root = os.path.join(parent, f"{PREFIX}{self._tag}-{next(self._names)}")
        made = False
        try:
            if parent not in self._checked:
                if assert_no_symlink(parent, must_exist=True) is not None:
                    return
                self._checked.add(parent)
            chain = [root] + [
                root + rest[:i] for i in range(1, len(rest) + 1) if i == len(rest) or rest[i] == "/"
            ]
            for directory in chain:
                os.mkdir(directory, 0o700)
                made = True
            # Each directory's entry in its parent durable, deepest first; the spare's own
            # entry in `parent` is not: the fork that takes it fsyncs `parent` after its rename.
            for directory in reversed(chain[:-1]):
                fsync_dir(directory)
            with self._lock:
                if self._closed:
                    raise RuntimeError("closed")
                self._ready[key] = [*self._ready.pop(key, []), root]  # most recent last
                evicted = self._evict_locked()
            for spare in evicted:
                self._remove(spare)
        except Exception:  # noqa: BLE001 - a spare is an optimisation: the fork makes its own
            if made:
                self._remove(root)
        finally:
            with self._lock:
                self._pending[key] -= 1
                if not self._pending[key]:
                    del self._pending[key]

    def _evict_locked(self) -> list[str]:
        evicted: list[str] = []
        while sum(len(v) for v in self._ready.values()) > TOTAL:
            _, spares = self._ready.popitem(last=False)
            evicted.extend(spares)
        return evicted

    @staticmethod
    def _remove(spare: str) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(spare)

    def ready(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._ready.values())

    def drain(self) -> None:
        """Waits until every spare asked for so far is made (tests, benchmarks)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def close(self) -> None:
        """Removes this worker's ready spares; none is made after."""
        with self._lock:
            self._closed = True
        self.drain()
        with self._lock:
            spares = [s for v in self._ready.values() for s in v]
            self._ready.clear()
        for spare in spares:
            self._remove(spare)
