"""The delivery thread's one shortcut: the result of a fork, `runtime.attest` or
`session.start` — whose waiters only hand it to a Session actor — is delivered on the
supervisor's loop thread when nothing is queued ahead of it, one thread hand-off fewer on a
fork's path; behind a queued event or result it waits its turn (arrival order holds), and every
other method's result still goes through the delivery thread. Real threads, no timings."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from drivers.supervisor import Deliveries
from drivers.worker_state import Pending

pytestmark = pytest.mark.timeout(30)


def _pending(method: str) -> Pending:
    future: Future[dict[str, Any]] = Future()
    return Pending(1, "tutti-agent", method, {}, future, None)


def _thread_of_callback(pending: Pending) -> list[str]:
    names: list[str] = []
    pending.future.add_done_callback(lambda f: names.append(threading.current_thread().name))
    return names


@pytest.mark.parametrize("method", ["fork", "runtime.attest", "session.start"])
def test_a_fork_path_result_with_nothing_queued_is_delivered_on_the_calling_thread(
    method: str,
) -> None:
    deliveries = Deliveries()
    try:
        pending = _pending(method)
        names = _thread_of_callback(pending)
        deliveries.complete(pending, {"ok": True})
        # Delivered before complete() returned, on this (the loop's) thread.
        assert pending.future.done() and pending.future.result() == {"ok": True}
        assert names == [threading.current_thread().name]
        assert deliveries.inlined == 1
    finally:
        deliveries.close(5)


def test_other_results_still_go_through_the_delivery_thread() -> None:
    deliveries = Deliveries()
    try:
        pending = _pending("turn.start")
        names = _thread_of_callback(pending)
        deliveries.complete(pending, {"ok": True})
        assert pending.future.result(10) == {"ok": True}
        assert names == ["worker-delivery"] and deliveries.inlined == 0
    finally:
        deliveries.close(5)


def test_a_fork_result_behind_a_queued_event_keeps_arrival_order() -> None:
    deliveries = Deliveries()
    order: list[str] = []
    release = threading.Event()
    entered = threading.Event()

    def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
        entered.set()
        release.wait(10)
        order.append("event")

    deliveries.event_sink = sink
    try:
        deliveries.event("tutti-agent", "ws/s", {"type": "turn.binding"})
        assert entered.wait(10)  # the event is running on the delivery thread
        pending = _pending("fork")
        names = _thread_of_callback(pending)
        pending.future.add_done_callback(lambda f: order.append("fork"))
        deliveries.complete(pending, {"ok": True})
        assert not pending.future.done()  # not overtaking the event still running
        release.set()
        assert pending.future.result(10) == {"ok": True}
        assert order == ["event", "fork"]
        assert names == ["worker-delivery"] and deliveries.inlined == 0
    finally:
        release.set()
        deliveries.close(5)


@pytest.mark.parametrize("kind", ["message.delta", "turn.completed"])
def test_a_delta_or_a_turns_end_with_nothing_queued_is_handed_to_the_sink_on_the_calling_thread(
    kind: str,
) -> None:
    """A streamed delta's sink only queues it for the publisher, a Turn's end's only tells its
    Session actor: with nothing queued or running on the delivery thread they run on the loop
    thread; any other event does not."""
    deliveries = Deliveries()
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
        seen.append((str(event["type"]), threading.current_thread().name))
        if event["type"] == "item":
            done.set()

    deliveries.event_sink = sink
    try:
        deliveries.event("tutti-agent", "ws/s", {"type": kind, "turnId": "t"})
        assert seen == [(kind, threading.current_thread().name)]
        assert deliveries.inlined == 1
        deliveries.event("tutti-agent", "ws/s", {"type": "item"})
        assert done.wait(10)
        assert seen[-1] == ("item", "worker-delivery") and deliveries.inlined == 1
    finally:
        deliveries.close(5)


def test_a_delta_behind_a_queued_event_keeps_arrival_order() -> None:
    deliveries = Deliveries()
    order: list[str] = []
    release = threading.Event()
    entered = threading.Event()

    def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
        if event["type"] == "item":
            entered.set()
            release.wait(10)
        order.append(str(event["type"]))

    deliveries.event_sink = sink
    try:
        deliveries.event("tutti-agent", "ws/s", {"type": "item"})
        assert entered.wait(10)  # the item is running on the delivery thread
        deliveries.event("tutti-agent", "ws/s", {"type": "message.delta", "delta": "d00 "})
        assert order == []  # queued behind it, not run here
        release.set()
        deliveries.close(5)  # runs what is queued, then stops
        assert order == ["item", "message.delta"] and deliveries.inlined == 0
    finally:
        release.set()
        deliveries.close(5)


def test_an_inline_delta_takes_no_lock_and_enters_no_function_but_its_sink() -> None:
    """The loop thread is the deliveries' one producer, so its own read of the backlog is the
    whole check for a delta with nothing queued: no lock taken, no closure built and called
    around the sink (three lock pairs and two Python calls a delta before, on the thread every
    delta crosses). Counted by a profile hook around one inline `event` call."""
    deliveries = Deliveries()
    seen: list[str] = []

    def sink(provider: str, sid: str, event: dict[str, Any]) -> None:
        seen.append(str(event["type"]))

    deliveries.event_sink = sink
    entered: list[str] = []

    def hook(frame: Any, what: str, arg: Any) -> None:
        if what == "call":
            entered.append(frame.f_code.co_name)
        elif what == "c_call":
            entered.append(f"C:{getattr(arg, '__qualname__', arg)}")

    event = {"type": "message.delta", "turnId": "t", "delta": "d00 "}
    try:
        deliveries.event("tutti-agent", "ws/s", event)  # warm: nothing lazily made below
        sys.setprofile(hook)
        try:
            deliveries.event("tutti-agent", "ws/s", event)
        finally:
            sys.setprofile(None)
        assert seen == ["message.delta", "message.delta"] and deliveries.inlined == 2
        entered = [name for name in entered if name != "C:setprofile"]
        assert [name for name in entered if not name.startswith("C:")] == ["event", "sink"]
        assert not [name for name in entered if "lock" in name.lower()], entered
    finally:
        deliveries.close(5)
