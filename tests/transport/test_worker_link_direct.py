"""The worker's link end sends on the sender's own thread: a delta from the provider's reader
reaches the host with no link thread woken, frames leave in the order their senders sent
them even when the socket's high-water mark pushes them to the backlog, and requests still
reach the link's thread while senders keep the socket busy (the `zmq.FD` edge they take is
handed back through the wake-up pipe). Real ZeroMQ ipc sockets, a real host ROUTER."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.support.python_calls import python_calls
from transport.worker_link import (
    HEARTBEAT_INTERVAL_S,
    MAX_LINK_FRAME,
    HostEnd,
    MsgType,
    WorkerEnd,
    req_msg,
)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostEnd]:
    ctx: zmq.Context[Any] = zmq.Context()
    end = HostEnd(ctx, f"ipc://{tmp_path}/link.sock")
    try:
        yield end
    finally:
        end.close()
        ctx.term()


def _recv(host: HostEnd, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.socket.poll(100, zmq.POLLIN):
            msg = host.recv()
            if msg is not None:
                return msg
    raise AssertionError("nothing from the worker")


def _events(host: HostEnd, n: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"{len(out)} of {n} events"
        msg = _recv(host, max(0.1, deadline - time.monotonic()))
        if msg["t"] == MsgType.EVT:
            out.append(msg)
    return out


def _drain(host: HostEnd) -> None:
    for _ in range(2000):  # bounded: the streamer may keep up with the reads
        try:
            host.socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


def _worker(
    host: HostEnd, on_request: Any = None, ctx: zmq.Context[Any] | None = None
) -> WorkerEnd:
    end = WorkerEnd(
        host.endpoint,
        provider="p",
        version="1",
        on_request=on_request or (lambda msg: None),
        ctx=ctx,
    )
    end.start()
    assert _recv(host)["t"] == MsgType.HELLO
    return end


def test_an_event_leaves_on_the_senders_thread_while_the_link_thread_is_busy(
    host: HostEnd,
) -> None:
    # The link's thread is held inside a request handler: an event sent meanwhile must still
    # reach the host (it did not need that thread), and it was sent directly.
    entered, release = threading.Event(), threading.Event()

    def on_request(msg: dict[str, Any]) -> None:
        entered.set()
        release.wait(20)

    end = _worker(host, on_request)
    try:
        assert host.send(req_msg(1, "hold", {}))
        assert entered.wait(10)
        end.send_event("ws/s", {"type": "message.delta", "delta": "d00 "})
        got = _events(host, 1, timeout=5)
        assert got[0]["event"]["delta"] == "d00 "
        assert end.sent_direct == 1 and end.sent_backlog == 0
    finally:
        release.set()
        end.close()


def test_frames_keep_each_senders_order_through_the_backlog(host: HostEnd) -> None:
    # A tiny high-water mark and a host that does not read yet: most frames go to the backlog,
    # which the link's thread sends as the host drains; none is lost, each thread's in order,
    # and a direct send never overtakes a queued frame.
    ctx: zmq.Context[Any] = zmq.Context()
    ctx.setsockopt(zmq.SNDHWM, 2)
    end = _worker(host, ctx=ctx)
    threads, per_thread = 3, 400
    pad = "x" * 2048

    def sender(k: int) -> None:
        for i in range(per_thread):
            end.send_event(f"ws/{k}", {"type": "message.delta", "seq": i, "delta": pad})

    try:
        workers = [threading.Thread(target=sender, args=(k,)) for k in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(30)
        got = _events(host, threads * per_thread)
        for k in range(threads):
            seqs = [m["event"]["seq"] for m in got if m["agentSessionId"] == f"ws/{k}"]
            assert seqs == list(range(per_thread))
    finally:
        end.close()
        assert end.wait(5)
        ctx.term()
    # Read once the link's thread stopped (it counts after its send returns, which may be
    # after the host already has the frame).
    assert end.sent_backlog > 0  # the mark was reached: the backlog was exercised
    assert end.sent_direct + end.sent_backlog == threads * per_thread


def test_requests_reach_the_link_while_senders_keep_the_socket_busy(host: HostEnd) -> None:
    # Each send processes the socket's commands and may take the edge of its descriptor that
    # announced a request: the sender must wake the link's thread, or the request would wait
    # for the next heartbeat (0.5 s) — 200 of them would take far beyond the limit below.
    seen: list[int] = []
    done = threading.Event()

    def on_request(msg: dict[str, Any]) -> None:
        seen.append(int(msg["id"]))
        if len(seen) == 200:
            done.set()

    end = _worker(host, on_request)
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            end.send_event("ws/s", {"type": "message.delta", "delta": "d"})

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        for i in range(200):
            assert host.send(req_msg(i, "ping", {}))
            _drain(host)  # so the streamer's sends keep succeeding directly
            if i % 20 == 19:
                time.sleep(0.01)
        deadline = time.monotonic() + 20
        while not done.is_set() and time.monotonic() < deadline:
            _drain(host)
            done.wait(0.01)
        assert seen == list(range(200))
        assert end.sent_direct > 0
    finally:
        stop.set()
        streamer.join(10)
        end.close()


def test_heartbeats_flow_and_close_sends_what_is_queued(host: HostEnd) -> None:
    end = WorkerEnd(host.endpoint, provider="p", version="1", on_request=lambda msg: None)
    # Sent before the link started: queued, then sent by its thread after the hello.
    end.send_event("ws/s", {"type": "message.delta", "delta": "early"})
    end.start()
    assert _recv(host)["t"] == MsgType.HELLO
    assert _events(host, 1)[0]["event"]["delta"] == "early"
    kinds = {_recv(host)["t"] for _ in range(2)}
    assert kinds == {MsgType.HB}
    end.close()
    assert end.wait(5)
    # Read once the link's thread stopped (it counts after its send returns, which may be
    # after the host already has the frame).
    assert end.sent_backlog == 1
    end.send_event("ws/s", {"type": "message.delta", "delta": "late"})  # dropped, no error
    assert end.sent_direct == 0


def test_a_streamed_delta_sends_by_the_sockets_own_calls(host: HostEnd) -> None:
    # A delta's send on the provider's reader thread is the link's two functions and the one
    # `zmq.EVENTS` look (pyzmq builds its option enum inside): no `msgpack.packb` (a Packer
    # built per call), no pyzmq `Socket.send` wrapper, no `_after_op` call — and the host gets
    # the same frame.
    end = _worker(host)
    try:
        event = {"type": "message.delta", "turnId": "t", "itemId": "i", "delta": "d00 "}
        end.send_event("ws/s", event)  # this thread's Packer made
        assert _events(host, 1, timeout=5)[0]["event"] == event
        calls = python_calls(lambda: end.send_event("ws/s", event))
        assert _events(host, 1, timeout=5)[0]["event"] == event
        ours = [c for c in calls[1:] if not c.startswith(("EnumType.", "Enum."))]
        assert ours == ["WorkerEnd.send_event", "WorkerEnd._send_frame"], calls
        assert end.sent_direct == 2
    finally:
        end.close()


def test_a_request_is_read_without_a_failed_recv_or_a_pipe_read(
    host: HostEnd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link's thread woken by a request alone reads it with one `recv`, ends the reading
    with a look at `zmq.EVENTS` — no `recv` that fails with `zmq.Again` (each socket call is a
    libzmq mailbox look, `getpid` and `poll`, and an `Again` a Python exception built) — and
    does not read the wake-up pipe that did not wake it."""
    import os

    import transport.worker_link as link

    calls = {"recv": 0, "again": 0, "pipe_reads": 0}

    def counting(real: Any) -> Any:
        def recv(sock: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name != "worker-link":
                return real(sock, *args, **kwargs)
            calls["recv"] += 1
            try:
                return real(sock, *args, **kwargs)
            except zmq.Again:
                calls["again"] += 1
                raise

        return recv

    monkeypatch.setattr(link, "HEARTBEAT_INTERVAL_S", 60.0)  # no heartbeat's timed wake-up
    monkeypatch.setattr(link, "_recv", counting(link._recv))
    monkeypatch.setattr(zmq.Socket, "recv", counting(zmq.Socket.recv))
    got = threading.Semaphore(0)
    worker = _worker(host, on_request=lambda msg: got.release())
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        if threading.current_thread().name == "worker-link":
            calls["pipe_reads"] += 1
        return real_read(fd, n)

    try:
        time.sleep(0.2)  # the start's wake-up read
        monkeypatch.setattr(os, "read", read)
        for key in calls:
            calls[key] = 0
        for i in range(10):
            host.send(req_msg(i, "worker.ping", {}))
            assert got.acquire(timeout=10)
            time.sleep(0.02)  # the thread back asleep: each request wakes it alone
        monkeypatch.setattr(os, "read", real_read)
        seen = dict(calls)  # before the close's own wake-up
    finally:
        worker.close()
    assert seen == {"recv": 10, "again": 0, "pipe_reads": 0}, seen


def _kinds_until(host: HostEnd, until: float) -> list[str]:
    kinds: list[str] = []
    while time.monotonic() < until:
        if host.socket.poll(20, zmq.POLLIN):
            msg = host.recv()
            if msg is not None:
                kinds.append(str(msg["t"]))
    return kinds


def test_no_heartbeat_leaves_while_other_frames_do_and_they_resume_once_quiet(
    host: HostEnd,
) -> None:
    # Every frame is contact to the host (`last_seen`), so a heartbeat on top of a Turn's
    # stream tells it nothing: none is sent in an interval in which another frame was. Once the
    # worker falls quiet they come back, so the host still hears it at least every 2 intervals.
    end = _worker(host)
    try:
        stop = time.monotonic() + 4 * HEARTBEAT_INTERVAL_S
        kinds: list[str] = []
        while time.monotonic() < stop:
            end.send_event("ws/s", {"type": "message.delta", "delta": "d"})
            kinds += _kinds_until(host, time.monotonic() + 0.05)
        assert kinds.count(MsgType.EVT) >= 20
        assert MsgType.HB not in kinds  # 4 on top of the stream before this change
        assert end.heartbeats == 0
        quiet = _kinds_until(host, time.monotonic() + 3 * HEARTBEAT_INTERVAL_S)
        assert MsgType.HB in quiet
        assert end.heartbeats >= 1
    finally:
        end.close()


def _answer(host: HostEnd) -> dict[str, Any]:
    """The next frame from the worker that is not a heartbeat."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        msg = _recv(host, max(0.1, deadline - time.monotonic()))
        if msg["t"] != MsgType.HB:
            return msg
    raise AssertionError("no answer from the worker")


def test_a_result_past_the_link_frame_is_answered_as_a_typed_error(host: HostEnd) -> None:
    # The host's end drops a frame past `MAX_LINK_FRAME` (ZeroMQ's MAXMSGSIZE), and the
    # connection with it: a result that large was never heard and the host waited out its
    # timeout. The worker answers it as a typed error instead; the link carries on.
    worker = _worker(host)
    try:
        worker.send_result(1, {"blob": "x" * MAX_LINK_FRAME})
        answer = _answer(host)
        assert answer["t"] == MsgType.RES and answer["id"] == 1 and answer["ok"] is False
        error = answer["error"]
        assert (error["code"], error["reason"]) == ("provider_error", "reply_too_large")
        assert error["params"]["maxBytes"] == MAX_LINK_FRAME
        assert error["params"]["bytes"] > MAX_LINK_FRAME
        worker.send_result(2, {"fits": True})
        assert _answer(host)["result"] == {"fits": True}
    finally:
        worker.close()
