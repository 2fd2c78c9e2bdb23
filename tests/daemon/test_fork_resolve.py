"""`fork.resolve` through a real daemon and tutti-agent: an `unknown` fork with a
child is inspected `adoptable`, adopted and its child runs a turn; one without a child is
inspected `absent`, abandoned, and the same Turn forks and commits; a child of an abandoned
operation is moved into quarantine, never deleted."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, run_turn, timeline
from tests.support.homes import child_rollouts, runtime_home
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(240)


def resolve(c: Client, op_id: str, action: str, request_id: str | None = None) -> dict[str, Any]:
    return dict(
        c.call(
            "fork.resolve",
            {
                "workspaceId": WS,
                "operationId": op_id,
                "requestId": request_id or str(uuid.uuid4()),
                "action": action,
            },
        )
    )


def unknown_fork(c: Client, sid: str, turn_id: str, point: str) -> dict[str, Any]:
    """A fork left `unknown` by SIGKILLing the provider's worker at `point`."""
    c.call("debug.failpoints", {"points": {point: "once:kill"}})
    _, op = fork(c, sid, turn_id)
    op = until_terminal(c, op)
    assert op["status"] == "unknown", op
    return op


def adopt_and_use(
    c: Client,
    op: dict[str, Any],
    source_id: str,
    child_count: Callable[[], int],
    boundary_turns: int = 2,
) -> dict[str, Any]:
    """Inspect → adoptable, adopt → committed (replay-safe), the child runs a turn, ACK."""
    inspected = resolve(c, op["operationId"], "inspect")
    evidence = inspected["evidence"]
    assert evidence["verdict"] == "adoptable", evidence
    (child,) = evidence["children"]
    assert child["forkedFromId"] == source_id
    assert child["turnsEqualPrefix"] is True
    assert inspected["operation"]["status"] == "unknown"
    # Adopt needs `adoptable`; a new request id that replays the same adopt gets its result.
    rid = str(uuid.uuid4())
    adopted = resolve(c, op["operationId"], "adopt", rid)
    done = adopted["operation"]
    assert done["status"] == "committed", done
    assert done["session"]["providerSessionId"] == child["providerSessionId"]
    assert resolve(c, op["operationId"], "adopt", rid)["operation"]["status"] == "committed"
    with pytest.raises(ApiError) as err:
        resolve(c, op["operationId"], "abandon")
    assert err.value.status == 409 and err.value.reason == "agent_session_fork_resolve_conflict"
    target = done["targetAgentSessionId"]
    assert len(timeline(c, target)) == boundary_turns
    assert run_turn(c, target, "the adopted child speaks")["outcome"] == "completed"
    assert child_count() == 1  # adopt never called the provider's fork again
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    return dict(done)


def abandon_and_refork(
    c: Client, op: dict[str, Any], sid: str, turn_id: str, expect_children: int
) -> dict[str, Any]:
    inspected = resolve(c, op["operationId"], "inspect")["evidence"]
    assert len(inspected["children"]) == expect_children
    assert inspected["verdict"] == ("absent" if expect_children == 0 else "adoptable")
    if expect_children == 0:
        with pytest.raises(ApiError) as err:
            resolve(c, op["operationId"], "adopt")
        assert err.value.status == 409 and err.value.params["verdict"] == "absent"
    abandoned = resolve(c, op["operationId"], "abandon")
    assert abandoned["operation"]["status"] == "abandoned"
    assert abandoned["operation"]["phase"] == "abandoned"
    got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})["operation"]
    assert got["status"] == "abandoned"
    # The barrier is released: the same Turn forks again, as a new request, and commits.
    _, again = fork(c, sid, turn_id, target=op["targetAgentSessionId"])
    again = until_terminal(c, again)
    assert again["operationId"] != op["operationId"]
    assert again["status"] == "committed", again
    assert run_turn(c, again["targetAgentSessionId"], "new branch")["outcome"] == "completed"
    return abandoned


def adopt_fork_of_a_fork(c: Client, home: Path, root: str, turns: list[dict[str, Any]]) -> None:
    """An `unknown` fork whose source is itself a committed fork child (its provider state
    reads through the root's): inspected `adoptable` (only the new child, not the source's own
    lineage), adopted, and the grandchild runs a turn."""
    from tests.daemon.test_lineage_tree import committed_fork
    from tests.reliability.reliability_harness import children_of

    middle = committed_fork(c, root, turns[1]["turnId"])["targetAgentSessionId"]
    middle_turn = run_turn(c, middle, "the middle speaks")
    assert middle_turn["outcome"] == "completed", middle_turn
    op = unknown_fork(c, middle, middle_turn["turnId"], "worker.fork.after_provider_call")
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": middle})["session"]
    psid = session["providerSessionId"]
    assert len(children_of(home, psid)) == 1
    done = adopt_and_use(c, op, psid, lambda: len(children_of(home, psid)), boundary_turns=3)
    assert len(timeline(c, done["targetAgentSessionId"])) == 4  # 2 + the middle's + its own


def test_unknown_fork_with_child_is_adopted_and_its_child_runs(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    source_home = runtime_home(daemon.home, WS, sid)
    assert len(child_rollouts(source_home)) == 1
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    adopt_and_use(c, op, session["providerSessionId"], lambda: len(child_rollouts(source_home)))
    # The child reads from its own home.
    assert child_rollouts(runtime_home(daemon.home, WS, op["targetAgentSessionId"]))


def test_unknown_fork_of_a_fork_is_adopted(daemon: DaemonProcess) -> None:
    c = daemon.client()
    root, turns = three_turn_source(c)
    adopt_fork_of_a_fork(c, daemon.home, root, turns)


def test_unknown_fork_without_child_is_abandoned_and_the_turn_forks_again(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.before_provider_call")
    abandoned = abandon_and_refork(c, op, sid, turns[1]["turnId"], 0)
    assert abandoned["evidence"]["verdict"] == "absent"
    # A replay-free second abandon of a settled resolution is a typed 409.
    with pytest.raises(ApiError) as err:
        resolve(c, op["operationId"], "adopt")
    assert err.value.status == 409


def quarantine_and_refork(
    c: Client,
    op: dict[str, Any],
    sid: str,
    turn_id: str,
    source_home: Path,
    children: Callable[[], list[Path]],
) -> None:
    """Abandon a fork whose provider child exists: the child file is moved into
    `<source home>/quarantine/<operationId>/`, whole, not deleted; the Turn forks again."""
    (child_file,) = children()
    before = child_file.read_bytes()
    abandoned = abandon_and_refork(c, op, sid, turn_id, 1)
    moved = [Path(p) for p in abandoned["evidence"]["quarantinedNow"]]
    assert len(moved) == 1 and moved[0].exists() and not child_file.exists()
    assert moved[0].is_relative_to(source_home / "quarantine" / op["operationId"])
    assert before and moved[0].read_bytes() == before  # the provider's data is kept whole
    # Only the new fork's child is a child now.
    assert len(children()) == 1


def test_abandoned_child_is_quarantined_not_deleted(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = unknown_fork(c, sid, turns[0]["turnId"], "worker.fork.after_provider_call")
    source_home = runtime_home(daemon.home, WS, sid)
    quarantine_and_refork(
        c, op, sid, turns[0]["turnId"], source_home, lambda: child_rollouts(source_home)
    )


def test_resolve_cli_and_typed_errors(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.before_provider_call")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "agenthost.cli",
                "--home",
                str(daemon.home),
                "--workspace",
                WS,
                "resolve",
                op["operationId"],
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    done = cli()
    assert done.returncode == 0, done.stderr
    assert "unknown (deliveryUnknown)" in done.stdout and "verdict: absent" in done.stdout
    done = cli("--adopt")
    assert done.returncode == 1 and "agent_session_fork_resolve_conflict" in done.stderr
    done = cli("--abandon")
    assert done.returncode == 0, done.stderr
    assert ": abandoned\n" in done.stdout and "(abandoned)" not in done.stdout
    with pytest.raises(ApiError) as err:
        resolve(c, str(uuid.uuid4()), "inspect")
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        resolve(c, op["operationId"], "explode")
    assert err.value.status == 400


def _race(d: DaemonProcess, calls: list[tuple[str, str, str]]) -> list[Any]:
    """Send every (op, action, request) at once on its own client; results or ApiErrors."""
    import threading

    out: list[Any] = [None] * len(calls)
    clients = [d.client() for _ in calls]
    go = threading.Barrier(len(calls))

    def run(i: int) -> None:
        op_id, action, rid = calls[i]
        go.wait()
        try:
            out[i] = resolve(clients[i], op_id, action, rid)
        except ApiError as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_concurrent_resolves_one_wins_others_get_its_result_or_409(
    daemon: DaemonProcess,
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    # Different requests race: exactly one abandons, the others get a typed 409.
    op = unknown_fork(c, sid, turns[0]["turnId"], "worker.fork.before_provider_call")
    results = _race(daemon, [(op["operationId"], "abandon", str(uuid.uuid4())) for _ in range(3)])
    won = [r for r in results if isinstance(r, dict)]
    lost = [r for r in results if isinstance(r, ApiError)]
    assert len(won) == 1 and won[0]["operation"]["status"] == "abandoned", results
    assert len(lost) == 2
    assert {e.status for e in lost} == {409}
    assert {e.reason for e in lost} <= {
        "agent_session_fork_resolve_in_progress",
        "agent_session_fork_resolve_conflict",
    }
    # The same request raced: every caller gets the one result.
    op2 = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    rid = str(uuid.uuid4())
    results = _race(daemon, [(op2["operationId"], "adopt", rid) for _ in range(3)])
    assert all(isinstance(r, dict) for r in results), results
    assert {r["operation"]["status"] for r in results} == {"committed"}
    assert len({r["operation"]["targetAgentSessionId"] for r in results}) == 1
    assert len(child_rollouts(runtime_home(daemon.home, WS, sid))) == 1


def test_a_child_whose_boundary_turn_lost_its_end_is_not_adoptable(daemon: DaemonProcess) -> None:
    """An `unknown` fork's child in the source home cut at a line before its boundary Turn's
    `task_complete` (a write a crash cut short) reads with the frozen prefix's Turn ids, the
    last one in progress: not the child a fork would bind (its proof refuses a Turn in
    progress), so not `adoptable` — the adopt is refused, never committed; the abandon
    quarantines it and the Turn forks again."""
    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    source_home = runtime_home(daemon.home, WS, sid)
    (child_file,) = child_rollouts(source_home)
    lines = child_file.read_bytes().split(b"\n")
    ends = [i for i, raw in enumerate(lines) if b'"task_complete"' in raw]
    child_file.write_bytes(b"\n".join(lines[: ends[-1]]) + b"\n")
    evidence = resolve(c, op["operationId"], "inspect")["evidence"]
    (child,) = evidence["children"]
    assert len(child["providerTurnIds"]) == 2  # the prefix's Turn ids, read
    assert child["turnsEqualPrefix"] is False
    assert evidence["verdict"] == "ambiguous"
    with pytest.raises(ApiError) as err:
        resolve(c, op["operationId"], "adopt")
    assert err.value.status == 409
    got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})["operation"]
    assert got["status"] == "unknown"
    abandoned = resolve(c, op["operationId"], "abandon")
    assert abandoned["operation"]["status"] == "abandoned"
    assert [Path(p).name for p in abandoned["evidence"]["quarantinedNow"]] == [child_file.name]
    _, again = fork(c, sid, turns[1]["turnId"], target=op["targetAgentSessionId"])
    assert until_terminal(c, again)["status"] == "committed"
