"""What a long-lived daemon keeps per client and per workspace is bounded, through the real
daemon (in process: its real store, worker, ZeroMQ sockets): a path anyone can repeat — a
client that reads a large reply and goes away, a Session made in a workspace nobody
subscribes to — run N times leaves at most a constant behind, never one entry per run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.daemon import Daemon
from tests.support.daemon import create_session
from tests.support.in_process import in_process_daemon
from transport.client import Client
from transport.server import TRACKED_BYTES

pytestmark = pytest.mark.timeout(120)

WS = "ws-long-lived"
CLIENTS = 8


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def test_clients_gone_after_a_large_reply_leave_no_entry_behind(
    running: tuple[Daemon, Client],
) -> None:
    """Each client's large replies are tracked until ZeroMQ has written them; one that read
    its reply and closed is never sent another, so only the next new client can forget it."""
    daemon, client = running
    blob = "s" * (TRACKED_BYTES + 4096)
    sid = create_session(client, WS, settings={"blob": blob})["agentSessionId"]
    assert daemon.server is not None
    replies = daemon.server._replies
    for _ in range(CLIENTS):
        one = Client(daemon.api_endpoint, timeout=30.0)
        try:
            got = one.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
            assert len(got["session"]["settings"]["blob"]) == len(blob)
        finally:
            one.close()
    # Only the last client's reply may still be held (its entry is forgotten by the next).
    assert len(replies.queued) <= 1, len(replies.queued)


def test_sessions_of_workspaces_nobody_hears_are_remembered_up_to_a_bound(
    running: tuple[Daemon, Client],
) -> None:
    """A Session change of a workspace no subscriber wants is skipped, and its workspace
    remembered (a later subscriber must not be shown an older carried row as the newest):
    workspaces are made by naming them, so the memory has a bound, and a workspace it forgot
    still answers from the floor (the newest `write_seq` forgotten), never from 0."""
    daemon, client = running
    publisher = daemon.publisher
    assert publisher is not None
    publisher.unseen_remembered = 4
    workspaces = [f"{WS}-{i}" for i in range(CLIENTS * 2)]
    for ws in workspaces:
        create_session(client, ws)
    assert publisher.skipped >= len(workspaces)
    assert len(publisher._unseen) <= publisher.unseen_remembered, len(publisher._unseen)
    forgotten = [ws for ws in workspaces if ws not in publisher._unseen]
    assert forgotten
    assert all(publisher._unseen_at(ws) == publisher._unseen_floor > 0 for ws in forgotten)
    newest = publisher._unseen_at(workspaces[-1])
    assert newest >= publisher._unseen_floor
