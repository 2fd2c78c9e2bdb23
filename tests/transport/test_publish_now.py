"""`ApiServer.publish_now`: an event sent on the XPUBs by the thread that hands it over (the
worker supervisor's, for a streamed delta) when every event handed to the transport loop
before it is sent, else queued behind them in the loop's outbox; a subscription whose signal
such a send took is still read. Real ApiServer, real ipc XPUB and SUB sockets."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from protocol.envelope import Request
from tests.support.daemon import wait_for
from transport.client import Client
from transport.server import ApiServer, Responder

pytestmark = pytest.mark.timeout(60)


class Holding:
    """A dispatcher whose `hold` request keeps the transport loop inside it until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: Request, responder: Responder) -> None:
        if request.method == "hold":
            self.entered.set()
            self.release.wait(30)
        responder.result(200, {})


@pytest.fixture
def server() -> Iterator[tuple[ApiServer, Holding]]:
    home = tempfile.mkdtemp(prefix="ah-pn-")
    dispatcher = Holding()
    api = ApiServer([f"ipc://{home}/api.sock"], f"ipc://{home}/events.sock", dispatcher)
    api.start()
    try:
        yield api, dispatcher
    finally:
        dispatcher.release.set()
        api.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _subscriber(ctx: zmq.Context[Any], api: ApiServer, topic: str) -> zmq.Socket[bytes]:
    sub: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(api.events_endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    return sub


def _heard(sub: zmq.Socket[bytes], n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        assert sub.poll(10_000), f"heard {out}, expected {n} events"
        topic, body = sub.recv_multipart()
        out.append(body)
    return out


def _hold_the_loop(api: ApiServer, dispatcher: Holding) -> threading.Thread:
    """A request whose dispatch keeps the transport loop busy until `dispatcher.release`."""

    def call() -> None:
        with Client(api.endpoints[0], timeout=30) as client:
            client.call("hold")

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    assert dispatcher.entered.wait(10)
    return thread


def test_an_event_published_now_leaves_on_the_callers_thread_and_wakes_no_loop(
    server: tuple[ApiServer, Holding], ctx: zmq.Context[Any]
) -> None:
    api, _ = server
    sub = _subscriber(ctx, api, "ws")
    wait_for(lambda: api.wants("ws"))
    time.sleep(0.2)  # the loop's look at the subscription is over: it sleeps in its poll
    woken = api.wakeups
    bodies = [f"delta-{n}".encode() for n in range(50)]
    for body in bodies:
        assert api.publish_now([(b"ws", body)])
        time.sleep(0.002)  # a stream's pace: through the outbox, each would wake the loop
    assert _heard(sub, 50) == bodies
    assert api.events_now == 50
    # No hand-over through the outbox: the loop slept on (its XPUB descriptor may still
    # signal the sends' own commands, which it reads as a subscription look).
    assert api.wakeups - woken < 10


def test_an_event_published_now_waits_behind_events_still_in_the_outbox(
    server: tuple[ApiServer, Holding], ctx: zmq.Context[Any]
) -> None:
    """The event order law across the two ways: an event handed to the loop and not yet sent
    (the loop busy) keeps a later `publish_now` behind it in the outbox; once the outbox's
    events are out, the next goes straight again."""
    api, dispatcher = server
    sub = _subscriber(ctx, api, "ws")
    wait_for(lambda: api.wants("ws"))
    holder = _hold_the_loop(api, dispatcher)
    assert api.publish_frames([(b"ws", b"first, through the outbox")])
    assert api.publish_now([(b"ws", b"second")])
    assert api.events_now == 0  # not sent past the event still in the outbox
    dispatcher.release.set()
    holder.join(10)
    assert _heard(sub, 2) == [b"first, through the outbox", b"second"]
    assert api.publish_now([(b"ws", b"third")])
    assert _heard(sub, 1) == [b"third"]
    assert api.events_now == 1


def test_a_subscription_whose_signal_a_send_now_took_is_still_read(
    server: tuple[ApiServer, Holding], ctx: zmq.Context[Any]
) -> None:
    """A send on the XPUB processes its pending commands, a new subscriber's subscription
    among them, and so takes the descriptor signal the loop sleeps on: `publish_now` sees the
    subscription waiting and wakes the loop to read it (else `wants` would never know of
    it, and every event of that workspace would be skipped)."""
    api, dispatcher = server
    first = _subscriber(ctx, api, "ws")
    wait_for(lambda: api.wants("ws"))
    holder = _hold_the_loop(api, dispatcher)
    late = _subscriber(ctx, api, "late")
    time.sleep(0.3)  # the subscription is at the XPUB, its signal on the loop's descriptor
    # Sends that take every signal on the descriptor (the subscription's, and those its
    # sends make), as a stream of deltas would while the loop is busy.
    for _ in range(10):
        assert api.publish_now([(b"ws", b"takes the signal")])
        time.sleep(0.02)
    assert api.events_now == 10
    dispatcher.release.set()
    holder.join(10)
    wait_for(lambda: api.wants("late"), timeout=5)
    assert api.publish_now([(b"late", b"heard")])
    assert _heard(late, 1) == [b"heard"]
    assert _heard(first, 10) == [b"takes the signal"] * 10


@pytest.mark.parametrize("which", ["plain", "exact"])
def test_a_send_now_looks_only_at_the_xpub_it_sent_on(
    which: str, ctx: zmq.Context[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an XPUB handed the frames may have had its descriptor signal taken by the send:
    `publish_now` looks at that one's `zmq.EVENTS` alone (each look builds an enum inside
    pyzmq, per streamed delta), and the event still reaches its subscriber (turnall)."""
    import transport.server as server_module

    home = tempfile.mkdtemp(prefix="ah-pn-")
    api = ApiServer(
        [f"ipc://{home}/api.sock"],
        f"ipc://{home}/events.sock",
        Holding(),
        events_exact_endpoint=f"ipc://{home}/exact.sock",
    )
    api.start()
    try:
        sub: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        if which == "plain":
            sub.connect(api.events_endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"ws")
        else:
            sub.connect(api.events_exact_endpoints[0])
            sub.setsockopt(zmq.SUBSCRIBE, b"ws\0")
        wait_for(lambda: api.wants("ws"))
        looked: list[Any] = []
        real = server_module._getsockopt
        me = threading.get_ident()

        def counting(sock: Any, option: int) -> Any:
            if option == server_module._EVENTS and threading.get_ident() == me:
                looked.append(sock)
            return real(sock, option)

        monkeypatch.setattr(server_module, "_getsockopt", counting)
        assert api.publish_now([(b"ws", b"one")])
        events = api._events
        assert looked == [events.pub if which == "plain" else events.pub_exact]
        assert _heard(sub, 1) == [b"one"]
    finally:
        api.close()
        shutil.rmtree(home, ignore_errors=True)
