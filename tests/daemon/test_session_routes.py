"""A request or a driver event for a live Session actor goes straight into its inbox
(`actors.host_actor.SessionRoutes`), not through the HostActor's thread; only a Session without
a live actor goes through the HostActor, which starts one. Pipelined requests keep their order
across that hand-over, and requests racing the idle reap of their actor are all answered.

An in-process daemon (real store file, real worker and tutti-agent app-server)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.daemon import Daemon
from tests.support.daemon import WS, create_session, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


@pytest.fixture
def reaping(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    """A daemon that reaps a Session actor idle for 100 ms (checked every 50 ms)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "agenthost.toml").write_text("[daemon]\nidle_actor_seconds = 0.1\n")
    with in_process_daemon(home, timeout=30.0) as running:
        yield running


def _title(c: Client, sid: str, title: str) -> dict[str, object]:
    return dict(
        c.call("session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": title})[
            "session"
        ]
    )


def _pin(c: Client, sid: str, pinned: bool) -> dict[str, object]:
    return dict(
        c.call("session.pin", {"workspaceId": WS, "agentSessionId": sid, "pinned": pinned})[
            "session"
        ]
    )


def test_a_live_sessions_requests_and_driver_events_skip_the_host_actor(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    sid = create_session(c, title="direct")["agentSessionId"]
    run_turn(c, sid, "start the actor")
    before = daemon.routes.direct
    _pin(c, sid, True)
    _pin(c, sid, False)
    assert daemon.routes.direct - before == 2
    before = daemon.routes.direct
    turn = run_turn(c, sid, "a turn")
    assert turn["outcome"] == "completed", turn
    # The submit, and the Turn's driver events (at least its start and its completion).
    assert daemon.routes.direct - before >= 3


def test_pipelined_requests_keep_their_order_across_the_actors_start(
    running: tuple[Daemon, Client],
) -> None:
    """The first requests of a Session with no live actor go through the HostActor; the ones
    sent behind them must not overtake them once the actor is live."""
    _daemon, c = running
    for _ in range(3):
        sid = create_session(c, title="order")["agentSessionId"]
        pending = [
            c.submit(
                "session.updateTitle",
                {"workspaceId": WS, "agentSessionId": sid, "title": f"t{i}"},
            )
            for i in range(60)
        ]
        for fut in pending:
            status, body = fut.result(timeout=30)
            assert status == 200, body
        got = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert got["title"] == "t59", got


def test_requests_racing_the_idle_reap_of_their_actor_are_all_answered(
    reaping: tuple[Daemon, Client],
) -> None:
    """Requests arriving just as their actor is reaped: each is delivered before the stop or
    to the actor started after it — none is left unanswered behind a stop."""
    daemon, c = reaping
    sids = [create_session(c, title=f"reap {i}")["agentSessionId"] for i in range(3)]
    errors: list[str] = []
    rng = random.Random(20)

    def hammer(sid: str, seed: int) -> None:
        local = random.Random(seed)
        client = Client(daemon.api_endpoint, timeout=20.0)
        try:
            for i in range(60):
                # A pin goes through the actor (a rename, `SessionLanes`, may skip it).
                status, body = client.call_raw(
                    "session.pin",
                    {"workspaceId": WS, "agentSessionId": sid, "pinned": i % 2 == 0},
                )
                if status != 200 or body["session"]["pinned"] != (i % 2 == 0):
                    errors.append(f"{status} {body}")
                threading.Event().wait(local.uniform(0.0, 0.2))
        except Exception as exc:  # noqa: BLE001 - a timeout is the failure this test looks for
            errors.append(repr(exc))
        finally:
            client.close()

    threads = [
        threading.Thread(target=hammer, args=(sid, rng.random())) for sid in sids for _ in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not errors, errors[:5]
    assert daemon.routes.direct > 0  # some went straight to a live actor
    # And the reap is live in this configuration: idle actors go.
    wait_for(lambda: daemon._status()["sessionActors"] == 0, 10)
