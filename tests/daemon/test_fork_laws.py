"""The laws of what goes beyond seed 000, through a real daemon and tutti-agent (the codex and
claude-code files run the same scenarios on their providers):

- one boundary, one dispatch: the barrier is the resolved boundary (source + Turn), whatever
  point kind (`throughTurn`, `latestSettled`) asked for it;
- `session.delete` of a source with an `unknown` fork is refused with a typed 409 naming it,
  and a deleted source's quarantined children are kept;
- a resolve acts on its own operation's child only, and waits for no running fork;
- `lifecycleCapabilities.fork` is the full-Session field; child titles follow seed 000 §5.

Each scenario takes the daemon, a source and a counter of the source's provider children.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.daemon.test_fork_full_session import fork_latest
from tests.daemon.test_fork_resolve import resolve, unknown_fork
from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, run_turn, timeline, wait_for
from tests.support.homes import child_rollouts, runtime_home
from tests.support.invariants import assert_invariants
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(240)

Children = Callable[[], int]


def session_of(c: Client, sid: str) -> dict[str, Any]:
    return dict(c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"])


def delete(c: Client, sid: str) -> None:
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})


def barrier_holds_across_point_kinds(
    d: DaemonProcess, c: Client, sid: str, turns: list[dict[str, Any]], children: Children
) -> None:
    """An `unknown` throughTurn(N) answers a new latestSettled identity resolving to N (no
    second provider fork); a committed, un-ACKed latestSettled answers a new throughTurn(N)."""
    last = turns[-1]["turnId"]
    op = unknown_fork(c, sid, last, "worker.fork.after_provider_call")
    assert children() == 1
    again = fork_latest(c, sid)
    assert again["operationId"] == op["operationId"] and again["status"] == "unknown"
    assert children() == 1  # the provider's fork was not called a second time
    resolve(c, op["operationId"], "abandon")
    latest = fork_latest(c, sid)
    assert latest["status"] == "committed", latest
    assert latest["point"] == {"type": "latestSettled", "turnId": last}
    n = children()
    _, through = fork(c, sid, last)
    assert through["operationId"] == latest["operationId"]
    assert children() == n
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": latest["operationId"]})
    # ACKed: the boundary is free for a new, explicit branch of either kind.
    _, fresh = fork(c, sid, last)
    fresh = until_terminal(c, fresh)
    assert fresh["operationId"] != latest["operationId"] and fresh["status"] == "committed"
    assert_invariants(d.home)


def delete_keeps_unresolved_evidence(
    d: DaemonProcess, c: Client, sid: str, turns: list[dict[str, Any]], children: Children
) -> None:
    """A source with an `unknown` fork is not deletable (409 naming it, the way out in words);
    after abandon it is, and the quarantined child survives the delete."""
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    assert children() == 1
    with pytest.raises(ApiError) as err:
        delete(c, sid)
    assert err.value.status == 409
    assert err.value.reason == "agent_session_fork_unresolved"
    assert err.value.params["operationIds"] == [op["operationId"]]
    assert "fork.resolve" in err.value.message
    assert session_of(c, sid)["agentSessionId"] == sid
    assert resolve(c, op["operationId"], "inspect")["evidence"]["verdict"] == "adoptable"
    abandoned = resolve(c, op["operationId"], "abandon")
    (moved,) = abandoned["evidence"]["quarantinedNow"]
    kept = moved.split(f"/{sid}/", 1)[1]
    delete(c, sid)
    evidence = d.home / "runtimes" / ".evidence" / WS / sid / kept
    assert wait_for(evidence.is_file, 20), evidence
    assert_invariants(d.home)


def abandon_takes_only_its_own_child(
    d: DaemonProcess, c: Client, sid: str, turns: list[dict[str, Any]], children: Children
) -> None:
    """Two `unknown` forks of one source on two Turns: each inspects `adoptable` with its own
    child; abandoning one leaves the other's child, which is then adopted."""
    a = unknown_fork(c, sid, turns[0]["turnId"], "worker.fork.after_provider_call")
    b = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    assert children() == 2
    seen_a = resolve(c, a["operationId"], "inspect")["evidence"]
    seen_b = resolve(c, b["operationId"], "inspect")["evidence"]
    assert seen_a["verdict"] == "adoptable" and seen_b["verdict"] == "adoptable"
    child_a = seen_a["children"][0]["providerSessionId"]
    child_b = seen_b["children"][0]["providerSessionId"]
    assert child_a != child_b
    abandoned = resolve(c, a["operationId"], "abandon")
    assert len(abandoned["evidence"]["quarantinedNow"]) >= 1
    assert all(child_b not in p for p in abandoned["evidence"]["quarantinedNow"])
    assert children() == 1
    adopted = resolve(c, b["operationId"], "adopt")["operation"]
    assert adopted["status"] == "committed"
    assert adopted["session"]["providerSessionId"] == child_b
    assert run_turn(c, adopted["targetAgentSessionId"], "b speaks")["outcome"] == "completed"
    assert_invariants(d.home)


def resolve_waits_for_a_running_fork(
    d: DaemonProcess, c: Client, sid: str, turns: list[dict[str, Any]], children: Children
) -> None:
    """While a fork of the source is in its provider call, a resolve of another operation of
    the source is refused (retryable 409) and nothing is moved; after it, the resolve runs."""
    op = unknown_fork(c, sid, turns[0]["turnId"], "worker.fork.after_provider_call")
    # Held in the worker until released (`off`): the fork is live for as long as we look.
    c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "hang"}})
    status, running = fork(c, sid, turns[1]["turnId"])
    assert status < 400 and running["status"] == "accepted", running
    for action in ("abandon", "inspect"):
        with pytest.raises(ApiError) as err:
            resolve(c, op["operationId"], action)
        assert err.value.status == 409 and err.value.reason == "agent_session_fork_in_progress"
        assert err.value.retryable
    c.call("debug.failpoints", {"points": {"worker.fork.before_provider_call": "off"}})
    done = until_terminal(c, running)
    assert done["status"] == "committed", done
    assert resolve(c, op["operationId"], "abandon")["operation"]["status"] == "abandoned"
    assert_invariants(d.home)


def capability_and_titles(
    d: DaemonProcess, c: Client, sid: str, turns: list[dict[str, Any]], children: Children
) -> None:
    """`lifecycleCapabilities.fork` is true where the driver declares full-Session fork (and
    `forkFullSession` says the same); `<source title> (<n>)` over the valid forks of that
    source: an abandoned attempt uses no number, a fork of a fork stacks the suffix."""
    caps = session_of(c, sid)["lifecycleCapabilities"]
    assert caps["fork"] is True and caps["forkFullSession"] is True
    title = session_of(c, sid)["title"]
    lost = unknown_fork(c, sid, turns[0]["turnId"], "worker.fork.before_provider_call")
    resolve(c, lost["operationId"], "abandon")
    _, first = fork(c, sid, turns[0]["turnId"])
    first = until_terminal(c, first)
    assert first["session"]["title"] == f"{title} (2)"
    _, second = fork(c, sid, turns[1]["turnId"])
    assert until_terminal(c, second)["session"]["title"] == f"{title} (3)"
    child = first["targetAgentSessionId"]
    grand = until_terminal(c, fork(c, child, timeline(c, child)[0]["turnId"])[1])
    assert grand["session"]["title"] == f"{title} (2) (2)"


SCENARIOS = [
    barrier_holds_across_point_kinds,
    delete_keeps_unresolved_evidence,
    abandon_takes_only_its_own_child,
    resolve_waits_for_a_running_fork,
    capability_and_titles,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_tutti_agent_fork_laws(
    daemon: DaemonProcess, scenario: Callable[..., None], request: pytest.FixtureRequest
) -> None:
    c = daemon.client()
    sid, turns = three_turn_source(c)
    source_home = runtime_home(daemon.home, WS, sid)
    scenario(daemon, c, sid, turns, lambda: len(child_rollouts(source_home)))
