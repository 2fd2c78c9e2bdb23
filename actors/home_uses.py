"""A Session's runtime folder between the worker calls that may start an app-server in it
and the delete that removes it (docs/design/fork-saga.md, "Delete").

A `fork.resolve` reads a fork's child where it lies, in the source's and in the target's
provider home, through a transient app-server when no live runtime serves that home; that
call runs in the source's actor, the delete of the target (a committed child) in the target's,
and the delete of the source while the source's actor waits for the worker's answer. An
app-server started in a folder the delete then moves away makes its home again at its start
(`tutti-agent` makes `TUTTI_AGENT_HOME` when it runs), and a spawn that begins after the move
makes the whole folder again: a deleted Session's folder back on disk.

So the two never overlap: a delete's removal waits until no such call uses the folder
(`remove`, on the removal's own thread), and a call that comes once the removal is asked for
— while it waits or runs — is started once the folder is gone (`use`: the worker then finds
no home there and starts nothing in it). The removal waits only for the calls already in
flight when it was asked for, each within its own bound, never for a stream of later ones.
Per folder, `(workspace id, session id)`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Key = tuple[str, str]
"""A Session's runtime folder: (workspace id, session id)."""


@dataclass(frozen=True, slots=True)
class Removal:
    """A folder's removal asked for and not ended (`HomeUses.removals`): the calls in flight
    it waits for, the calls held until it has ended, and since when it was asked for."""

    key: Key
    calls: int
    held: int
    waiting_s: float


class HomeUses:
    """Counts the worker calls using each Session's runtime folder; thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._uses: dict[Key, int] = {}
        self._removing: dict[Key, float] = {}
        """Folders whose removal is asked for (waiting for the calls in flight, or running),
        with the monotonic time it was asked for."""
        self._waiting: dict[Key, list[Callable[[], None]]] = {}

    def use(self, keys: Sequence[Key], now: Callable[[], None], later: Callable[[], None]) -> None:
        """Count a call using `keys`' folders and run `now`; or, once a removal of one of them
        is asked for (waiting or running), run `later` once that removal has ended (on the
        removal's thread: `later` hands the call to its own thread, which calls `use` again).
        Every counted use is ended by `done(keys)`."""
        with self._cond:
            for key in keys:
                if key in self._removing:
                    self._waiting.setdefault(key, []).append(later)
                    return
            for key in keys:
                self._uses[key] = self._uses.get(key, 0) + 1
        now()

    def done(self, keys: Sequence[Key]) -> None:
        """The call counted by `use(keys, …)` has ended: nothing of it runs in those folders."""
        with self._cond:
            for key in keys:
                left = self._uses.get(key, 0) - 1
                if left > 0:
                    self._uses[key] = left
                else:
                    self._uses.pop(key, None)
            self._cond.notify_all()

    def in_use(self, key: Key) -> int:
        """How many calls use the folder now."""
        with self._cond:
            return self._uses.get(key, 0)

    def removals(self) -> list[Removal]:
        """The removals asked for and not ended (`host.status` → `homeRemovals`)."""
        now = time.monotonic()
        with self._cond:
            return [
                Removal(key, self._uses.get(key, 0), len(self._waiting.get(key, ())), now - at)
                for key, at in self._removing.items()
            ]

    def remove(self, key: Key, removal: Callable[[], object]) -> None:
        """Run `removal` of the folder once no call uses it (blocking: on the removal's own
        thread); a call that comes from the moment this is asked waits for it to end, so the
        wait is for the calls in flight now only."""
        with self._cond:
            self._removing[key] = time.monotonic()
            while self._uses.get(key, 0):
                self._cond.wait()
        try:
            removal()
        finally:
            with self._cond:
                self._removing.pop(key, None)
                waiting = self._waiting.pop(key, [])
            for later in waiting:
                later()
