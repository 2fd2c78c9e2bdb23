"""What a long-lived daemon keeps per client and per workspace is bounded, through the real
daemon (in process: its real store, worker, ZeroMQ sockets): a path anyone can repeat — a
client that reads a large reply and goes away, a Session made in a workspace nobody
subscribes to — run N times leaves at most a constant behind, never one entry per run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agenthost.daemon import Daemon
from tests.daemon.test_fork_saga import until_terminal
from tests.support.daemon import create_session, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from tests.support.worktree_forks import trees_beside, worktree_fork_params
from tests.support.worktree_repos import make_repo
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


TREES = 4


def _folder_state(daemon: Daemon) -> dict[str, int]:
    """What the daemon keeps per working folder: its lock, its stale-lock clearing, and the
    shadow store's caches of it and its repository."""
    janitor = daemon.ctx.checkpoint_janitor
    assert janitor is not None
    shadow, locks = janitor.shadow, janitor.locks
    out = {"locks": len(locks), "cleared": len(locks._cleared)}
    for name in (
        "_repos",
        "_locations",
        "_repo_locks",
        "_trees",
        "_snapshots",
        "_too_big",
        "_backoff",
        "_skip_walks",
        "_young_until",
        "_loose",
        "_named",
    ):
        out[name] = len(getattr(shadow, name))
    return out


def test_removed_worktree_trees_leave_no_folder_state_behind(
    running: tuple[Daemon, Client], tmp_path: Path
) -> None:
    """A worktree fork's child, run and deleted with `worktree: "remove"`: its tree is gone,
    so is what the daemon kept for that folder (lock, caches) once its refs are dropped; the
    source's folder keeps its own. N removed trees leave what one does."""
    daemon, client = running
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, WS, cwd=str(repo))["agentSessionId"]
    run_turn(client, sid, "/write a.txt start", WS)
    before = _folder_state(daemon)
    for i in range(TREES):
        turn = run_turn(client, sid, f"/write a{i}.txt more", WS)
        params = worktree_fork_params(
            sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4()), ws=WS
        )
        op = until_terminal(client, client.call("fork.create", params)["operation"], ws=WS)
        assert op["status"] == "committed", op
        child = op["session"]["agentSessionId"]
        run_turn(client, child, f"/write b{i}.txt in the tree", WS)
        done = client.call(
            "session.delete", {"workspaceId": WS, "agentSessionId": child, "worktree": "remove"}
        )
        assert done["worktree"]["state"] == "removed", done
    assert trees_beside(repo) == []
    janitor = daemon.ctx.checkpoint_janitor
    assert janitor is not None
    # The delete's own drop retires the folder; a sweep (which visits every shadow
    # repository, the removed trees' too) leaves no entry behind either.
    janitor.sweep()
    # A drop or collection the sweep found busy runs parked, after it: waited for.
    wait_for(lambda: _folder_state(daemon) == before, timeout=30.0)
    after = _folder_state(daemon)
    assert after["locks"] <= 1 and after["_repos"] <= 1, after


def test_removed_worktree_trees_leave_no_shadow_repository_on_disk(
    running: tuple[Daemon, Client], tmp_path: Path
) -> None:
    """The checkpoint store on disk: a removed tree's shadow repository (the child's Turns
    captured there, and the delete's own check of the tree) is removed once no ref is left in
    it and its folder is gone — the sweep's collection kept its newest state for good (the
    shadow index names it), one whole copy of the captured files per fork ever removed."""
    daemon, client = running
    janitor = daemon.ctx.checkpoint_janitor
    assert janitor is not None
    repo = make_repo(tmp_path / "project")
    sid = create_session(client, WS, cwd=str(repo))["agentSessionId"]
    for i in range(2):
        turn = run_turn(client, sid, f"/write a{i}.txt more", WS)
        params = worktree_fork_params(
            sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4()), ws=WS
        )
        op = until_terminal(client, client.call("fork.create", params)["operation"], ws=WS)
        assert op["status"] == "committed", op
        child = op["session"]["agentSessionId"]
        run_turn(client, child, f"/write b{i}.txt in the tree", WS)
        done = client.call(
            "session.delete", {"workspaceId": WS, "agentSessionId": child, "worktree": "remove"}
        )
        assert done["worktree"]["state"] == "removed", done
    assert len(janitor.shadow.workdirs()) == 3  # the source's and each tree's
    janitor.sweep()
    real = Path(os.path.realpath(repo))
    # A drop or collection the sweep found busy runs parked, after it: waited for.
    wait_for(lambda: janitor.shadow.workdirs() == [real], timeout=30.0)
    # The source keeps its checkpoints; another sweep changes nothing.
    assert janitor.shadow.refs(real)
    janitor.sweep()
    assert janitor.shadow.workdirs() == [real]


LOOSE_FILES = 7_000
"""More than git's `gc.auto` (6,700 loose objects): the count past which a store is packed."""


def test_a_live_sessions_loose_checkpoint_objects_are_packed_by_the_sweep(
    running: tuple[Daemon, Client], tmp_path: Path
) -> None:
    """A store no Session's delete ever dirties (a long-lived Session, its folder busy) keeps
    every capture's objects loose — one file each, never packed, walked by each size reading
    — unless the sweep packs it once git's own threshold is passed (`gc --auto`). Before,
    only a store that lost refs was ever collected."""
    import subprocess

    daemon, client = running
    janitor = daemon.ctx.checkpoint_janitor
    assert janitor is not None
    work = tmp_path / "big"
    work.mkdir()
    for i in range(LOOSE_FILES):
        (work / f"f{i:05d}.txt").write_text(f"file {i}\n")
    sid = create_session(client, WS, cwd=str(work))["agentSessionId"]
    turn = run_turn(client, sid, "/write a.txt one more", WS)
    assert turn["workspace"].get("after"), turn["workspace"]
    repo = janitor.shadow.repo_dir(work)

    def loose() -> int:
        out = subprocess.run(
            ["git", "count-objects", "-v"],
            env={"GIT_DIR": str(repo), "PATH": os.environ["PATH"], "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(next(line for line in out.splitlines() if line.startswith("count:"))[7:])

    assert loose() > LOOSE_FILES
    janitor.sweep()
    # A collection the sweep found busy runs parked, after it: waited for.
    wait_for(lambda: loose() < 100, timeout=60.0)
    # Every checkpoint still reads whole.
    assert janitor.shadow.has(work, turn["workspace"]["after"])
