"""`RuntimeSlots` start permits: at most `start_limit` cold runtimes start at
once, the rest wait in FIFO order with the Sessions waiting for a slot; a warm Session (its
runtime live) needs no permit; a permit is freed by `started`, `release` or `forget`."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from actors.session_runtime import RuntimeSlots

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
        "queuedForks": 0,
        "forks": 0,
        "limit": 3,
        "forkLimit": 2,
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


def test_hold_warm_holds_only_a_runtime_still_in_its_slot() -> None:
    """A fork reuses a warm runtime without `session.start` only while its slot
    still holds it — never one evicted for another Session, lost with its worker, or still
    starting; holding marks it busy, so it is not evicted while the fork runs."""
    stopped: list[str] = []
    granted: list[str] = []
    slots = RuntimeSlots(limit=1, stop=_stopper(stopped), start_limit=1)
    assert not slots.hold_warm(P, "a")  # never started
    slots.acquire(P, "a", _appender(granted, "a"))
    assert not slots.hold_warm(P, "a")  # its start has not ended
    slots.started(P, "a")
    slots.release(P, "a")
    assert slots.hold_warm(P, "a")
    assert slots.status()[P]["busy"] == 1
    slots.acquire(P, "b", _appender(granted, "b"))
    assert granted == ["a"] and stopped == []  # held busy: "b" waits, "a" is not evicted
    slots.release(P, "a")  # "a" idle: evicted for "b"
    assert stopped == ["a"] and granted == ["a", "b"]
    assert not slots.hold_warm(P, "a")
    slots.started(P, "b")
    slots.release(P, "b")
    slots.reset(P)  # the worker died with "b"'s runtime
    assert not slots.hold_warm(P, "b")


def test_forks_never_take_the_last_slot_from_an_idle_warm_session() -> None:
    """Forks held in a slow provider call may hold only `fork_limit` slots: a cold fork past
    that waits (without evicting the idle warm runtime), the warm Session's Turn is granted at
    once, and a cold Turn queued behind the waiting fork is not held back by it."""
    granted: list[str] = []
    stopped: list[str] = []
    slots = RuntimeSlots(limit=4, stop=_stopper(stopped), start_limit=4)
    assert slots.fork_limit == 3
    slots.acquire(P, "warm", _appender(granted, "warm"))
    slots.started(P, "warm")
    slots.release(P, "warm")  # idle, warm, least recently used from here on
    for key in ("f1", "f2", "f3", "f4"):
        slots.acquire(P, key, _appender(granted, key), fork=True)
        slots.started(P, key)
    assert granted == ["warm", "f1", "f2", "f3"]  # f4 waits: the forks' share is full
    assert stopped == []  # ... and "warm" was not evicted for it
    assert slots.status()[P]["queuedForks"] == 1
    slots.acquire(P, "warm", _appender(granted, "warm-turn"))
    assert granted[-1] == "warm-turn"
    slots.release(P, "warm")
    slots.acquire(P, "cold", _appender(granted, "cold-turn"))  # behind f4, but not held by it
    assert granted[-1] == "cold-turn" and stopped == ["warm"]
    slots.release(P, "f1")  # a fork ends: the waiting fork takes its share
    assert granted[-1] == "f4" and stopped == ["warm", "f1"]
    assert slots.status()[P]["forks"] == 3


def test_a_turn_chained_onto_a_waiting_fork_waits_as_a_turn() -> None:
    granted: list[str] = []
    slots = RuntimeSlots(limit=2, stop=_stopper([]), start_limit=2)
    slots.acquire(P, "f1", _appender(granted, "f1"), fork=True)
    slots.acquire(P, "s", _appender(granted, "s-fork"), fork=True)  # share (1) full: waits
    assert granted == ["f1"]
    slots.acquire(P, "s", _appender(granted, "s-turn"))  # the same Session's Turn: a free slot
    assert granted == ["f1", "s-fork", "s-turn"]
