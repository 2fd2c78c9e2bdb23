"""The calls a store's writers make while they hold its writer baton, counted: `sys.setprofile`
on the holder's thread from the baton's take to its hand-on (the same cut as
`bench.mutation_stages`' `AGENTHOST_STAGES_HOLD_CALLS`), on any thread. Counts, never times."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from storage.base import Database
from storage.sqlite import Submission


class HoldCalls:
    """Every call made inside the block's baton holds: `calls` by `file:function` (Python) or
    `C:name`, and `holds` (each a take, or a body's own caller handed the baton, to a hand-on)."""

    def __init__(self) -> None:
        self.holds = 0
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def of(self, name: str) -> int:
        return self.calls.get(name, 0)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            key = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"
        elif event == "c_call":
            key = f"C:{getattr(arg, '__qualname__', None) or getattr(arg, '__name__', '?')}"
        else:
            return
        mine: dict[str, int] = self._local.calls
        mine[key] = mine.get(key, 0) + 1

    def began(self) -> None:
        self._local.calls = {}
        sys.setprofile(self._profile)

    def ended(self) -> None:
        sys.setprofile(None)
        mine: dict[str, int] | None = getattr(self._local, "calls", None)
        if mine is None:
            return
        self._local.calls = None
        with self._lock:
            self.holds += 1
            for key, n in mine.items():
                self.calls[key] = self.calls.get(key, 0) + n


@contextmanager
def hold_calls(db: Database) -> Iterator[HoldCalls]:
    """Count the calls made inside `db`'s baton holds during the block (its baton's methods
    wrapped on the instance, put back after)."""
    got = HoldCalls()
    baton = db._fifo
    take, offer, pass_on = baton.take, baton.offer, baton.pass_on

    def traced_take(timeout_s: float) -> None:
        take(timeout_s)
        got.began()

    def traced_offer(sub: Submission, timeout_s: float) -> None:
        offer(sub, timeout_s)
        if sub.state == Submission.OWNER:
            got.began()

    def traced_pass_on() -> None:
        got.ended()
        pass_on()

    baton.take, baton.offer, baton.pass_on = traced_take, traced_offer, traced_pass_on  # type: ignore[method-assign]
    try:
        yield got
    finally:
        del baton.take, baton.offer, baton.pass_on
