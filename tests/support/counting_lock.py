"""A lock wrapped to count its acquisitions: what a cut of lock traffic saves is a lock not
taken, so the pool tests count them (tests/actors/test_timers.py, test_pool_slices.py)."""

from __future__ import annotations

from typing import Any


class CountingLock:
    """`lock`, counting the times it is taken (`taken`)."""

    def __init__(self, lock: Any) -> None:
        self.lock, self.taken = lock, 0

    def __enter__(self) -> bool:
        self.taken += 1
        return bool(self.lock.__enter__())

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)
