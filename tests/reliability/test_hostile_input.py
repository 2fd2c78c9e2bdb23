"""Hostile input: a seeded fuzzer sends over 10,000 frames to a real daemon over
one DEALER, many in flight — random bytes, truncated msgpack, a wrong value at every field of
every method, huge ints, deep nesting, bad UTF-8, oversize frames, unknown methods, other
workspaces' ids, over-long routing envelopes — with valid requests interleaved. Every frame
gets exactly the typed error PROTOCOL.md names (or none, for an envelope the router drops),
valid requests succeed, and the daemon stays up with the data of other workspaces intact."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from tests.reliability.reliability_harness import LEDGER, fork_params, trials
from tests.support.daemon import DaemonProcess, create_session, run_turn
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.timeout(trials(300, 2400))

FRAMES = trials(10_000, 100_000)
BATCH = 500
MAX_FRAME = 1 << 20  # PROTOCOL.md: "A frame over 1 MiB → 413"
WS_A, WS_B = "ws-fuzz-a", "ws-fuzz-b"

MALFORMED = (400, "invalid_request", "malformed_request")
UNKNOWN_METHOD = (400, "invalid_request", "unknown_method")
INVALID = (400, "invalid_request", "invalid_argument")
TOO_LARGE = (413, "payload_too_large", "payload_too_large")
SESSION_404 = (404, "not_found", "workspace_agent_session_not_found")
OP_404 = (404, "not_found", "agent_session_fork_operation_not_found")
OK = (200, None, None)


@dataclass(frozen=True, slots=True)
class Case:
    """One frame and what must come back: a status/code/reason triple, the field an
    `invalid_argument` must name, or `drop` (no reply at all)."""

    kind: str
    frames: tuple[bytes, ...]
    rid: str | None
    expect: tuple[Any, ...] | None
    field: str | None = None
    null_id_ok: bool = False


@dataclass
class World:
    sid: str
    turn_id: str
    op_id: str
    ids: Iterator[int] = field(default_factory=lambda: iter(range(10**9)))

    def rid(self, kind: str) -> str:
        return f"{kind}-{next(self.ids)}"


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def envelope(rid: str, method: str, params: Any) -> dict[str, Any]:
    return {"v": 1, "id": rid, "method": method, "params": params}


# method → (valid params, {field: [wrong values]}); `None` as a wrong value means "absent".
WRONG_WS: list[Any] = [None, 1, "", "w" * 129, [], {}, True, b"ws", 1.5, -(2**63)]
WRONG_UUID: list[Any] = [None, 1, "not-a-uuid", str(uuid.uuid4()) + "0", [], {}, b"\x00" * 16]
WRONG_REQ_ID: list[Any] = [None, 0, "", "r" * 129, [], {}, False]


def schemas(w: World) -> dict[str, tuple[dict[str, Any], dict[str, list[Any]]]]:
    sess = {"workspaceId": WS_A, "agentSessionId": w.sid}
    base_wrong = {"workspaceId": WRONG_WS, "agentSessionId": WRONG_UUID}
    return {
        "session.create": (
            {"workspaceId": WS_A, "provider": "tutti-agent"},
            {
                "workspaceId": WRONG_WS,
                "agentSessionId": WRONG_UUID[1:],  # optional: absent is valid
                "provider": [None, "nope", 1, [], "TUTTI-AGENT"],
                "title": [1, "t" * 513, [], {}, True],
                "cwd": ["", 1, "c" * 4097, []],
                "settings": [1, [], "s", True],
            },
        ),
        "session.get": (dict(sess), dict(base_wrong)),
        "session.list": (
            {"workspaceId": WS_A},
            {
                "workspaceId": WRONG_WS,
                "cursor": [1, "c" * 513, [], {}],
                "limit": [0, 201, "1", 1.5, True, 2**64 - 1, -(2**63), []],
            },
        ),
        "session.timeline": (
            dict(sess),
            base_wrong
            | {
                "afterSequence": [-1, "0", 1.5, True, -(2**63), []],
                "limit": [0, 1001, 2**63, "5", False],
            },
        ),
        "session.updateSettings": (
            sess | {"settings": {"k": 1}},
            base_wrong | {"settings": [None, 1, [], "x", True]},
        ),
        "session.updateTitle": (
            sess | {"title": "fine"},
            base_wrong | {"title": [None, 1, "", "t" * 513, []]},
        ),
        "session.pin": (sess | {"pinned": True}, base_wrong | {"pinned": [None, 1, 0, "true", []]}),
        "session.delete": (dict(sess), dict(base_wrong)),
        "turn.submit": (
            sess | {"requestId": "r", "input": [{"type": "text", "text": "hi"}]},
            base_wrong
            | {
                "requestId": WRONG_REQ_ID,
                "input": [
                    None,
                    "text",
                    {},
                    [1],
                    [],
                    [{"type": "image"}],
                    [{"type": "text", "text": 1}],
                    [{"type": "text", "text": "   "}],
                    [{"type": "text", "text": "x"}] * 65,
                ],
            },
        ),
        "turn.interrupt": (
            sess | {"turnId": w.turn_id},
            base_wrong | {"turnId": [None, 1, "", "t" * 129, []]},
        ),
        "interaction.respond": (
            sess | {"turnId": w.turn_id, "requestId": "q", "response": {"text": "a"}},
            base_wrong
            | {
                "turnId": [None, 1, "", "t" * 129],
                "requestId": [None, 1, "", "q" * 257],
                "response": [None, 1, {}, {"decision": "maybe"}, {"text": 1}, []],
            },
        ),
        "goal.set": (sess | {"goal": "g"}, base_wrong | {"goal": [None, 1, "", "g" * 16_385]}),
        "goal.clear": (dict(sess), dict(base_wrong)),
        "fork.create": (
            fork_params(w.sid, w.turn_id, ws=WS_A),
            base_wrong
            | {
                "requestId": WRONG_REQ_ID,
                "targetAgentSessionId": WRONG_UUID,
                "point": [
                    None,
                    1,
                    {},
                    {"type": "beforeTurn", "turnId": w.turn_id},
                    {"type": "throughTurn"},
                    {"type": "throughTurn", "turnId": 1},
                    {"type": "throughTurn", "turnId": "t" * 129},
                ],
            },
        ),
        "fork.get": (
            {"workspaceId": WS_A, "operationId": w.op_id},
            {"workspaceId": WRONG_WS, "operationId": [None, 1, "", "o" * 129, []]},
        ),
        "fork.acknowledge": (
            {"workspaceId": WS_A, "operationId": w.op_id},
            {"workspaceId": WRONG_WS, "operationId": [None, 1, "", "o" * 129, []]},
        ),
    }


def wrong_type_cases(w: World) -> list[tuple[str, dict[str, Any], str]]:
    """Every (method, params with exactly one bad field, that field)."""
    out = []
    for method, (valid, wrong) in schemas(w).items():
        for name, values in wrong.items():
            for value in values:
                params = dict(valid)
                if value is None:
                    params.pop(name, None)
                else:
                    params[name] = value
                out.append((method, params, name))
    return out


def deep(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


class Fuzzer:
    def __init__(self, rng: random.Random, w: World) -> None:
        self.rng = rng
        self.w = w
        self.wrong = wrong_type_cases(w)

    def case(self) -> Case:
        kinds = (
            ["valid"] * 6
            + ["wrong_type"] * 8
            + ["random_bytes", "truncated", "bad_envelope", "unknown_method"] * 2
            + ["huge_int", "deep", "bad_utf8", "other_workspace", "non_str_key"]
        )
        # Oversize and over-long envelopes cost more per frame: rarer, still hundreds per run.
        kind = (
            self.rng.choice(kinds)
            if self.rng.random() > 0.01
            else self.rng.choice(["oversize", "routing_drop"])
        )
        return getattr(self, kind)()

    def _one(self, kind: str, obj: Any, expect: tuple[Any, ...] | None, **kw: Any) -> Case:
        rid = obj.get("id") if isinstance(obj, dict) else None
        return Case(kind, (pack(obj),), rid if isinstance(rid, str) else None, expect, **kw)

    def valid(self) -> Case:
        rid = self.w.rid("valid")
        method, params = self.rng.choice(
            [
                ("host.status", {}),
                ("session.get", {"workspaceId": WS_A, "agentSessionId": self.w.sid}),
                ("session.list", {"workspaceId": WS_A, "limit": 5}),
                ("session.timeline", {"workspaceId": WS_A, "agentSessionId": self.w.sid}),
                ("fork.get", {"workspaceId": WS_A, "operationId": self.w.op_id}),
                (
                    "session.updateTitle",
                    {"workspaceId": WS_A, "agentSessionId": self.w.sid, "title": "source"},
                ),
                (
                    "session.create",
                    {
                        "workspaceId": "ws-fuzz-c",
                        "provider": "tutti-agent",
                        "settings": {"deep": deep(30)},
                    },
                ),
            ]
        )
        return self._one("valid", envelope(rid, method, params), OK)

    def wrong_type(self) -> Case:
        method, params, name = self.rng.choice(self.wrong)
        return self._one(
            "wrong_type", envelope(self.w.rid("wt"), method, params), INVALID, field=name
        )

    def random_bytes(self) -> Case:
        while True:
            data = self.rng.randbytes(self.rng.randint(0, 300))
            try:
                if isinstance(msgpack.unpackb(data, raw=False), dict):
                    continue  # a map by chance: not the case we mean to send
            except Exception:  # noqa: BLE001 - not msgpack at all: what we want
                pass
            return Case("random_bytes", (data,), None, MALFORMED, null_id_ok=True)

    def truncated(self) -> Case:
        rid = self.w.rid("trunc")
        data = pack(
            envelope(rid, "session.get", {"workspaceId": WS_A, "agentSessionId": self.w.sid})
        )
        cut = data[: self.rng.randint(1, len(data) - 1)]
        return Case("truncated", (cut,), rid, MALFORMED, null_id_ok=True)

    def bad_envelope(self) -> Case:
        rid = self.w.rid("env")
        obj: dict[str, Any] = envelope(rid, "host.status", {})
        what = self.rng.choice(["v", "v2", "id", "id_long", "method", "params", "not_map"])
        if what == "v":
            obj["v"] = self.rng.choice(["1", None, True, 1.0, []])
        elif what == "v2":
            obj["v"] = self.rng.choice([0, 2, 2**64 - 1, -1])
        elif what == "id":
            obj["id"] = self.rng.choice([1, None, [], "", b"id"])
        elif what == "id_long":
            obj["id"] = "i" * 129
        elif what == "method":
            obj["method"] = self.rng.choice([1, None, "", "m" * 129, []])
        elif what == "params":
            obj["params"] = self.rng.choice([[], "p", 1, True])
        else:
            return Case("bad_envelope", (pack([obj]),), None, MALFORMED, null_id_ok=True)
        rid_ok = isinstance(obj.get("id"), str) and 1 <= len(obj["id"]) <= 128
        return Case(
            "bad_envelope", (pack(obj),), obj["id"] if rid_ok else None, MALFORMED, null_id_ok=True
        )

    def unknown_method(self) -> Case:
        name = self.rng.choice(
            ["", "x", "session.drop", "debug.exec", "Session.Get", "host.status ", "fork.create\0"]
        ) or "".join(self.rng.choice("abc._/") for _ in range(self.rng.randint(1, 40)))
        return self._one(
            "unknown_method",
            envelope(self.w.rid("um"), name, {"workspaceId": WS_A}),
            UNKNOWN_METHOD,
        )

    def huge_int(self) -> Case:
        value = self.rng.choice([2**63, 2**64 - 1, -(2**63), 2**63 - 1])
        method, name, params = self.rng.choice(
            [
                ("session.list", "limit", {"workspaceId": WS_A}),
                ("session.timeline", "limit", {"workspaceId": WS_A, "agentSessionId": self.w.sid}),
                ("session.get", "agentSessionId", {"workspaceId": WS_A}),
                (
                    "session.updateTitle",
                    "title",
                    {"workspaceId": WS_A, "agentSessionId": self.w.sid},
                ),
                ("fork.get", "operationId", {"workspaceId": WS_A}),
                (
                    "session.timeline",
                    "afterSequence",
                    {"workspaceId": WS_A, "agentSessionId": self.w.sid},
                ),
            ]
        )
        if name == "afterSequence" and value == 2**63 - 1:
            value = 2**63  # 2**63 - 1 is a valid (empty) page; one past it must be refused
        return self._one(
            "huge_int",
            envelope(self.w.rid("hi"), method, params | {name: value}),
            INVALID,
            field=name,
        )

    def deep(self) -> Case:
        # Built by hand: msgpack's own packer refuses to nest this deep.
        rid = self.w.rid("deep")
        params = {"workspaceId": WS_A, "agentSessionId": self.w.sid, "settings": "__DEEP__"}
        nested = b"\x81\xa1x" + b"\x91" * self.rng.randint(70, 5000) + b"\xa4leaf"
        data = pack(envelope(rid, "session.updateSettings", params))
        data = data.replace(pack("__DEEP__"), nested, 1)
        return Case("deep", (data,), rid, MALFORMED)

    def bad_utf8(self) -> Case:
        rid = self.w.rid("utf")
        bad = self.rng.choice([b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"ok\x80"])
        marker = "M" * len(bad)
        data = pack(
            envelope(
                rid,
                "session.updateTitle",
                {"workspaceId": WS_A, "agentSessionId": self.w.sid, "title": marker},
            )
        )
        data = data.replace(marker.encode(), bad, 1)
        return Case("bad_utf8", (data,), rid, MALFORMED, null_id_ok=True)

    def non_str_key(self) -> Case:
        params = {
            "workspaceId": WS_A,
            "agentSessionId": self.w.sid,
            "settings": {self.rng.choice([1, 2.5, True]): "v"},
        }
        return self._one(
            "non_str_key",
            envelope(self.w.rid("nsk"), "session.updateSettings", params),
            MALFORMED,
            null_id_ok=True,
        )

    def other_workspace(self) -> Case:
        sess = {"workspaceId": WS_B, "agentSessionId": self.w.sid}
        method, params, expect = self.rng.choice(
            [
                ("session.get", sess, SESSION_404),
                ("session.timeline", sess, SESSION_404),
                ("session.updateSettings", sess | {"settings": {"stolen": True}}, SESSION_404),
                ("session.updateTitle", sess | {"title": "stolen"}, SESSION_404),
                ("session.pin", sess | {"pinned": True}, SESSION_404),
                ("session.delete", sess, SESSION_404),
                (
                    "turn.submit",
                    sess | {"requestId": "x", "input": [{"type": "text", "text": "x"}]},
                    SESSION_404,
                ),
                ("turn.interrupt", sess | {"turnId": self.w.turn_id}, SESSION_404),
                (
                    "interaction.respond",
                    sess | {"turnId": self.w.turn_id, "requestId": "q", "response": {"text": "a"}},
                    SESSION_404,
                ),
                ("goal.set", sess | {"goal": "g"}, SESSION_404),
                ("goal.clear", sess, SESSION_404),
                ("fork.create", fork_params(self.w.sid, self.w.turn_id, ws=WS_B), SESSION_404),
                ("fork.get", {"workspaceId": WS_B, "operationId": self.w.op_id}, OP_404),
                ("fork.acknowledge", {"workspaceId": WS_B, "operationId": self.w.op_id}, OP_404),
            ]
        )
        return self._one("other_workspace", envelope(self.w.rid("ow"), method, params), expect)

    def oversize(self) -> Case:
        rid = self.w.rid("big")
        size = MAX_FRAME + self.rng.randint(1, 4096)
        data = pack(
            envelope(
                rid,
                "session.updateTitle",
                {"workspaceId": WS_A, "agentSessionId": self.w.sid, "title": "t" * size},
            )
        )
        return Case("oversize", (data,), rid, TOO_LARGE, null_id_ok=True)

    def routing_drop(self) -> Case:
        rid = self.w.rid("drop")
        body = pack(envelope(rid, "host.status", {}))
        return Case("routing_drop", (b"x",) * 40 + (body,), rid, None)


def test_ten_thousand_hostile_frames_get_typed_errors_and_the_daemon_keeps_serving(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("AGENTHOST_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
    print(f"hostile input seed: {seed} (AGENTHOST_FUZZ_SEED={seed} replays it)")
    rng = random.Random(seed)
    d = DaemonProcess(tmp_path / "home").start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(d.api)
    try:
        c = d.client()
        sid = create_session(c, ws=WS_A, title="source")["agentSessionId"]
        turn = run_turn(c, sid, "one", ws=WS_A)
        op = c.call("fork.create", fork_params(sid, turn["turnId"], ws=WS_A))["operation"]
        world = World(sid, turn["turnId"], op["operationId"])
        fuzzer = Fuzzer(rng, world)
        kinds: Counter[str] = Counter()
        sent = 0
        while sent < FRAMES:
            batch = [fuzzer.case() for _ in range(min(BATCH, FRAMES - sent))]
            _exchange(sock, batch, seed)
            assert d.proc is not None and d.proc.poll() is None, d.tail_log()
            kinds.update(case.kind for case in batch)
            sent += len(batch)
        # Still up and serving; the other workspace's writes did nothing.
        status = c.call("host.status")
        assert status["protocol"] == 1
        source = c.call("session.get", {"workspaceId": WS_A, "agentSessionId": sid})["session"]
        assert source["title"] == "source" and source["pinned"] is False
        assert "stolen" not in source["settings"]
        assert c.call("session.list", {"workspaceId": WS_B})["sessions"] == []
        assert run_turn(c, sid, "still here", ws=WS_A)["outcome"] == "completed"
        assert_invariants(d.home)
    finally:
        sock.close()
        ctx.term()
        d.stop()
    assert sent >= FRAMES
    LEDGER.record(
        "hostile", f"{sent} frames, seed {seed}", trials=sent, invariant_checks=1, outcomes=kinds
    )


def _exchange(sock: zmq.Socket[bytes], batch: list[Case], seed: int) -> None:
    """Send a batch (all in flight at once) and check every reply against its case."""
    by_id = {case.rid: case for case in batch if case.rid is not None}
    assert len(by_id) == sum(1 for case in batch if case.rid is not None)
    for case in batch:
        sock.send_multipart(list(case.frames))
    expected = sum(1 for case in batch if case.expect is not None)
    got: dict[str, tuple[int, dict[str, Any]]] = {}
    nulls: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(got) + len(nulls) < expected:
        missing = expected - len(got) - len(nulls)
        assert time.monotonic() < deadline, f"seed {seed}: {missing} replies missing"
        if not sock.poll(1000):
            continue
        reply = msgpack.unpackb(sock.recv_multipart()[-1], raw=False)
        rid = reply.get("id")
        if rid is None:
            nulls.append(reply)
            continue
        assert rid in by_id and rid not in got, (seed, reply)
        got[rid] = (reply["status"], reply)
    for case in batch:
        if case.rid is None or case.rid not in got:
            continue
        _check(case, got[case.rid][1], seed)
    unanswered = [c for c in batch if c.expect is not None and (c.rid is None or c.rid not in got)]
    # Replies without an id belong to frames whose id could not be read.
    assert len(unanswered) == len(nulls), (seed, [c.kind for c in unanswered], nulls[:3])
    assert all(c.null_id_ok for c in unanswered), (seed, [c.kind for c in unanswered])
    for reply in nulls:
        err = reply.get("error") or {}
        assert (reply["status"], err.get("code"), err.get("reason")) in (MALFORMED, TOO_LARGE)
    # Dropped envelopes never answer (their ids would have shown up above).
    if sock.poll(0):
        _stray(sock, by_id, seed)


def _stray(sock: zmq.Socket[bytes], by_id: dict[str, Case], seed: int) -> None:
    reply = msgpack.unpackb(sock.recv_multipart()[-1], raw=False)
    raise AssertionError(
        f"seed {seed}: unexpected extra reply {reply} ({by_id.get(reply.get('id'))})"
    )


def _check(case: Case, reply: dict[str, Any], seed: int) -> None:
    assert case.expect is not None, (seed, case.kind, reply)
    status = reply["status"]
    if case.expect == OK:
        assert status == 200 and isinstance(reply.get("result"), dict), (seed, case, reply)
        return
    err = reply.get("error")
    assert isinstance(err, dict), (seed, case.kind, reply)
    assert (status, err["code"], err["reason"]) == case.expect, (seed, case, reply)
    assert isinstance(err["message"], str) and isinstance(err["retryable"], bool)
    if case.field is not None:
        assert err["params"].get("field") == case.field, (seed, case, reply)


def test_after_sequence_beyond_int64_is_an_invalid_argument(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        sid = create_session(c, ws=WS_A)["agentSessionId"]
        status, body = c.call_raw(
            "session.timeline", {"workspaceId": WS_A, "agentSessionId": sid, "afterSequence": 2**63}
        )
    finally:
        d.stop()
    assert (status, body.get("reason"), body.get("params")) == (
        400,
        "invalid_argument",
        {"field": "afterSequence"},
    )
