"""The full-Session fork on the client side: the Engine's `latestSettled` entry
reuses the fork mutation machinery (identities, replay after `unknown`, reconciliation, ACK,
`fork.resolve` results), and `agenthost fork SESSION --latest` goes through it, printed like
the through-Turn fork; a Session that cannot fork as a whole is refused in words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from actors.ports import DriverInfo
from agenthost.catalog import Catalog
from agenthost.config import Config
from agenthost.daemon import Daemon
from client.engine.lifecycle import Engine
from client.engine.values import LATEST_SETTLED, AckState, MutationStatus
from tests.client.conftest import source
from tests.client.fakeclock import FakeClock
from tests.client.test_client_cli import MUTATION_KEYS, OPERATION_KEYS, Cli, new_session, say
from tests.client.test_client_engine import settle
from tests.support.daemon import DaemonProcess, fork_params, run_turn
from transport.client import Client

pytestmark = pytest.mark.timeout(90)


def acked(engine: Engine, sid: str) -> None:
    assert engine.wait_for(
        lambda: getattr(engine.mutation(sid, LATEST_SETTLED), "ack", None) is AckState.OBSERVED,
        20,
    )


def test_engine_latest_settled_fork_commits_through_the_newest_turn_and_acks(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws, turns=2)
    record = engine.fork_latest(sid)
    assert record.point == LATEST_SETTLED and record.turn_id == LATEST_SETTLED
    assert engine.is_fork_pending(sid, LATEST_SETTLED)
    done = settle(engine, clock, sid, LATEST_SETTLED)
    assert done.status is MutationStatus.SUCCEEDED, done
    assert done.boundary_turn_id == done.boundary == turns[-1]
    acked(engine, sid)
    child = engine.session(str(done.child_session_id))
    assert child is not None and child["forkedFrom"]["sourceTurnId"] == turns[-1]
    # The through-Turn record of that same Turn is untouched: separate boundary keys.
    assert engine.mutation(sid, turns[-1]) is None
    # After an observed success, a new click is a new explicit branch with new identities.
    again = engine.fork_latest(sid)
    assert again.request_id != done.request_id and again.status is MutationStatus.IN_FLIGHT
    assert settle(engine, clock, sid, LATEST_SETTLED).status is MutationStatus.SUCCEEDED


def test_engine_latest_settled_unknown_replays_the_same_identity_and_original_boundary(
    make_engine: Callable[..., Engine], client: Client, clock: FakeClock, ws: str
) -> None:
    engine = make_engine()
    sid, turns = source(client, ws, turns=2)
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    engine.fork_latest(sid)
    unknown = settle(engine, clock, sid, LATEST_SETTLED)
    assert unknown.status is MutationStatus.UNKNOWN and unknown.operation_id, unknown
    assert unknown.boundary_turn_id == turns[-1]
    assert engine.unknown_operations(sid)[turns[-1]]["operationId"] == unknown.operation_id
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
    # A new Turn on the source; the retry resends the same identity, and the daemon answers
    # the original operation with its original boundary (never a second provider fork).
    newer = run_turn(client, sid, "after the unknown fork", ws)["turnId"]
    retry = engine.fork_latest(sid)
    assert retry.request_id == unknown.request_id
    assert retry.target_session_id == unknown.target_session_id
    assert retry.create_attempts == 2
    replayed = settle(engine, clock, sid, LATEST_SETTLED)
    assert replayed.status is MutationStatus.UNKNOWN
    assert replayed.operation_id == unknown.operation_id
    assert replayed.boundary_turn_id == turns[-1]
    # Resolve through the Engine: adopt → the mutation succeeds and is ACKed like a commit.
    inspected = engine.resolve(str(unknown.operation_id), "inspect")
    assert inspected["evidence"]["verdict"] == "adoptable", inspected
    adopted = engine.resolve(str(unknown.operation_id), "adopt")
    assert adopted["operation"]["status"] == "committed"
    record = engine.mutation(sid, LATEST_SETTLED)
    assert record is not None and record.status is MutationStatus.SUCCEEDED, record
    assert record.child_session_id == unknown.target_session_id
    acked(engine, sid)
    assert engine.unknown_operations(sid) == {}
    # Now the Session as it stands: a new identity whose boundary is the newer Turn.
    engine.fork_latest(sid)
    later = settle(engine, clock, sid, LATEST_SETTLED)
    assert later.status is MutationStatus.SUCCEEDED and later.boundary_turn_id == newer


def test_engine_resolve_tracks_another_clients_unknown_fork(
    make_engine: Callable[..., Engine], client: Client, ws: str
) -> None:
    """An operation this Engine never started: `resolve` still runs the commit path (child
    upserted, ACK sent), so the boundary is not left held by a missing ACK."""
    engine = make_engine()
    sid, turns = source(client, ws, turns=1)
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "error"}})
    op = client.call(
        "fork.create",
        fork_params(ws, sid, turns[0]),
    )["operation"]
    client.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "off"}})
    assert op["status"] == "unknown", op
    engine.resolve(op["operationId"], "adopt")
    record = engine.mutation(sid, turns[0])
    assert record is not None and record.status is MutationStatus.SUCCEEDED
    assert engine.wait_for(
        lambda: getattr(engine.mutation(sid, turns[0]), "ack", None) is AckState.OBSERVED, 20
    )
    assert engine.session(op["targetAgentSessionId"]) is not None
    got = client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})
    assert got["operation"]["status"] == "committed"


@pytest.fixture
def cli(daemon: DaemonProcess, ws: str) -> Cli:
    return Cli(daemon.home, ws)


def test_cli_fork_latest_prints_like_fork_and_json_names_the_point(cli: Cli) -> None:
    sid = new_session(cli, "Lisbon")
    turns = [say(cli, sid, t)["turnId"] for t in ("one", "two")]
    human = cli.run("fork", sid[:8], "--latest")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == f"forked {sid} from its latest settled turn, through turn {turns[1]}"
    assert lines[1].startswith("child ") and lines[2].endswith(" committed")
    say(cli, sid, "three")
    out = cli.json("fork", sid, "--latest")
    assert set(out) == {"mutation", "operation"}
    assert set(out["mutation"]) == MUTATION_KEYS and set(out["operation"]) == OPERATION_KEYS
    mutation, op = out["mutation"], out["operation"]
    assert mutation["status"] == "succeeded" and mutation["ack"] == "observed"
    assert mutation["point"] == "latestSettled"
    newest = cli.json("show", sid)["turns"][-1]["turnId"]
    assert mutation["boundaryTurnId"] == newest
    assert op["point"] == {"type": "latestSettled", "turnId": newest}
    child = cli.json("show", mutation["childAgentSessionId"])
    assert len(child["turns"]) == 3


def test_cli_fork_latest_without_a_settled_turn_says_so(cli: Cli) -> None:
    sid = new_session(cli, "Empty")
    done = cli.run("fork", sid, "--latest")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "agenthost: cannot fork the whole session: it has no settled turn yet (turn_not_found)"
    )
    # --through and --latest exclude each other; one of them is needed.
    assert cli.run("fork", sid, "--latest", "--through", "1").returncode == 2
    assert cli.run("fork", sid).returncode == 2


def test_cli_fork_latest_refused_in_words_when_the_provider_cannot(tmp_path: Path) -> None:
    """A provider whose binder is missing cannot fork (seed 000 §7: refused before any
    operation), and `fork --latest` says so in words (in-process daemon with that catalog)."""
    home = tmp_path / "home"
    no_binder = Catalog(
        {"tutti-agent": DriverInfo("tutti-agent", "host_copy", False, "tutti-agent-home")}
    )
    daemon = Daemon(Config(home=home), catalog=no_binder)
    daemon.start()
    try:
        cli = Cli(home, "default")
        sid = new_session(cli, "No binder")
        say(cli, sid, "one")
        done = cli.run("fork", sid, "--latest")
        assert done.returncode == 1
        assert done.stderr.strip() == (
            "agenthost: cannot fork the whole session: it does not support a full-session "
            "fork (its provider does not declare forkFullSession for it, or no turn has been "
            "verified yet) (agent_session_fork_unsupported)"
        )
        err = cli.json("fork", sid, "--latest", code=1)["error"]
        assert err["reason"] == "agent_session_fork_unsupported"
        assert err["message"].startswith("cannot fork the whole session: ")
    finally:
        daemon.close()
