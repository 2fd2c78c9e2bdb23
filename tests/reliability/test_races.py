"""Race suite against a real daemon and tutti-agent: 32 clients on one boundary
get one operation and cause one provider dispatch; replays of one request id make one
operation; a reused id with another body conflicts; and fenced mutations racing a fork are
either in its snapshot or refused with `agent_session_fork_in_progress`, never half-applied."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.reliability.reliability_harness import LEDGER, children_of, fork_params, trials
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline, wait_for
from tests.support.invariants import assert_invariants
from transport.client import Client

pytestmark = pytest.mark.timeout(trials(300, 1800))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("races") / "home").start()
    try:
        yield d
    finally:
        d.stop()


def source(d: DaemonProcess, turns: int = 2, title: str = "src") -> tuple[str, str, list[dict]]:
    c = d.client()
    sid = create_session(c, title=title)["agentSessionId"]
    done = [run_turn(c, sid, f"turn {i}") for i in range(turns)]
    pid = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"][
        "providerSessionId"
    ]
    return sid, pid, done


def terminal(c: Client, op: dict[str, Any]) -> dict[str, Any]:
    def poll() -> dict[str, Any] | None:
        got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
        return got["operation"] if got["operation"]["status"] != "accepted" else None

    return dict(op if op["status"] != "accepted" else wait_for(poll, 60))


def burst(clients: list[Client], params: list[dict[str, Any]]) -> list[tuple[int, dict]]:
    """Send one fork.create per client as close together as threads allow."""
    gate = threading.Barrier(len(clients))
    replies: list[tuple[int, dict]] = [(0, {})] * len(clients)

    def one(i: int) -> None:
        gate.wait()
        replies[i] = clients[i].call_raw("fork.create", params[i], timeout=60)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return replies


def test_32_clients_forking_one_boundary_get_one_operation_and_one_dispatch(
    daemon: DaemonProcess,
) -> None:
    rounds = trials(1, 10)
    for _ in range(rounds):
        sid, pid, turns = source(daemon)
        clients = [daemon.client(timeout=60) for _ in range(32)]
        replies = burst(clients, [fork_params(sid, turns[1]["turnId"]) for _ in clients])
        assert all(status in (200, 202) for status, _ in replies), replies
        op_ids = {body["operation"]["operationId"] for _, body in replies}
        assert len(op_ids) == 1, op_ids
        op = terminal(clients[0], replies[0][1]["operation"])
        assert op["status"] == "committed", op
        # One provider dispatch: exactly one child rollout forked from the source.
        assert len(children_of(daemon.home, pid)) == 1
        for c in clients:
            c.close()
    assert_invariants(daemon.home)
    LEDGER.record(
        "races",
        "32 clients, one boundary",
        trials=rounds,
        invariant_checks=1,
        outcomes=Counter(committed=rounds),
    )


def test_8_replays_of_one_request_id_make_one_operation(daemon: DaemonProcess) -> None:
    sid, pid, turns = source(daemon)
    params = fork_params(sid, turns[0]["turnId"])
    clients = [daemon.client(timeout=60) for _ in range(8)]
    replies = burst(clients, [params] * 8)
    assert all(status in (200, 202) for status, _ in replies), replies
    ops = {body["operation"]["operationId"] for _, body in replies}
    assert len(ops) == 1
    assert {body["operation"]["requestId"] for _, body in replies} == {params["requestId"]}
    op = terminal(clients[0], replies[0][1]["operation"])
    assert (
        op["status"] == "committed" and op["targetAgentSessionId"] == params["targetAgentSessionId"]
    )
    assert len(children_of(daemon.home, pid)) == 1
    # A later replay is still the same operation, and still no second dispatch.
    again = clients[0].call("fork.create", params)["operation"]
    assert again["operationId"] == op["operationId"]
    assert len(children_of(daemon.home, pid)) == 1
    for c in clients:
        c.close()
    assert_invariants(daemon.home)
    LEDGER.record(
        "races", "8 replays, one request id", outcomes=Counter(committed=1), invariant_checks=1
    )


@pytest.mark.parametrize("change", ["target", "turn"])
def test_request_id_reused_with_another_body_is_a_request_conflict(
    daemon: DaemonProcess, change: str
) -> None:
    sid, pid, turns = source(daemon)
    c = daemon.client()
    params = fork_params(sid, turns[0]["turnId"])
    op = terminal(c, c.call("fork.create", params)["operation"])
    other = dict(params)
    if change == "target":
        other["targetAgentSessionId"] = str(uuid.uuid4())
    else:
        other["point"] = {"type": "throughTurn", "turnId": turns[1]["turnId"]}
    status, body = c.call_raw("fork.create", other)
    assert status == 409, body
    assert (body["code"], body["reason"]) == ("conflict", "agent_session_fork_request_conflict")
    # Neither a new operation nor a new provider child came of it.
    assert len(children_of(daemon.home, pid)) == 1
    same = c.call("fork.create", params)["operation"]
    assert same["operationId"] == op["operationId"]
    LEDGER.record(
        "races", f"request id reused, other {change}", outcomes=Counter(request_conflict=1)
    )


def _mutator(
    c: Client, sid: str, stop: threading.Event, log: list[tuple[str, int, int, str]]
) -> None:
    """Sequential fenced settings writes and unfenced title writes, each numbered; the log
    records (kind, n, status, reason) in reply order."""
    n = 0
    while not stop.is_set() and n < 2000:
        n += 1
        for kind, method, params in (
            ("settings", "session.updateSettings", {"settings": {"n": n}}),
            ("title", "session.updateTitle", {"title": f"title {n}"}),
        ):
            status, body = c.call_raw(
                method, {"workspaceId": WS, "agentSessionId": sid, **params}, timeout=60
            )
            log.append((kind, n, status, "" if status < 400 else body.get("reason", "")))
            if status >= 400:
                assert body.get("retryable") is True, body


def test_mutations_racing_a_fork_are_in_its_snapshot_or_refused_never_lost(
    daemon: DaemonProcess,
) -> None:
    rounds = trials(3, 30)
    refused_total = 0
    c = daemon.client(timeout=60)
    # Widen the window in which the fence is up (never asserted as a time).
    c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "sleep:300"}})
    try:
        for r in range(rounds):
            sid, _, turns = source(daemon, turns=1, title="title 0")
            stop = threading.Event()
            log: list[tuple[str, int, int, str]] = []
            mc = daemon.client(timeout=60)
            thread = threading.Thread(target=_mutator, args=(mc, sid, stop, log))
            thread.start()
            wait_for(lambda log=log: len(log) >= 4)
            op = terminal(
                c, c.call("fork.create", fork_params(sid, turns[0]["turnId"]))["operation"]
            )
            wait_for(lambda log=log, op=op: _writes_after_release(log) >= 2)
            stop.set()
            thread.join(60)
            mc.close()
            assert op["status"] == "committed", op
            refused_total += _check_race(c, sid, op, log, r)
    finally:
        c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "off"}})
    # The window was real: some writes met the fence.
    assert refused_total > 0
    assert_invariants(daemon.home)
    LEDGER.record(
        "races",
        "mutations racing a fork",
        trials=rounds,
        invariant_checks=1,
        outcomes=Counter(committed=rounds, refused_writes=refused_total),
    )


def _writes_after_release(log: list[tuple[str, int, int, str]]) -> int:
    """Successful settings writes after the last refusal (0 while no refusal happened)."""
    settings = [e for e in log if e[0] == "settings"]
    last_refused = max((i for i, e in enumerate(settings) if e[2] >= 400), default=None)
    if last_refused is None:
        return 0 if len(settings) < 200 else 2  # no fence met yet (bounded)
    return sum(1 for e in settings[last_refused + 1 :] if e[2] < 400)


def _check_race(
    c: Client, sid: str, op: dict[str, Any], log: list[tuple[str, int, int, str]], r: int
) -> int:
    settings = [(n, status, reason) for kind, n, status, reason in log if kind == "settings"]
    titles = [(n, status) for kind, n, status, _ in log if kind == "title"]
    refused = [n for n, status, reason in settings if status >= 400]
    assert all(
        reason == "agent_session_fork_in_progress"
        for _, status, reason in settings
        if status >= 400
    ), settings
    ok = [n for n, status, _ in settings if status < 400]
    # Titles are not fenced: every write succeeds.
    assert all(status == 200 for _, status in titles), titles
    child = op["session"]
    n_child = child["settings"].get("n", 0)
    # In the snapshot: the child holds a value that really was written (0 = before any).
    assert n_child == 0 or n_child in ok, (n_child, settings)
    # Refusals happen only while the fence is up, i.e. after the write the snapshot froze; and
    # no write between that one and the first refusal succeeded (it would be lost or leaked).
    if refused:
        assert min(refused) > n_child, (n_child, refused)
        assert not [n for n in ok if n_child < n < min(refused)], (n_child, settings)
        # After the fence was released writes succeed again, and none of them is in the child.
        assert [n for n in ok if n > max(refused)], settings
    # Nothing lost: the source holds the last successful write of each field.
    src = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    assert src["settings"] == {"n": max(ok)}
    assert src["title"] == f"title {max(n for n, _ in titles)}"
    # The child's title was derived at prepare from a title that was really written.
    base = child["title"].removesuffix(" (2)")
    assert base == "title 0" or base in {f"title {n}" for n, _ in titles}, child["title"]
    # The child's history is exactly the boundary; the source kept its own.
    assert len(timeline(c, child["agentSessionId"])) == 1
    assert len(timeline(c, sid)) == 1
    return len(refused)
