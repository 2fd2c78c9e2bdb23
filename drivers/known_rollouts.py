"""Where each open Session home's thread rollout lies, once found, so that checking a bound
history before a Turn (`history_gone`) costs one `stat` and not a search of the home."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path


class KnownRollouts:
    """Each open home's thread and its rollout file, found by `find(home, thread_id)` (None:
    no such file) and kept until the home's Session closes (`forget`)."""

    def __init__(self, find: Callable[[Path, str], Path | None]) -> None:
        self._find = find
        self._paths: dict[Path, tuple[str, Path]] = {}
        self._lock = threading.Lock()

    def gone(self, home: Path, thread_id: str, *, search: bool = True) -> bool | None:
        """Whether the thread's rollout is gone from `home` (True), there (False), or not known
        without a search of the home (None, with `search` false: a caller that must not walk
        directories). A file known and still there is one `stat`; one gone or moved is
        searched again."""
        with self._lock:
            known = self._paths.get(home)
        if known is not None and known[0] == thread_id:
            try:
                os.stat(known[1])
                return False
            except OSError:
                pass  # gone, or moved: searched again below
        if not search:
            return None
        path = self._find(home, thread_id)
        with self._lock:
            if path is None:
                self._paths.pop(home, None)
            else:
                self._paths[home] = (thread_id, path)
        return path is None

    def known(self, home: Path, thread_id: str) -> Path | None:
        """The thread's rollout where last found in `home`, with no search (None: not known)."""
        with self._lock:
            known = self._paths.get(home)
        return known[1] if known is not None and known[0] == thread_id else None

    def forget(self, home: Path) -> None:
        with self._lock:
            self._paths.pop(home, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._paths)
