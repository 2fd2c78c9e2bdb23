"""The start-up sweep of runtime folders no Session and no unresolved fork owns
(`actors.runtime_dirs.sweep`): it lists runtimes/<segment>/<session>/ first and asks the store
about what it found — nothing found, nothing read; a few, those alone; many, every owner at
once — and keeps the law the same in each: a folder of a Session (live or deleted) or of a
fork target not `failed`/`abandoned` is never touched, a file keeps its folder. On a real
SQLite store."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from actors import runtime_dirs
from actors.context import _path_segment as path_segment
from domain.fork_states import ForkStatus
from drivers.runtime_marker import RUNTIME_VAR
from storage.models import ForkPrepareRequest
from storage.store import Store
from tests.support.left_processes import ended, reap

pytestmark = pytest.mark.timeout(30)

WS = "ws-sweep"
HASHED_WS = "team/ünïcode workspace"  # not a plain segment: runtimes/ws-<hash>/


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "store.sqlite3")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(params=["few", "many"])
def branch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each law test runs through both ways of asking the store: `many` sets the bound of
    `few` to 0, so any folder makes the sweep read every owner."""
    if request.param == "many":
        monkeypatch.setattr(runtime_dirs, "FEW_CANDIDATES", 0)
    return str(request.param)


def _session(store: Store, ws: str = WS) -> str:
    sid = str(uuid.uuid4())
    store.sessions.create_session(
        ws, session_id=sid, provider="tutti-agent", title="t", cwd="/work", settings={}
    )
    return sid


def _fork(store: Store, ws: str = WS) -> tuple[str, str]:
    """A `prepared` fork of a new Session with one settled Turn: (operation, target)."""
    sid = _session(store, ws)
    store.sessions.update_runtime(
        ws,
        sid,
        provider_session_id="prov",
        runtime_context={"driverKind": "tutti-agent", "driverVersion": "0.0.10"},
    )
    turn, _ = store.turns.claim_submit(ws, sid, str(uuid.uuid4()), "hi")
    store.turns.bind_provider_turn(ws, sid, turn.turn_id, f"pt-{uuid.uuid4().hex[:8]}", None)
    reply = store.history.append_message(ws, sid, turn.turn_id, kind="assistant", text="hello")
    store.turns.settle_turn(
        ws, sid, turn.turn_id, outcome="completed", final_assistant_message_id=reply.message_id
    )
    op, created = store.fork_prepare.prepare_fork(
        ws,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id=f"req-{uuid.uuid4()}",
            target_session_id=str(uuid.uuid4()),
            turn_id=turn.turn_id,
            driver_kind="tutti-agent",
            driver_version="0.0.10",
            binding_mode="host_copy",
            runtime_identity={},
        ),
    )
    assert created and op.status is ForkStatus.PREPARED
    return op.operation_id, op.target_session_id


def _made_ahead(runtimes: Path, ws: str, sid: str) -> Path:
    """The empty directories a worker makes ahead for a provider's child."""
    folder = runtime_dirs.session_dir(runtimes, ws, sid)
    (folder / "tutti-agent" / "sessions" / "2026").mkdir(parents=True)
    return folder


def test_no_folder_on_disk_reads_nothing_of_the_store(store: Store, tmp_path: Path) -> None:
    # A store whose owners cannot be read (its fork targets' reservations renamed away), while
    # the deleted Sessions' index still answers: a sweep with no Session folder on disk reads
    # no owner, whatever the store holds — only dot folders, links and files here.
    for _ in range(3):
        _session(store)
    runtimes = tmp_path / "runtimes"
    (runtimes / ".trash").mkdir(parents=True)
    (runtimes / WS / ".claude-spare-x").mkdir(parents=True)
    (runtimes / WS / "a-file").write_text("")
    (runtimes / WS / "a-link").symlink_to(tmp_path)
    (runtimes / "ws-link").symlink_to(runtimes / WS)
    broken = apsw.Connection(str(tmp_path / "store.sqlite3"))
    broken.execute("ALTER TABLE session_reservations RENAME TO session_reservations_gone")
    broken.close()
    runtime_dirs.sweep(store, runtimes)  # the spare home trashed, nothing else
    assert sorted(p.name for p in (runtimes / WS).iterdir()) == ["a-file", "a-link"]
    # The same store is read as soon as one folder is there: the read above would have failed.
    _made_ahead(runtimes, WS, str(uuid.uuid4()))
    with pytest.raises(apsw.SQLError, match="session_reservations"):
        runtime_dirs.sweep(store, runtimes)


def test_a_hashed_workspace_segment_keeps_its_sessions_folders(
    store: Store, tmp_path: Path, branch: str
) -> None:
    assert path_segment(HASHED_WS) != HASHED_WS
    runtimes = tmp_path / "runtimes"
    live = _made_ahead(runtimes, HASHED_WS, _session(store, HASHED_WS))
    deleted_sid = _session(store, HASHED_WS)
    store.sessions.delete_session(HASHED_WS, deleted_sid)
    # The same id under the plain workspace's folder is no Session's there.
    stray = _made_ahead(runtimes, WS, live.name)
    orphan = _made_ahead(runtimes, HASHED_WS, str(uuid.uuid4()))
    assert live.parent.name == path_segment(HASHED_WS)
    runtime_dirs.sweep(store, runtimes)
    assert live.is_dir() and (live / "tutti-agent" / "sessions" / "2026").is_dir()
    assert not stray.exists() and not orphan.exists()


def test_a_fork_target_is_kept_until_its_fork_fails(
    store: Store, tmp_path: Path, branch: str
) -> None:
    runtimes = tmp_path / "runtimes"
    op_id, target = _fork(store)
    folder = _made_ahead(runtimes, WS, target)
    assert runtime_dirs.sweep(store, runtimes) == 0
    assert (folder / "tutti-agent" / "sessions" / "2026").is_dir()
    store.fork_transitions.mark_fork_failed(WS, op_id, "refused")
    assert runtime_dirs.sweep(store, runtimes) == 1
    assert not folder.exists()


def test_a_file_keeps_an_unowned_folder_and_every_directory_above_it(
    store: Store, tmp_path: Path, branch: str
) -> None:
    runtimes = tmp_path / "runtimes"
    folder = _made_ahead(runtimes, WS, str(uuid.uuid4()))
    (folder / "tutti-agent" / "quarantine" / "op").mkdir(parents=True)
    kept = folder / "tutti-agent" / "quarantine" / "op" / "child.jsonl"
    kept.write_text("{}\n")
    assert runtime_dirs.sweep(store, runtimes) == 0
    assert kept.read_text() == "{}\n"
    assert not (folder / "tutti-agent" / "sessions").exists()


def test_the_sweep_ends_what_a_previous_runs_runtimes_left_and_nothing_else(
    store: Store, tmp_path: Path
) -> None:
    runtimes = tmp_path / "runtimes"
    home = runtimes / WS / "s1" / "tutti-agent-home"
    home.mkdir(parents=True)
    assert runtime_dirs.RUNTIME_VAR == RUNTIME_VAR

    def sleeper(**env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)

    procs = [
        sleeper(HOME=str(home / ".home"), AGENTHOST_RUNTIME="r1"),  # a killed run's tool's
        sleeper(HOME=str(home / ".home")),  # no runtime's: not the sweep's to end
        sleeper(HOME=str(tmp_path / "elsewhere"), AGENTHOST_RUNTIME="r2"),  # another home's
    ]
    try:
        runtime_dirs.sweep(store, runtimes)
        assert [ended(p.pid) for p in procs] == [True, False, False]
    finally:
        reap(procs)
