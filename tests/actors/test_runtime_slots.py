"""`RuntimeSlots` start permits (issue 14 §6): at most `start_limit` cold runtimes start at
once, the rest wait in FIFO order with the Sessions waiting for a slot; a warm Session (its
runtime live) needs no permit; a permit is freed by `started`, `release` or `forget`."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from actors.runtime_slots import RuntimeSlots

P = "tutti-agent"


def _stopper(stopped: list[str]) -> Any:
    def stop(provider: str, key: str) -> Future[Any]:
        stopped.append(key)
        fut: Future[Any] = Future()
        fut.set_result({})
        return fut

    return stop


def _appender(out: list[str], key: str) -> Any:
    return lambda: out.append(key)


def test_cold_grants_wait_for_a_start_permit_in_fifo_order() -> None:
    granted: list[str] = []
    slots = RuntimeSlots(limit=3, stop=_stopper([]), start_limit=1)
    for key in ("a", "b", "c"):
        slots.acquire(P, key, _appender(granted, key))
    assert granted == ["a"]
    assert slots.status()[P] == {
        "live": 1,
        "busy": 1,
        "queued": 2,
        "limit": 3,
        "starting": 1,
        "startLimit": 1,
    }
    slots.started(P, "a")
    assert granted == ["a", "b"]
    slots.started(P, "a")  # twice is harmless
    assert granted == ["a", "b"]
    slots.release(P, "b")  # a start that ended without `started` (its turn settled)
    assert granted == ["a", "b", "c"]
    assert slots.status()[P]["starting"] == 1


def test_a_warm_session_needs_no_permit_and_a_cold_one_evicts_lru_only_when_granted() -> None:
    granted: list[str] = []
    stopped: list[str] = []
    slots = RuntimeSlots(limit=2, stop=_stopper(stopped), start_limit=1)
    slots.acquire(P, "a", lambda: granted.append("a"))
    slots.started(P, "a")
    slots.release(P, "a")  # idle, warm
    slots.acquire(P, "b", lambda: granted.append("b"))  # cold: takes the permit
    slots.acquire(P, "a", lambda: granted.append("a2"))  # warm: granted at once
    slots.acquire(P, "c", lambda: granted.append("c"))  # cold: no permit, no slot
    assert granted == ["a", "b", "a2"]
    slots.started(P, "b")
    assert granted == ["a", "b", "a2"]  # a permit, but both slots busy
    slots.release(P, "a")
    assert granted == ["a", "b", "a2", "c"]
    assert stopped == ["a"]  # the idle one was stopped before `c` was granted
    slots.forget(P, "c")
    assert slots.status()[P]["starting"] == 0
