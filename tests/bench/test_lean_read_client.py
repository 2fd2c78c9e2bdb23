"""The reads benchmark's load client (`bench.loadgen.LeanClient`): a real client of
a real daemon — every reply it counts is the success reply to the request it sent (its id),
an error reply is reported as such, and the read loop records both methods."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.daemon import WS, DaemonProcess, create_session

from bench.loadgen import LeanClient, latencies, loop_read

pytestmark = pytest.mark.timeout(60)


def test_the_lean_read_client_gets_checked_replies_from_a_real_daemon(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "home").start()
    lean = LeanClient(daemon.api, timeout=20.0)
    try:
        sid = create_session(daemon.client())["agentSessionId"]
        head = LeanClient.head("session.get", {"workspaceId": WS, "agentSessionId": sid})
        status, body = lean.call_raw(head)
        assert status == 200 and body["session"]["agentSessionId"] == sid
        # A second call with the same pre-encoded request gets a fresh id and its own reply.
        assert lean.call_raw(head) == (status, body)
        status, error = lean.call_raw(
            LeanClient.head("fork.get", {"workspaceId": WS, "operationId": "no-such-op"})
        )
        assert status == 404 and error["reason"]
        records = loop_read(
            lean,
            None,  # type: ignore[arg-type]  # the read loop waits for no events
            {"ws": WS, "sids": [sid], "ops": ["no-such-op"], "offset": 0},
            time.monotonic() + 0.3,
        )
        kinds = {r["kind"] for r in records}
        assert kinds == {"session.get", "fork.get"}
        assert all(r["status"] == 200 for r in records if r["kind"] == "session.get")
        assert all(r["status"] == 404 for r in records if r["kind"] == "fork.get")
        assert len(latencies(records)) == sum(1 for r in records if r["status"] < 400)
    finally:
        lean.close()
        daemon.stop()


def test_a_reply_to_another_request_is_never_counted(tmp_path: Path) -> None:
    """A reply whose id is not the request's fails the call (the run), it is not a read."""
    import threading

    import msgpack
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    endpoint = f"ipc://{tmp_path}/fake.sock"
    router.bind(endpoint)

    def answer_wrong_id() -> None:
        identity, _ = router.recv_multipart()
        reply = {"v": 1, "id": str(uuid.uuid4()), "status": 200, "result": {}}
        router.send_multipart([identity, msgpack.packb(reply)])

    thread = threading.Thread(target=answer_wrong_id)
    thread.start()
    lean = LeanClient(endpoint, timeout=10.0)
    try:
        with pytest.raises(RuntimeError, match="does not answer"):
            lean.call_raw(LeanClient.head("session.get", {"workspaceId": WS}))
    finally:
        thread.join(10)
        lean.close()
        router.close(0)
        ctx.term()
    with pytest.raises(ValueError):
        LeanClient("tcp://127.0.0.1:1")


class _Counting(LeanClient):
    """A LeanClient that remembers which methods it was asked to call."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint, timeout=20.0)
        self.methods: list[str] = []

    def call_raw(self, head: bytes) -> tuple[int, dict]:
        import msgpack

        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(head[1:])  # the map header, then key/value pairs up to `id`
        fields = list(unpacker)
        self.methods.append(str(fields[fields.index("method") + 1]))
        return super().call_raw(head)


def test_the_mutation_loop_waits_for_its_turn_on_events_without_asking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation benchmark's client (lean, like the reads'): each cycle's three requests
    answered, and its wait for the Turn it submitted ends on that Turn's settled event — no
    `session.get` on the daemon while events arrive (the fallback poll is pushed out of reach
    here, so a missed event would hang the wait, not pass)."""
    import bench.loadgen as loadgen

    monkeypatch.setattr(loadgen, "FALLBACK_POLL_S", 60.0)
    daemon = DaemonProcess(tmp_path / "home").start()
    lean = _Counting(daemon.api)
    waiter = loadgen.Waiter(lean, daemon.events)
    try:
        sid = create_session(daemon.client())["agentSessionId"]
        records = loadgen.loop_mutate(lean, waiter, {"ws": WS, "sid": sid}, time.monotonic() + 1)
        kinds = [r["kind"] for r in records]
        assert kinds[:3] == ["turn.submit", "session.updateTitle", "session.timeline"]
        assert len(kinds) % 3 == 0 and all(r["status"] < 400 for r in records)
        assert "session.get" not in lean.methods
        # Every page of the timeline: a quiet machine runs more cycles in the second than
        # one page holds (157 against the page of 100 once).
        turns: list[dict[str, Any]] = []
        after = 0
        while True:
            page = daemon.client().call(
                "session.timeline",
                {"workspaceId": WS, "agentSessionId": sid, "afterSequence": after, "limit": 100},
            )
            turns += page["turns"]
            if not page["turns"] or page.get("nextSequence") is None:
                break
            after = page["nextSequence"]
        assert len(turns) == len(kinds) // 3
        assert all(t["phase"] == "settled" for t in turns)
        # Without the Turn's id (a refused submit) the waiter asks the daemon, at once.
        waiter.turn_settled(WS, sid, time.monotonic() + 10)
        assert lean.methods[-1] == "session.get"
    finally:
        waiter.close()
        lean.close()
        daemon.stop()
