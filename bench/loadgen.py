"""Load generators: each client is its own process (spawned, one DEALER each) running a closed
loop against the daemon socket until a shared deadline, recording every request it makes.

Separate processes keep the clients' own GIL out of the latencies we report; on 2 cores the
clients still compete with the daemon for CPU, which every figure here includes.

Every loop uses `LeanClient`, not `transport.client.Client`: on 2 cores the
load clients' own CPU competes with the daemon's, and the full client spends ~0.5 ms of CPU per
call on its socket thread, pipe and futures (issue 20; docs/performance.md §15). The lean one
is what an efficient real client is: one DEALER used from the calling thread, each request
encoded on that thread with a fresh id, each reply decoded and checked to answer that id. A
client waiting for its Turn to settle waits for that Turn's event, as a GUI does.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

Record = dict[str, Any]
"""One request: `kind`, `t0`/`t1` (epoch ms), `status`, `reason`, plus loop-specific keys."""

FALLBACK_POLL_S = 1.0
"""How long a client waiting on events for its Turn's settlement waits before it asks."""


@dataclass(frozen=True, slots=True)
class ClientSpec:
    loop: str
    """A loop name in `LOOPS`."""
    args: Mapping[str, Any]


def now_ms() -> float:
    return time.time() * 1000.0


def request(c: Any, method: str, params: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """`(status, body)` of one call through either client: a `LeanClient` encodes the request
    on the calling thread, a `transport.client.Client` through its socket thread."""
    if isinstance(c, LeanClient):
        return c.call_raw(LeanClient.head(method, params))
    status, body = c.call_raw(method, params)
    return int(status), body


def _call(
    c: Any, kind: str, method: str, params: Mapping[str, Any]
) -> tuple[Record, dict[str, Any]]:
    t0 = now_ms()
    status, body = request(c, method, params)
    t1 = now_ms()
    rec: Record = {"kind": kind, "t0": t0, "t1": t1, "status": status, "reason": ""}
    if isinstance(c, LeanClient):
        rec["id"] = c.last_id
    if status >= 400:
        rec["reason"] = str(body.get("reason", ""))
    return rec, body


class LeanClient:
    """A synchronous request client as lean as an efficient real one (see the module
    docstring): no background thread, no futures, no per-call encode of the params.

    `head(method, params)` encodes a request once, without its id; `call_raw(head)` sends it
    under a fresh id and returns `(status, body)` like `Client.call_raw`, after checking the
    reply is a version-1 reply to that id (anything else raises: the run fails, it is never
    counted as a read). ipc endpoints only (a tcp endpoint would need CURVE keys)."""

    def __init__(self, endpoint: str, *, timeout: float = 120.0) -> None:
        if not endpoint.startswith("ipc://"):
            raise ValueError(f"LeanClient speaks ipc only, not {endpoint!r}")
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        self._sock.connect(endpoint)
        self._prefix = f"lean-{os.getpid():x}-"
        self._n = 0
        self.last_id = ""
        """The wire id of the last request sent (`bench.mutation_stages` joins the daemon's
        stamps on it)."""

    @staticmethod
    def head(method: str, params: Mapping[str, Any]) -> bytes:
        """The request as a 4-entry msgpack map whose last key is `id`: a call appends the
        encoded id to these bytes."""
        pack = msgpack.packb
        return b"".join(
            (
                b"\x84",
                pack("v"),
                pack(1),
                pack("method"),
                pack(method),
                pack("params"),
                pack(dict(params), use_bin_type=True),
                pack("id"),
            )
        )

    def call_raw(self, head: bytes) -> tuple[int, dict[str, Any]]:
        self._n += 1
        request_id = f"{self._prefix}{self._n}"
        self.last_id = request_id
        self._sock.send(head + msgpack.packb(request_id))
        try:
            frame = self._sock.recv()
        except zmq.Again:
            raise TimeoutError(f"no reply to {request_id}") from None
        reply = msgpack.unpackb(frame, raw=False)
        if not isinstance(reply, dict) or reply.get("v") != 1 or reply.get("id") != request_id:
            raise RuntimeError(f"reply {reply!r:.200} does not answer request {request_id}")
        status = reply.get("status")
        if not isinstance(status, int):
            raise RuntimeError(f"reply to {request_id} without an integer status")
        body = reply.get("result") if status < 400 else reply.get("error")
        return status, body if isinstance(body, dict) else {}

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()


def loop_mutate(c: Any, waiter: Waiter, args: Mapping[str, Any], deadline: float) -> list[Record]:
    """Per cycle on the client's own Session: `turn.submit` (202), `session.updateTitle`,
    `session.timeline`, then wait (unrecorded polls) until the Turn settles."""
    ws, sid = args["ws"], args["sid"]
    out: list[Record] = []
    i = 0
    while time.monotonic() < deadline:
        i += 1
        rec, body = _call(
            c,
            "turn.submit",
            "turn.submit",
            {
                "workspaceId": ws,
                "agentSessionId": sid,
                "requestId": str(uuid.uuid4()),
                "input": [{"type": "text", "text": f"mutation {i}"}],
            },
        )
        out.append(rec)
        turn_id = body["turn"]["turnId"] if rec["status"] < 400 else None
        rec, _ = _call(
            c,
            "session.updateTitle",
            "session.updateTitle",
            {"workspaceId": ws, "agentSessionId": sid, "title": f"title {i}"},
        )
        out.append(rec)
        rec, _ = _call(
            c,
            "session.timeline",
            "session.timeline",
            {"workspaceId": ws, "agentSessionId": sid, "limit": 20},
        )
        out.append(rec)
        waiter.turn_settled(ws, sid, deadline + 60, turn_id)
    return out


class Waiter:
    """Waits for a Turn to settle or an operation to end from the events socket, as a GUI
    would, so waiting adds no request load; a slow poll covers a missed event."""

    def __init__(self, c: Any, events: str | None, topics: Sequence[str] = ("",)) -> None:
        """`topics`: the workspaces subscribed to ("" = every topic, the default: a GUI's
        view of every workspace)."""
        self.c = c
        self.sub = None
        if events:
            from transport.client import EventSubscriber

            self.sub = EventSubscriber(events, topics)

    def close(self) -> None:
        if self.sub is not None:
            self.sub.close()

    def _next_event(self, ws: str, timeout: float) -> dict[str, Any] | None:
        """The next event of workspace `ws` (exact topic: ids are not unique across
        workspaces, and ZeroMQ topics are prefixes)."""
        if self.sub is None:
            time.sleep(timeout)
            return None
        message = self.sub.next_message(timeout)
        return None if message is None or message[0] != ws else message[1]

    def turn_settled(self, ws: str, sid: str, until: float, turn_id: str | None = None) -> None:
        """Until the Session has no active Turn. With the Turn's id and the events socket,
        its settled `turn.updated` ends the wait, with no request at all (a GUI's wait); a
        `session.get` every `FALLBACK_POLL_S` covers a missed event. Without the id (its
        submit was refused) or without events, `session.get` decides, at once and then
        every 0.2 s."""
        evented = turn_id is not None and self.sub is not None
        next_poll = time.monotonic() + FALLBACK_POLL_S if evented else 0.0
        while time.monotonic() < until:
            if time.monotonic() >= next_poll:
                status, body = request(
                    self.c, "session.get", {"workspaceId": ws, "agentSessionId": sid}
                )
                active = None if status >= 400 else body["session"]["activeTurnId"]
                if active is None or (evented and active != turn_id):
                    return
                next_poll = time.monotonic() + (FALLBACK_POLL_S if evented else 0.2)
            event = self._next_event(ws, 0.05)
            if (
                event is None
                or event.get("type") != "turn.updated"
                or event.get("agentSessionId") != sid
                or event["turn"]["phase"] != "settled"
            ):
                continue
            if not evented:
                next_poll = 0.0  # confirm with one read: the settled turn may be an older one
            elif event["turn"]["turnId"] == turn_id:
                return

    def operation_ended(self, ws: str, op: dict[str, Any], until: float) -> dict[str, Any]:
        next_poll = time.monotonic() + 0.2
        while op["status"] == "accepted" and time.monotonic() < until:
            event = self._next_event(ws, 0.05)
            if (
                event is not None
                and event.get("type") == "fork.operation"
                and event["operation"]["operationId"] == op["operationId"]
            ):
                op = event["operation"]
                continue
            if time.monotonic() >= next_poll:
                st, got = request(
                    self.c, "fork.get", {"workspaceId": ws, "operationId": op["operationId"]}
                )
                if st < 400:
                    op = got["operation"]
                next_poll = time.monotonic() + 0.2
        return op


def loop_fork(c: Any, waiter: Waiter, args: Mapping[str, Any], deadline: float) -> list[Record]:
    """Fork the client's source through its last settled Turn until the deadline: create,
    poll `fork.get` while `accepted`, ACK a commit (so the barrier lets the next one through).

    With `follow_latest`, the boundary is re-read before each attempt (the source grows when
    a racing client submits turns); a refusal is recorded and retried after a short pause.
    """
    ws, sid = args["ws"], args["sid"]
    turn_id = str(args.get("turn_id") or "")
    follow = bool(args.get("follow_latest"))
    out: list[Record] = []
    while time.monotonic() < deadline:
        if follow or not turn_id:
            turn_id = _last_settled(c, ws, sid) or turn_id
        t0 = now_ms()
        status, body = request(
            c,
            "fork.create",
            {
                "workspaceId": ws,
                "agentSessionId": sid,
                "requestId": str(uuid.uuid4()),
                "targetAgentSessionId": str(uuid.uuid4()),
                "point": {"type": "throughTurn", "turnId": turn_id},
            },
        )
        rec: Record = {"kind": "fork", "t0": t0, "status": status, "turnId": turn_id}
        if status >= 400:
            rec.update(
                t1=now_ms(),
                reason=str(body.get("reason", "")),
                boundary=str((body.get("params") or {}).get("forkBoundaryReason", "")),
            )
            out.append(rec)
            time.sleep(0.005)
            continue
        op = waiter.operation_ended(ws, body["operation"], deadline + 120)
        rec.update(
            t1=now_ms(),
            reason=op["status"],
            operationId=op["operationId"],
            targetAgentSessionId=op["targetAgentSessionId"],
            error=op.get("error"),
        )
        out.append(rec)
        if op["status"] == "committed":
            request(c, "fork.acknowledge", {"workspaceId": ws, "operationId": op["operationId"]})
    return out


def _last_settled(c: Any, ws: str, sid: str) -> str | None:
    last, after = None, 0
    while True:
        status, body = request(
            c,
            "session.timeline",
            {"workspaceId": ws, "agentSessionId": sid, "afterSequence": after, "limit": 1000},
        )
        if status >= 400:
            return last
        for t in body["turns"]:
            if t["phase"] == "settled":
                last = str(t["turnId"])
        if body.get("nextSequence") is None:
            return last
        after = int(body["nextSequence"])


def loop_race_mutate(
    c: Any, waiter: Waiter, args: Mapping[str, Any], deadline: float
) -> list[Record]:
    """Mutations aimed at a Session that another client keeps forking: a fenced `turn.submit`
    (unique text) and a fenced `session.updateSettings` (increasing counter), plus the
    unfenced `session.updateTitle`. Each record keeps the durable write time the reply shows
    (`durableMs`), so the checker can place it against the fork operations' fence windows."""
    ws, sid, tag = args["ws"], args["sid"], args["tag"]
    out: list[Record] = []
    i = 0
    while time.monotonic() < deadline:
        i += 1
        text = f"race {tag} {i}"
        rec, body = _call(
            c,
            "turn.submit",
            "turn.submit",
            {
                "workspaceId": ws,
                "agentSessionId": sid,
                "requestId": str(uuid.uuid4()),
                "input": [{"type": "text", "text": text}],
            },
        )
        rec["text"] = text
        turn_id = None
        if rec["status"] < 400:
            rec["durableMs"] = body["turn"]["createdAtUnixMs"]
            rec["turnId"] = turn_id = body["turn"]["turnId"]
        out.append(rec)
        rec, body = _call(
            c,
            "session.updateSettings",
            "session.updateSettings",
            {"workspaceId": ws, "agentSessionId": sid, "settings": {"bench": f"{tag}-{i}"}},
        )
        rec["value"] = f"{tag}-{i}"
        if rec["status"] < 400:
            rec["durableMs"] = body["session"]["updatedAtUnixMs"]
        out.append(rec)
        rec, body = _call(
            c,
            "session.updateTitle",
            "session.updateTitle",
            {"workspaceId": ws, "agentSessionId": sid, "title": f"race {tag} {i}"},
        )
        out.append(rec)
        waiter.turn_settled(ws, sid, deadline + 60, turn_id)
    return out


def loop_read(c: Any, waiter: Waiter, args: Mapping[str, Any], deadline: float) -> list[Record]:
    """Alternate `session.get` over `sids` and `fork.get` over `ops`, one request in flight,
    through the `LeanClient` `c` (see the module docstring)."""
    ws = args["ws"]
    heads = [
        ("session.get", LeanClient.head("session.get", {"workspaceId": ws, "agentSessionId": s}))
        for s in args["sids"]
    ]
    op_heads = [
        ("fork.get", LeanClient.head("fork.get", {"workspaceId": ws, "operationId": op}))
        for op in args["ops"]
    ]
    call = c.call_raw
    out: list[Record] = []
    i = int(args.get("offset", 0))
    while time.monotonic() < deadline:
        i += 1
        if op_heads and i % 2:
            kind, head = op_heads[i % len(op_heads)]
        else:
            kind, head = heads[i % len(heads)]
        t0 = now_ms()
        status, body = call(head)
        rec: Record = {"kind": kind, "t0": t0, "t1": now_ms(), "status": status, "reason": ""}
        if status >= 400:
            rec["reason"] = str(body.get("reason", ""))
        out.append(rec)
    return out


LOOPS: dict[str, Callable[[Any, Waiter, Mapping[str, Any], float], list[Record]]] = {
    "mutate": loop_mutate,
    "fork": loop_fork,
    "race_mutate": loop_race_mutate,
    "read": loop_read,
}


def _client_main(
    endpoint: str,
    events: str | None,
    spec: ClientSpec,
    duration_s: float,
    index: int,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    # Every loop's client is the lean one (see the module docstring), connected before the
    # release like the others.
    client = LeanClient(endpoint, timeout=120.0)
    waiter = Waiter(client, events, tuple(spec.args.get("subscribe", ("",))))
    try:
        ready.put(index)
        go.wait(120)
        deadline = time.monotonic() + duration_s
        try:
            records = LOOPS[spec.loop](client, waiter, spec.args, deadline)
            results.put((index, records, None))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run
            results.put((index, [], f"{type(exc).__name__}: {exc}"))
    finally:
        waiter.close()
        client.close()


def run_clients(
    endpoint: str,
    specs: Sequence[ClientSpec],
    duration_s: float,
    *,
    events: str | None = None,
    on_start: Any = None,
) -> list[list[Record]]:
    """Start one process per spec, release them together, and return each one's records.

    `on_start()` is called right after the release (e.g. to start a profiler); its return
    value is ignored.
    """
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=_client_main,
            args=(endpoint, events, spec, duration_s, i, ready, go, results),
            daemon=True,
        )
        for i, spec in enumerate(specs)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        go.set()
        if on_start is not None:
            on_start()
        out: dict[int, list[Record]] = {}
        errors: list[str] = []
        for _ in procs:
            index, records, error = results.get(timeout=duration_s + 300)
            out[index] = records
            if error:
                errors.append(f"client {index} ({specs[index].loop}): {error}")
        if errors:
            raise RuntimeError("; ".join(errors))
        return [out[i] for i in range(len(specs))]
    except queue.Empty as exc:
        raise RuntimeError("a load client did not report in time") from exc
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                with contextlib.suppress(Exception):
                    p.kill()
                    p.join(5)


def latencies(
    records: Sequence[Record], kind: str | None = None, ok_only: bool = True
) -> list[float]:
    return [
        r["t1"] - r["t0"]
        for r in records
        if (kind is None or r["kind"] == kind) and (not ok_only or r["status"] < 400)
    ]
