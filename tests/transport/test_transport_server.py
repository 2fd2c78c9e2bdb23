"""The ApiServer through real ipc and tcp sockets: every bad frame gets its typed reply and the
server keeps serving; DEALER and REQ clients; replies from other threads; events; socket
permissions; shutdown and overload."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zmq
from transport_harness import Running

from domain.errors import Conflict
from protocol.envelope import MAX_FRAME
from protocol.events import UnknownEvent
from transport.client import ApiError, Client, ClientClosed, ClientTimeout, EventSubscriber
from transport.server import ApiServer, EndpointInUse

pytestmark = pytest.mark.timeout(60)

MakeClient = Callable[..., Client]


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def request(request_id: str, method: str, params: dict[str, Any] | None = None) -> bytes:
    return pack({"v": 1, "id": request_id, "method": method, "params": params or {}})


BAD_FRAMES: dict[str, tuple[bytes, int, str, str | None]] = {
    "not_msgpack": (b"\xc1\xc1", 400, "malformed_request", None),
    "empty": (b"", 400, "malformed_request", None),
    "not_a_map": (pack([1, "id", "echo"]), 400, "malformed_request", None),
    "missing_v": (pack({"id": "a1", "method": "echo"}), 400, "malformed_request", "a1"),
    "missing_id": (pack({"v": 1, "method": "echo"}), 400, "malformed_request", None),
    "missing_method": (pack({"v": 1, "id": "a3"}), 400, "malformed_request", "a3"),
    "wrong_v_type": (
        pack({"v": "1", "id": "a4", "method": "echo"}),
        400,
        "malformed_request",
        "a4",
    ),
    "wrong_version": (pack({"v": 9, "id": "a5", "method": "echo"}), 400, "malformed_request", "a5"),
    "wrong_id_type": (pack({"v": 1, "id": 12, "method": "echo"}), 400, "malformed_request", None),
    "wrong_method_type": (
        pack({"v": 1, "id": "a7", "method": ["echo"]}),
        400,
        "malformed_request",
        "a7",
    ),
    "wrong_params_type": (
        pack({"v": 1, "id": "a8", "method": "echo", "params": 3}),
        400,
        "malformed_request",
        "a8",
    ),
    "empty_id": (pack({"v": 1, "id": "", "method": "echo"}), 400, "malformed_request", None),
    "id_too_long": (
        pack({"v": 1, "id": "i" * 129, "method": "echo"}),
        400,
        "malformed_request",
        None,
    ),
    "unknown_method": (request("a9", "no.such.method"), 400, "unknown_method", "a9"),
    "oversize": (
        request("big", "echo", {"blob": b"x" * MAX_FRAME}),
        413,
        "payload_too_large",
        "big",
    ),
    "oversize_garbage": (b"\xff" * (2 * MAX_FRAME), 413, "payload_too_large", None),
}


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_bad_frame_gets_typed_error_and_next_request_still_succeeds(
    running: Running, client_for: MakeClient, transport: str, case: str
) -> None:
    frame, status, reason, echoed_id = BAD_FRAMES[case]
    client = client_for(running.ipc if transport == "ipc" else running.tcp, timeout=10)
    reply = client.exchange_frame(frame)
    assert reply["v"] == 1
    assert reply["id"] == echoed_id
    assert reply["status"] == status
    assert reply["error"]["reason"] == reason
    expected_code = "payload_too_large" if status == 413 else "invalid_request"
    assert reply["error"]["code"] == expected_code
    assert reply["error"]["retryable"] is False
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]
    assert "result" not in reply
    assert client.call("echo", {"after": case})["params"] == {"after": case}


def test_unroutable_multipart_envelope_is_dropped_and_server_keeps_serving(
    running: Running, client_for: MakeClient
) -> None:
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(running.tcp)
        dealer.send_multipart([b""] * 40 + [request("r1", "echo")])
        dealer.send_multipart([b"", request("r2", "echo")])
        assert dealer.poll(10_000)
        reply = msgpack.unpackb(dealer.recv_multipart()[-1])
        # The 40-frame message got no reply at all; the next request did.
        assert reply["id"] == "r2" and reply["status"] == 200
    finally:
        dealer.close()
    assert client_for(running.ipc).call("echo", {"x": 1})["params"] == {"x": 1}


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_req_client_gets_replies_including_errors(running: Running, transport: str) -> None:
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        req.connect(running.ipc if transport == "ipc" else running.tcp)
        req.send(request("q1", "echo", {"n": 1}))
        assert msgpack.unpackb(req.recv()) == {
            "v": 1,
            "id": "q1",
            "status": 200,
            "result": {"params": {"n": 1}, "id": "q1"},
        }
        req.send(b"not msgpack \xc1")
        reply = msgpack.unpackb(req.recv())
        assert (reply["id"], reply["status"]) == (None, 400)
        req.send(request("q2", "later", {"delayMs": 20, "n": 2}))
        assert msgpack.unpackb(req.recv())["result"] == {"later": 2}
    finally:
        req.close()


def test_dealer_with_empty_delimiter_gets_it_back(running: Running) -> None:
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(running.ipc)
        dealer.send_multipart([b"", request("d1", "accept")])
        assert dealer.poll(10_000)
        frames = dealer.recv_multipart()
        assert frames[0] == b"" and len(frames) == 2
        assert msgpack.unpackb(frames[1])["status"] == 202
    finally:
        dealer.close()


def test_client_call_returns_result_and_raises_api_error(
    running: Running, client_for: MakeClient
) -> None:
    client = client_for(running.ipc)
    assert client.call_raw("accept") == (202, {"accepted": True})
    with pytest.raises(ApiError) as caught:
        client.call("conflict")
    err = caught.value
    assert (err.status, err.code, err.reason, err.retryable) == (
        409,
        "conflict",
        "agent_session_busy",
        False,
    )
    assert err.message == "nope"
    with pytest.raises(ApiError) as caught:
        client.call("retryable")
    assert caught.value.retryable is True and caught.value.status == 409
    with pytest.raises(ApiError) as caught:
        client.call("no.such")
    assert (caught.value.status, caught.value.reason) == (400, "unknown_method")


def test_non_typed_exception_in_dispatcher_becomes_500_internal(
    running: Running, client_for: MakeClient
) -> None:
    client = client_for(running.tcp)
    status, body = client.call_raw("crash")
    assert status == 500
    assert (body["code"], body["reason"]) == ("internal", "internal_error")
    assert body["retryable"] is False
    # The message never leaks the exception text of a handler bug.
    assert "a bug in a handler" not in body["message"]
    status, body = client.call_raw("unencodable")
    assert (status, body["code"]) == (500, "internal")
    assert client.call("echo")["params"] == {}


def test_bad_parameter_is_invalid_argument_naming_the_field(
    running: Running, client_for: MakeClient
) -> None:
    client = client_for(running.ipc)
    good = {"workspaceId": "w", "agentSessionId": "6F9619FF-8B86-D011-B42D-00C04FC964FF"}
    assert client.call("validate", good) == {
        "agentSessionId": "6f9619ff-8b86-d011-b42d-00c04fc964ff",
        "limit": 50,
    }
    for bad, field in [
        ({**good, "workspaceId": "w" * 129}, "workspaceId"),
        ({"agentSessionId": good["agentSessionId"]}, "workspaceId"),
        ({**good, "agentSessionId": "x"}, "agentSessionId"),
        ({**good, "limit": 500}, "limit"),
        ({**good, "limit": "5"}, "limit"),
    ]:
        with pytest.raises(ApiError) as caught:
            client.call("validate", bad)
        assert (caught.value.status, caught.value.code, caught.value.reason) == (
            400,
            "invalid_request",
            "invalid_argument",
        )
        assert caught.value.params == {"field": field}


def test_responder_answers_once_and_a_late_raise_is_ignored(
    running: Running, client_for: MakeClient
) -> None:
    client = client_for(running.ipc)
    assert client.call("twice") == {"first": True}
    assert client.call("raiseAfterAnswer") == {"answered": True}
    # Exactly one reply each: nothing unmatched is left over.
    assert client.call("echo", {"n": 3})["params"] == {"n": 3}
    # The loop dispatches one request at a time, so "twice" has returned by now.
    assert running.dispatcher.second_answers == [False]
    assert client.next_unmatched(timeout=0.2) is None


@pytest.mark.timeout(90)
def test_many_requests_in_flight_over_one_client_match_by_id(
    running: Running, client_for: MakeClient
) -> None:
    client = client_for(running.ipc, timeout=30)
    # Later requests are answered first, from timer threads: matching must use the id.
    futures = [client.submit("later", {"n": n, "delayMs": (300 - n) % 50}) for n in range(300)]
    futures += [client.submit("echo", {"n": n}) for n in range(300, 1000)]
    results = [f.result(30) for f in futures]
    assert [r[1].get("later", r[1].get("params", {}).get("n")) for r in results] == list(
        range(1000)
    )
    assert all(status == 200 for status, _ in results)


@pytest.mark.timeout(90)
def test_one_client_shared_by_many_threads(running: Running, client_for: MakeClient) -> None:
    client = client_for(running.tcp, timeout=30)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for n in range(100):
                value = {"k": k, "n": n}
                method = "later" if n % 10 == 0 else "echo"
                result = client.call(method, {**value, "delayMs": 5})
                if method == "echo":
                    assert result["params"] == {**value, "delayMs": 5}
                else:
                    assert result == {"later": n}
        except BaseException as exc:  # collected and re-raised on the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert all(not t.is_alive() for t in threads)


def test_published_events_reach_subscribers_filtered_by_topic(running: Running) -> None:
    server = running.server
    with (
        EventSubscriber(server.events_endpoint, ["ws-a"]) as sub_a,
        EventSubscriber(server.events_endpoint) as sub_all,
    ):
        wait_subscribed(server, sub_a, "ws-a")
        wait_subscribed(server, sub_all, "ws-a")
        server.publish("ws-b", {"type": "session.removed", "agentSessionId": "s-b"})
        server.publish("ws-a", {"type": "session.removed", "agentSessionId": "s-a"})
        assert drain_until(sub_all, "s-a") == [("ws-b", "s-b"), ("ws-a", "s-a")]
        assert drain_until(sub_a, "s-a") == [("ws-a", "s-a")]


def test_publish_is_safe_from_many_threads_and_from_handlers(
    running: Running, client_for: MakeClient
) -> None:
    server = running.server
    with EventSubscriber(server.events_endpoint, ["ws"]) as sub:
        wait_subscribed(server, sub, "ws")

        def burst(k: int) -> None:
            for n in range(200):
                server.publish("ws", {"type": "turn.updated", "agentSessionId": f"{k}:{n}"})

        threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        client = client_for(running.ipc)
        assert client.call(
            "publish",
            {"topic": "ws", "event": {"type": "session.removed", "agentSessionId": "done"}},
        ) == {"published": True}
        seen = [sid for _, sid in drain_until(sub, "done")]
        assert seen[-1] == "done"
        got = seen[:-1]
        assert sorted(got) == sorted(f"{k}:{n}" for k in range(4) for n in range(200))
        for k in range(4):  # per-thread order is kept
            mine = [s for s in got if s.startswith(f"{k}:")]
            assert mine == [f"{k}:{n}" for n in range(200)]
    with pytest.raises(TypeError):
        server.publish("ws", {"bad": object()})


def wait_subscribed(server: ApiServer, sub: EventSubscriber, topic: str) -> None:
    # ZeroMQ's slow joiner: publish probes until one arrives, then drop any extra probes.
    for _ in range(500):
        server.publish(topic, {"type": "probe"})
        if sub.next(timeout=0.02) is not None:
            break
    else:
        raise AssertionError("subscription never became active")
    while sub.next(timeout=0.1) is not None:
        pass


def drain_until(sub: EventSubscriber, last_session: str) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    while True:
        message = sub.next_message(timeout=10)
        assert message is not None, f"event {last_session} never arrived; got {seen[-3:]}"
        topic, decoded = message
        # The probes and the bodies these tests publish are not protocol events: the
        # subscriber hands them on as `UnknownEvent`s, whose body is what was published.
        event = decoded.body if isinstance(decoded, UnknownEvent) else decoded
        if event.get("type") == "probe":
            continue
        seen.append((topic, event["agentSessionId"]))
        if event["agentSessionId"] == last_session:
            return seen


def test_run_dir_is_0700_and_sockets_0600_even_under_permissive_umask(
    short_tmp: str,
) -> None:
    run = os.path.join(short_tmp, "home", "run")
    old = os.umask(0)
    try:
        server = ApiServer([f"ipc://{run}/api.sock"], f"ipc://{run}/events.sock", lambda r, s: None)
        server.start()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
        for name in ("api.sock", "events.sock"):
            st = os.stat(os.path.join(run, name))
            assert stat.S_ISSOCK(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o600
    finally:
        server.close()
    assert os.listdir(run) == []


def test_existing_run_dir_is_tightened_to_0700(short_tmp: str) -> None:
    run = os.path.join(short_tmp, "run")
    os.makedirs(run)
    os.chmod(run, 0o755)
    with ApiServer([f"ipc://{run}/a.sock"], f"ipc://{run}/e.sock", lambda r, s: None):
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o700


def test_stale_socket_file_is_replaced_but_a_live_one_is_refused(short_tmp: str) -> None:
    path = os.path.join(short_tmp, "run", "api.sock")
    os.makedirs(os.path.dirname(path), mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens: a daemon that died
    events = f"ipc://{short_tmp}/run/events.sock"
    with ApiServer([f"ipc://{path}"], events, lambda r, s: s.result(200, {})) as first:
        with Client(first.endpoints[0]) as client:
            assert client.call("anything") == {}
        second = ApiServer([f"ipc://{path}"], f"ipc://{short_tmp}/run/e2.sock", lambda r, s: None)
        with pytest.raises(EndpointInUse):
            second.start()
        second.close()
        with Client(first.endpoints[0]) as client:
            assert client.call("still-served") == {}


def test_close_answers_in_flight_requests_with_shutting_down(
    make_server: Callable[..., Running], client_for: MakeClient
) -> None:
    running = make_server()
    client = client_for(running.ipc, timeout=10)
    futures = [client.submit("hold", {"n": n}) for n in range(5)]
    held = running.dispatcher.wait_held(5)
    held[0][1].result(200, {"answered": 0})
    assert futures[0].result(10) == (200, {"answered": 0})
    running.server.close()
    for future in futures[1:]:
        status, body = future.result(10)
        assert status == 503
        assert (body["code"], body["reason"], body["retryable"]) == (
            "unavailable",
            "shutting_down",
            True,
        )
    # Late answers after close are refused, not raised.
    assert held[1][1].result(200, {}) is False
    assert running.server.publish("ws", {"type": "x"}) is False
    assert not os.path.exists(running.ipc[len("ipc://") :])
    assert not os.path.exists(running.server.events_endpoint[len("ipc://") :])


def test_overload_answers_503_retryable_until_in_flight_drains(
    make_server: Callable[..., Running], client_for: MakeClient
) -> None:
    running = make_server(max_in_flight=4)
    client = client_for(running.tcp)
    futures = [client.submit("hold", {"n": n}) for n in range(4)]
    held = running.dispatcher.wait_held(4)
    status, body = client.call_raw("echo")
    assert status == 503
    assert (body["code"], body["reason"], body["retryable"]) == ("unavailable", "overloaded", True)
    # Bad frames are still answered while overloaded.
    assert client.exchange_frame(b"\xc1")["status"] == 400
    held[0][1].result(200, {"n": 0})
    assert futures[0].result(10) == (200, {"n": 0})
    assert client.call("echo", {"ok": 1})["params"] == {"ok": 1}
    for _, responder in held[1:]:
        responder.error(Conflict("late", reason="agent_session_busy"))
    assert [f.result(10)[0] for f in futures[1:]] == [409, 409, 409]


def test_client_timeout_and_closed_client(running: Running) -> None:
    client = Client(running.ipc, timeout=0.3)
    try:
        with pytest.raises(ClientTimeout):
            client.call("hold")
        # A timed-out call does not poison the next one.
        assert client.call("echo", timeout=10)["params"] == {}
        pending = client.submit("hold")
    finally:
        client.close()
    with pytest.raises(ClientClosed):
        pending.result(5)
    with pytest.raises(ClientClosed):
        client.call("echo")


def test_start_fails_cleanly_when_a_tcp_port_is_taken(running: Running, short_tmp: str) -> None:
    taken = running.tcp
    server = ApiServer([taken], f"ipc://{short_tmp}/x/events.sock", lambda r, s: None)
    with pytest.raises(zmq.ZMQError):
        server.start()
    server.close()
    assert not os.path.exists(f"{short_tmp}/x/events.sock")


@pytest.mark.timeout(20)
def test_close_after_a_failed_bind_returns_while_the_error_is_still_held(
    running: Running, short_tmp: str
) -> None:
    # The daemon reports the start error and then closes: the held traceback keeps the
    # bind frame alive, so close() must not rely on garbage collection to free sockets.
    server = ApiServer([running.tcp], f"ipc://{short_tmp}/y/events.sock", lambda r, s: None)
    try:
        server.start()
    except zmq.ZMQError as exc:
        held = exc
        server.close()
        assert held.__traceback__ is not None
    else:
        pytest.fail("bind of a taken port succeeded")


def test_close_from_a_handler_on_the_loop_answers_it_and_stops(
    make_server: Callable[..., Running], client_for: MakeClient
) -> None:
    running = make_server()
    client = client_for(running.ipc, timeout=10)
    held = client.submit("hold")
    running.dispatcher.wait_held(1)
    assert client.call("closeServer") == {"closing": True}
    assert held.result(10)[1]["reason"] == "shutting_down"
    assert running.server._thread is not None
    running.server._thread.join(10)
    assert not running.server._thread.is_alive()
    assert not os.path.exists(running.ipc[len("ipc://") :])


def test_an_idle_loop_blocks_in_poll(running: Running, client_for: MakeClient) -> None:
    """With nothing to do the transport loop sleeps in one blocking poll (no timeout,
    no busy polling): over a quiet half second it does not wake once."""
    server = running.server
    client_for(server.endpoints[0]).call("echo", {"x": 1})  # the loop has served a request
    time.sleep(0.2)
    before = server.wakeups
    time.sleep(0.5)
    assert server.wakeups == before
    # Work still wakes it at once.
    assert client_for(server.endpoints[0]).call("echo", {"x": 2})["params"] == {"x": 2}
    assert server.wakeups > before


def test_wants_follows_the_subscriptions_of_connected_subscribers(running: Running) -> None:
    """The events sockets report who is subscribed: a workspace is wanted while a connected
    subscriber's prefix matches it, and no longer once that subscriber is gone."""
    server = running.server
    assert not server.wants("ws-a")
    with EventSubscriber(server.events_endpoint, ["ws-a"]):
        wait_until(lambda: server.wants("ws-a"))
        assert server.wants("ws-a-longer")  # a prefix match, as ZeroMQ delivers it
        assert not server.wants("ws-b")
        with EventSubscriber(server.events_endpoint):
            wait_until(lambda: server.wants("ws-b"))  # "" subscribes to everything
        wait_until(lambda: not server.wants("ws-b"))
        assert server.wants("ws-a")
    wait_until(lambda: not server.wants("ws-a"))


def wait_until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
