"""The in-process fork saga with `workspace: "worktree"` (tests/actors/saga_harness.py) over a
real git repository and a real checkpoint: the tree is made and recorded before the provider's
fork leaves, the child's cwd is the tree, a crash at each `host.workspace.*` failpoint ends
with no tree or one whole recorded tree, a failed fork removes its tree, an unknown one keeps
it, and a Turn without a checkpoint is refused before any operation exists."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from actors.ports import DeliveryUnknown
from domain.errors import ForkRequestConflict, WorkspaceCheckpointMissing
from domain.fork_states import ForkStatus
from storage.models import ForkPointKind, ForkPrepareRequest
from storage.store import Store
from tests.actors.saga_harness import (
    DRIVER,
    WS,
    Answer,
    Run,
    accepted,
    attach_checkpoint,
    run_saga,
    source,
)
from tests.support.invariants import STORE_LAWS, check_invariants
from tests.support.worktree_repos import git, make_repo, repo_state, tree_files
from workspace.shadow import Checkpoint, ShadowStore
from workspace.worktree import ForkTrees, TreePlan, Worktrees

pytestmark = pytest.mark.timeout(60)

WORKSPACE_POINTS = (
    "host.workspace.after_materialize",
    "host.workspace.after_rename",
    "host.workspace.after_record",
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def shadow(home: Path) -> ShadowStore:
    return ShadowStore(home / "checkpoints", size_limit=1024)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "project")


def checkpoint(shadow: ShadowStore, cwd: Path) -> dict[str, Any]:
    cp = shadow.capture(cwd)
    assert isinstance(cp, Checkpoint), cp
    return {
        "cwd": str(cwd),
        "before": cp.commit,
        "after": cp.commit,
        "changedFiles": [],
        "headCommit": cp.head_commit,
        "repoRoot": cp.repo_root,
        "tooLarge": list(cp.too_large),
    }


def ok(method: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
    return accepted(params)


def plan_of(run: Run) -> TreePlan:
    assert run.operation.worktree is not None
    return TreePlan.from_json(run.operation.worktree)


def laws(home: Path) -> None:
    report = check_invariants(home, probe_fence=False)
    broken = [v for v in report.violations if v.law in STORE_LAWS]
    assert not broken, broken


def fork_calls(run: Run) -> list[Mapping[str, Any]]:
    return [params for method, params in run.worker.calls if method == "fork"]


def test_a_worktree_fork_dispatches_only_after_its_tree_is_recorded_and_the_child_works_there(
    store: Store, home: Path, shadow: ShadowStore, repo: Path
) -> None:
    first = checkpoint(shadow, repo)
    expected = tree_files(shadow.materialize(repo, first["after"], home / "expected"))
    (repo / "src" / "app.py").write_text("print('Turn two')\n")
    second = checkpoint(shadow, repo)
    before = repo_state(repo)
    run = run_saga(
        store,
        home,
        fork_answer=ok,
        workspace="worktree",
        checkpoints=[first, second],
        trees=ForkTrees(shadow),
    )
    op = run.operation
    assert op.status is ForkStatus.COMMITTED and op.worktree_state == "made"
    plan = plan_of(run)
    hits = run.host.failpoints.hits
    assert hits.index("host.workspace.after_record") < hits.index("host.fork.after_dispatching")
    (call,) = fork_calls(run)
    assert call["target"]["cwd"] == plan.child_cwd
    assert op.committed_session is not None and op.committed_session.cwd == plan.child_cwd
    # The tree holds Turn one's files (the fork Turn), not Turn two's.
    child = tree_files(Path(plan.path))
    assert {k: v for k, v in child.items() if k in expected} == expected
    assert child["src/app.py"] == b"print('v2')\n"
    assert repo_state(repo, except_branch_prefix="agenthost/") == before
    laws(home)


def test_latest_settled_takes_the_newest_settled_turns_checkpoint(
    store: Store, home: Path, shadow: ShadowStore, repo: Path
) -> None:
    first = checkpoint(shadow, repo)
    (repo / "src" / "app.py").write_text("print('Turn two')\n")
    second = checkpoint(shadow, repo)
    run = run_saga(
        store,
        home,
        fork_answer=ok,
        workspace="worktree",
        checkpoints=[first, second],
        trees=ForkTrees(shadow),
        point=ForkPointKind.LATEST_SETTLED,
    )
    assert run.operation.status is ForkStatus.COMMITTED
    assert (Path(plan_of(run).path) / "src" / "app.py").read_text() == "print('Turn two')\n"


EXPECTED_AFTER_CRASH = {
    # The restart rule: `prepared` → failed, and a failed fork's tree is removed, whole or
    # half-made; the provider was never called.
    "host.workspace.after_materialize": ForkStatus.FAILED,
    "host.workspace.after_rename": ForkStatus.FAILED,
    "host.workspace.after_record": ForkStatus.FAILED,
}


@pytest.mark.parametrize("point", WORKSPACE_POINTS)
def test_a_crash_at_each_workspace_failpoint_leaves_no_tree_and_no_branch(
    store: Store, home: Path, shadow: ShadowStore, repo: Path, point: str
) -> None:
    before = repo_state(repo)
    record = checkpoint(shadow, repo)
    run = run_saga(
        store,
        home,
        fork_answer=ok,
        crash_at=point,
        workspace="worktree",
        checkpoints=[record],
        trees=ForkTrees(shadow),
    )
    assert run.crashed_at == point
    assert run.operation.status is EXPECTED_AFTER_CRASH[point]
    assert run.operation.worktree_state == "removed"
    assert run.worker.forks() == 0
    plan = plan_of(run)
    trees = Worktrees(shadow)
    assert not Path(plan.path).exists() and not trees.partial_exists(plan)
    assert not trees.branch_exists(plan)
    assert repo_state(repo) == before
    laws(home)


def test_a_failed_fork_removes_its_tree_and_an_unknown_one_keeps_it(
    store: Store, home: Path, shadow: ShadowStore, repo: Path
) -> None:
    record = checkpoint(shadow, repo)
    trees = ForkTrees(shadow)
    failed = run_saga(
        store,
        home,
        fork_answer=lambda m, p: {"disposition": "not_started", "error": "no runtime"},
        workspace="worktree",
        checkpoints=[record],
        trees=trees,
    )
    assert failed.operation.status is ForkStatus.FAILED
    assert failed.operation.worktree_state == "removed"
    assert not Path(plan_of(failed).path).exists()
    unknown_answer: Answer = lambda m, p: DeliveryUnknown("timeout")  # noqa: E731
    unknown = run_saga(
        store,
        home,
        fork_answer=unknown_answer,
        workspace="worktree",
        checkpoints=[record],
        trees=trees,
    )
    assert unknown.operation.status is ForkStatus.UNKNOWN
    assert unknown.operation.worktree_state == "made"
    plan = plan_of(unknown)
    assert Path(plan.path).is_dir()  # evidence until resolved
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    laws(home)


def test_a_tree_that_cannot_be_made_fails_the_fork_before_any_dispatch(
    store: Store, home: Path, shadow: ShadowStore, repo: Path
) -> None:
    record = {**checkpoint(shadow, repo), "headCommit": "1" * 40}
    run = run_saga(
        store,
        home,
        fork_answer=ok,
        workspace="worktree",
        checkpoints=[record],
        trees=ForkTrees(shadow),
    )
    assert run.operation.status is ForkStatus.FAILED
    assert "worktree could not be made" in (run.operation.error or "")
    assert run.worker.forks() == 0
    assert not Path(plan_of(run).path).exists()
    laws(home)


def _prepare(
    store: Store, sid: str, turn_id: str, request_id: str, workspace: str, shadow: ShadowStore
) -> Any:
    return store.fork_prepare.prepare_fork(
        WS,
        ForkPrepareRequest(
            source_session_id=sid,
            request_id=request_id,
            target_session_id=str(uuid.UUID(int=7)),
            turn_id=turn_id,
            driver_kind=DRIVER[0],
            driver_version=DRIVER[1],
            binding_mode="host_copy",
            workspace=workspace,
        ),
        plan_workspace=ForkTrees(shadow).plan,
    )


@pytest.mark.parametrize(
    "record",
    [None, {"state": "unavailable", "reason": "git_missing", "message": "git is not installed"}],
    ids=["no checkpoint", "unavailable"],
)
def test_a_turn_without_a_checkpoint_is_refused_before_any_operation(
    store: Store, home: Path, shadow: ShadowStore, record: Mapping[str, Any] | None
) -> None:
    sid, turns = source(store, home)
    attach_checkpoint(store, sid, turns[0], record)
    with pytest.raises(WorkspaceCheckpointMissing) as refused:
        _prepare(store, sid, turns[0], "r1", "worktree", shadow)
    assert refused.value.reason == "workspace_checkpoint_missing"
    reason = {} if record is None else {"workspaceReason": "git_missing"}
    assert refused.value.params == {"turnId": turns[0], **reason}
    if record is not None:
        assert "git is not installed" in refused.value.message
    assert store.db.rows("SELECT count(*) FROM fork_operations")[0][0] == 0
    # The same Turn forks as before without its files.
    op, created = _prepare(store, sid, turns[0], "r2", "shared", shadow)
    assert created and op.workspace_mode == "shared" and op.worktree is None


def test_the_same_request_id_with_another_workspace_is_another_request(
    store: Store, home: Path, shadow: ShadowStore, repo: Path
) -> None:
    sid, turns = source(store, home)
    attach_checkpoint(store, sid, turns[0], checkpoint(shadow, repo))
    op, created = _prepare(store, sid, turns[0], "same", "shared", shadow)
    assert created
    with pytest.raises(ForkRequestConflict):
        _prepare(store, sid, turns[0], "same", "worktree", shadow)
    again, created = _prepare(store, sid, turns[0], "same", "shared", shadow)
    assert not created and again.operation_id == op.operation_id
