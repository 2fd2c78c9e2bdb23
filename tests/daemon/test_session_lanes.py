"""A rename goes straight to the store, not through its Session's actor
(`agenthost.api_base.SessionLanes`): it is answered while the actor is busy, and the Session's
requests still take effect in the order they arrived, across the lane and the actor.

An in-process daemon (real store file, real worker and tutti-agent app-server); the unit
tests drive `SessionLanes` with a real thread pool."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from actors.messages import FollowUp
from agenthost.api_base import SessionLanes
from agenthost.daemon import Daemon
from tests.support.daemon import WS, create_session, run_turn
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

KEY = (WS, "s")


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _title(sid: str, title: str) -> dict[str, object]:
    return {"workspaceId": WS, "agentSessionId": sid, "title": title}


def _warm_session(c: Client, title: str) -> str:
    """A Session whose actor is live (one Turn run)."""
    sid = str(create_session(c, title=title)["agentSessionId"])
    run_turn(c, sid, "start the actor")
    return sid


@contextlib.contextmanager
def _actor_held(daemon: Daemon, sid: str) -> Iterator[None]:
    """The Session's actor busy on a held message until the block ends."""
    release = threading.Event()
    busy = threading.Event()

    def hold() -> None:
        busy.set()
        release.wait(30)

    try:
        assert daemon.routes.tell(WS, sid, FollowUp(hold))
        assert busy.wait(10)
        yield
    finally:
        release.set()


def _wait_with_actor(daemon: Daemon, sid: str, count: int) -> None:
    """Wait until the daemon counts `count` of the Session's requests as with its actor."""
    lanes = daemon.api.plumbing.lanes
    deadline = time.monotonic() + 10
    while lanes.with_actor((WS, sid)) < count:
        assert time.monotonic() < deadline, lanes.with_actor((WS, sid))
        time.sleep(0.005)
    assert lanes.with_actor((WS, sid)) == count


def test_a_rename_is_answered_while_its_sessions_actor_is_busy(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    sid = _warm_session(c, "busy")
    with _actor_held(daemon, sid):
        before = (daemon.routes.direct, daemon.api.plumbing.lanes.direct_writes)
        status, body = c.submit("session.updateTitle", _title(sid, "renamed")).result(timeout=10)
        assert status == 200, body
        assert body["session"]["title"] == "renamed"
        got = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert got["title"] == "renamed"
        assert (daemon.routes.direct, daemon.api.plumbing.lanes.direct_writes) == (
            before[0],
            before[1] + 1,
        )


def test_a_rename_behind_a_request_still_with_the_actor_keeps_its_place(
    running: tuple[Daemon, Client],
) -> None:
    """Pipelined: a pin held in the busy actor, then a rename, then a delete. The rename
    waits for the pin (it goes through the actor), the delete for the rename."""
    daemon, c = running
    sid = _warm_session(c, "order")
    with _actor_held(daemon, sid):
        lane_writes = daemon.api.plumbing.lanes.direct_writes
        pin = c.submit("session.pin", {"workspaceId": WS, "agentSessionId": sid, "pinned": True})
        rename = c.submit("session.updateTitle", _title(sid, "last words"))
        delete = c.submit("session.delete", {"workspaceId": WS, "agentSessionId": sid})
        # All three received before the actor is let go: a submit only queues the frame, and
        # a rename that reached the daemon after the pin was answered would rightly take the
        # lane (the flake of a clean-clone run: `direct_writes` one more than expected).
        _wait_with_actor(daemon, sid, 3)
        assert not rename.done()  # behind the pin, in the busy actor
    assert pin.result(timeout=10)[0] == 200
    status, body = rename.result(timeout=10)
    assert status == 200, body
    assert body["session"]["title"] == "last words" and body["session"]["pinned"] is True
    assert delete.result(timeout=10) == (200, {"deleted": True})
    assert daemon.api.plumbing.lanes.direct_writes == lane_writes


def test_pipelined_renames_and_a_delete_take_effect_in_order(
    running: tuple[Daemon, Client],
) -> None:
    _daemon, c = running
    sid = _warm_session(c, "pipelined")
    renames = [c.submit("session.updateTitle", _title(sid, f"t{i}")) for i in range(30)]
    delete = c.submit("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    late = c.submit("session.updateTitle", _title(sid, "too late"))
    for i, fut in enumerate(renames):
        status, body = fut.result(timeout=30)
        assert status == 200 and body["session"]["title"] == f"t{i}", (status, body)
    assert delete.result(timeout=30) == (200, {"deleted": True})
    status, body = late.result(timeout=30)
    assert status == 404, body
    assert body.get("reason") == "workspace_agent_session_not_found", body


def test_a_lane_runs_its_writes_in_order_and_routes_a_request_after_them() -> None:
    with ThreadPoolExecutor(4) as pool:
        lanes = SessionLanes(pool)
        gate = threading.Event()
        order: list[str] = []
        done = threading.Event()

        def first() -> None:
            gate.wait(10)
            order.append("w1")

        assert lanes.write_or_route(KEY, first)
        assert lanes.write_or_route(KEY, lambda: order.append("w2"))
        answered = lanes.begin_routed(KEY)
        lanes.route(KEY, lambda: order.append("now"), lambda: (order.append("r"), done.set()))
        # While the routed request is unanswered, a write goes to the actor.
        assert not lanes.write_or_route(KEY, lambda: order.append("never"))
        assert order == []
        gate.set()
        assert done.wait(10)
        assert order == ["w1", "w2", "r"]
        answered()
        answered()  # counts once
        assert lanes.write_or_route(KEY, lambda: order.append("w3"))
        # Another Session's lane is its own.
        assert lanes.write_or_route((WS, "other"), lambda: order.append("o"))
        lanes.route(KEY, lambda: None, lambda: None)
    assert sorted(order[3:]) == ["o", "w3"]


def test_a_request_with_no_lane_waiting_is_routed_at_once() -> None:
    with ThreadPoolExecutor(1) as pool:
        lanes = SessionLanes(pool)
        ran: list[str] = []
        answered = lanes.begin_routed(KEY)
        lanes.route(KEY, lambda: ran.append("now"), lambda: ran.append("later"))
        assert ran == ["now"]
        answered()
        assert lanes.write_or_route(KEY, lambda: None)


def test_a_rename_of_an_id_no_live_session_has_never_takes_the_writer(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    sid = create_session(c, title="gone soon")["agentSessionId"]
    assert c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid}) == {"deleted": True}
    assert daemon.store is not None
    stats = daemon.store.db.write_stats
    before = (stats.transactions, stats.rolled_back)
    for target in (sid, str(uuid.uuid4())):
        status, body = c.submit("session.updateTitle", _title(target, "x")).result(timeout=10)
        assert status == 404 and body.get("reason") == "workspace_agent_session_not_found", body
    assert (stats.transactions, stats.rolled_back) == before
