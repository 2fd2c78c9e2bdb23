"""A fork's own tree made from a workspace checkpoint, against real git and a real repository
made here: the tree holds the checkpoint byte for byte on a new branch at the checkpoint's HEAD
(uncommitted changes on top), the person's repository gains only that worktree and branch,
one operation never gets two trees or two branches, a half-made tree is recognisable and
removed, and outside a repository the tree is a plain directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.worktree_repos import BIG, git, make_repo, repo_state, tree_files
from workspace.git import GitUnavailable
from workspace.shadow import Checkpoint, ShadowStore
from workspace.worktree import TreePlan, TreeRefused, Worktrees, plan_tree, slug

pytestmark = pytest.mark.timeout(60)

OP = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


class Crash(Exception):
    pass


@pytest.fixture
def store(tmp_path: Path) -> ShadowStore:
    return ShadowStore(tmp_path / "home" / "checkpoints", size_limit=1024)


def record(cp: Checkpoint, cwd: Path) -> dict[str, Any]:
    """The checkpoint as a Turn stores it (`turns.checkpoint_json`)."""
    return {
        "cwd": str(cwd),
        "before": cp.commit,
        "after": cp.commit,
        "changedFiles": [],
        "headCommit": cp.head_commit,
        "repoRoot": cp.repo_root,
        "tooLarge": list(cp.too_large),
    }


def fork_branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--list", "--format=%(refname:short)", "agenthost/*").split()


def checkpointed(store: ShadowStore, cwd: Path) -> tuple[dict[str, Any], dict[str, bytes | str]]:
    cp = store.capture(cwd)
    assert isinstance(cp, Checkpoint), cp
    return record(cp, cwd), tree_files(store.materialize(cwd, cp.commit, cwd.parent / "expected"))


def test_worktree_holds_the_checkpoint_on_a_new_branch_and_the_repository_gains_only_that(
    tmp_path: Path, store: ShadowStore
) -> None:
    repo = make_repo(tmp_path / "project")
    head = git(repo, "rev-parse", "HEAD")
    checkpoint, expected = checkpointed(store, repo)
    # Work done in the source after the fork Turn never reaches the child.
    (repo / "src" / "app.py").write_text("print('after the fork turn')\n")
    (repo / "later.txt").write_text("after\n")
    before = repo_state(repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="Fix the parser (fork 2)")
    assert plan.branch == "agenthost/fix-the-parser-fork-2-0f1e2d3c"
    assert plan.path == str(tmp_path.resolve() / "project.agenthost" / "0f1e2d3c")
    tree = Worktrees(store).make(plan)

    assert repo_state(repo, except_branch_prefix="agenthost/") == before
    assert git(repo, "rev-parse", f"refs/heads/{plan.branch}") == head
    child = tree_files(tree)
    # Byte for byte for every captured path; the rest as the HEAD commit has it.
    assert {k: v for k, v in child.items() if k in expected} == expected
    assert set(child) - set(expected) == {"big.dat"}
    assert child["big.dat"] == BIG  # too large to capture: HEAD's version, not the source's
    assert child["src/app.py"] == b"print('v2')\n"
    assert "doomed.txt" not in child and "later.txt" not in child
    assert not (tree / "ignored").exists() and not (tree / ".env").exists()
    assert (tree / "link").is_symlink()
    # The person can review and commit it as any worktree: the checkpoint's work is
    # uncommitted on the fork's branch.
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD") == plan.branch
    status = {line.strip() for line in git(tree, "status", "--porcelain").splitlines()}
    assert status == {"M src/app.py", "D doomed.txt", "?? notes.md", "?? new.bin"}


def test_a_second_make_for_the_operation_finds_the_same_tree_and_branch(
    tmp_path: Path, store: ShadowStore
) -> None:
    repo = make_repo(tmp_path / "project")
    checkpoint, _ = checkpointed(store, repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    trees = Worktrees(store)
    first = trees.make(plan)
    (first / "notes.md").write_text("the child's own work\n")
    again = trees.make(plan_tree(checkpoint, operation_id=OP, title="t"))
    assert again == first
    assert (again / "notes.md").read_text() == "the child's own work\n"
    assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 2
    assert fork_branches(repo) == [plan.branch]


@pytest.mark.parametrize(
    "crash_at", ["host.workspace.after_materialize", "host.workspace.after_rename"]
)
def test_a_crash_leaves_a_recognisable_tree_and_the_next_make_gives_one_whole_tree(
    tmp_path: Path, store: ShadowStore, crash_at: str
) -> None:
    repo = make_repo(tmp_path / "project")
    checkpoint, expected = checkpointed(store, repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    trees = Worktrees(store)

    def hit(name: str) -> None:
        if name == crash_at:
            raise Crash(name)

    with pytest.raises(Crash):
        trees.make(plan, hit)
    if crash_at.endswith("after_materialize"):
        # Half-made: only ever under the operation's `.partial-` directory, never at `path`.
        assert not Path(plan.path).exists() and not trees.exists(plan)
    else:
        assert trees.exists(plan) and not trees.partial_exists(plan)
    tree = trees.make(plan)
    assert not trees.partial_exists(plan)
    assert {k: v for k, v in tree_files(tree).items() if k in expected} == expected
    assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 2
    assert fork_branches(repo) == [plan.branch]
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD") == plan.branch


def test_a_crash_leaves_the_exception_path_clean_when_make_itself_fails(
    tmp_path: Path, store: ShadowStore
) -> None:
    """A make that fails before the rename (here: a HEAD commit the repository lacks) leaves
    no tree, no half-made directory and no worktree registration behind."""
    repo = make_repo(tmp_path / "project")
    checkpoint, _ = checkpointed(store, repo)
    checkpoint["headCommit"] = "1" * 40
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    trees = Worktrees(store)
    with pytest.raises(Exception):  # noqa: B017 - git's own failure, typed GitUnavailable
        trees.make(plan)
    assert not Path(plan.path).exists() and not trees.partial_exists(plan)
    assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 1


def test_remove_takes_the_tree_and_its_branch_and_the_repository_is_as_before(
    tmp_path: Path, store: ShadowStore
) -> None:
    repo = make_repo(tmp_path / "project")
    checkpoint, _ = checkpointed(store, repo)
    before = repo_state(repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    trees = Worktrees(store)
    trees.make(plan)
    trees.remove(plan)
    trees.remove(plan)  # idempotent
    assert repo_state(repo) == before
    assert not Path(plan.path).exists() and not Path(plan.path).parent.exists()
    assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 1


def test_remove_of_a_half_made_tree_leaves_nothing(tmp_path: Path, store: ShadowStore) -> None:
    repo = make_repo(tmp_path / "project")
    checkpoint, _ = checkpointed(store, repo)
    before = repo_state(repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    trees = Worktrees(store)

    def hit(name: str) -> None:
        raise Crash(name)

    with pytest.raises(Crash):
        trees.make(plan, hit)
    assert trees.partial_exists(plan) and trees.branch_exists(plan)
    trees.remove(plan)
    assert not trees.partial_exists(plan) and not trees.branch_exists(plan)
    assert repo_state(repo) == before


def test_remove_keeps_a_branch_with_commits_of_its_own(tmp_path: Path, store: ShadowStore) -> None:
    repo = make_repo(tmp_path / "project")
    checkpoint, _ = checkpointed(store, repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    trees = Worktrees(store)
    tree = trees.make(plan)
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "the child's work")
    trees.remove(plan)
    assert not Path(plan.path).exists()
    assert trees.branch_exists(plan)


def test_a_subdirectory_cwd_is_the_same_subdirectory_of_the_worktree(
    tmp_path: Path, store: ShadowStore
) -> None:
    repo = make_repo(tmp_path / "project")
    sub = repo / "src"
    (sub / "wip.py").write_text("work in progress\n")
    checkpoint, expected = checkpointed(store, sub)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    assert plan.child_cwd == os.path.join(plan.path, "src")
    Worktrees(store).make(plan)
    assert tree_files(Path(plan.child_cwd)) == expected
    # Outside the checkpointed directory the tree is the HEAD commit.
    assert (Path(plan.path) / "doomed.txt").read_text() == "to be deleted\n"


def test_outside_a_repository_the_tree_is_a_plain_directory_of_the_checkpoint(
    tmp_path: Path, store: ShadowStore
) -> None:
    cwd = tmp_path / "notes"
    cwd.mkdir()
    (cwd / "a.txt").write_text("a\n")
    (cwd / "bin").write_bytes(b"\0\1\2")
    (cwd / "l").symlink_to("a.txt")
    checkpoint, expected = checkpointed(store, cwd)
    assert checkpoint["repoRoot"] is None
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    assert plan.branch is None
    assert plan.path == str(tmp_path.resolve() / "notes.agenthost" / "0f1e2d3c")
    trees = Worktrees(store)
    tree = trees.make(plan)
    assert tree_files(tree) == expected and not (tree / ".git").exists()
    trees.remove(plan)
    assert not tree.exists()


def test_worktrees_dir_puts_every_tree_under_it(tmp_path: Path, store: ShadowStore) -> None:
    repo = make_repo(tmp_path / "project")
    checkpoint, _ = checkpointed(store, repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t", worktrees_dir=str(tmp_path / "wt"))
    assert plan.path == str(tmp_path / "wt" / "0f1e2d3c")
    assert TreePlan.from_json(plan.to_json()) == plan
    assert Worktrees(store).make(plan).is_dir()


@pytest.mark.parametrize(
    "checkpoint",
    [None, {"state": "unavailable", "reason": "git_missing", "message": "git is not installed"}],
)
def test_no_checkpoint_is_a_typed_refusal(checkpoint: dict[str, Any] | None) -> None:
    with pytest.raises(TreeRefused) as caught:
        plan_tree(checkpoint, operation_id=OP, title="t")
    assert caught.value.reason == "workspace_checkpoint_missing"


def test_slug_is_branch_safe() -> None:
    assert slug("Ünïcode / weird..name (fork 3)") == "n-code-weird-name-fork-3"
    assert slug("***") == "fork"


OP2 = "1a2b3c4d-5e6f-4a8b-9c0d-e1f2a3b4c5d6"


def _fork_of_a_fork(
    tmp_path: Path, store: ShadowStore
) -> tuple[Path, Worktrees, TreePlan, TreePlan]:
    """A repository, a fork's tree of it, and the plan of a fork of that tree (its repository
    root is the first tree, a linked worktree of the repository)."""
    repo = make_repo(tmp_path / "project")
    first, _ = checkpointed(store, repo)
    plan1 = plan_tree(first, operation_id=OP, title="child")
    trees = Worktrees(store)
    tree1 = Path(trees.make(plan1))
    (tree1 / "child.txt").write_text("the child's file\n")
    second, _ = checkpointed(store, tree1)
    plan2 = plan_tree(second, operation_id=OP2, title="grandchild")
    assert plan2.repo_root is not None and Path(plan2.repo_root).resolve() == tree1.resolve()
    return repo, trees, plan1, plan2


def test_remove_of_a_planned_tree_whose_repository_root_is_gone_is_done(
    tmp_path: Path, store: ShadowStore
) -> None:
    """The crash soak's case: a fork of a fork's tree failed before its tree was made, and the
    source's tree (the plan's repository root) went with its Session: removing the failed
    fork's tree must finish (git cannot run in a directory that is gone), not fail forever."""
    repo, trees, plan1, plan2 = _fork_of_a_fork(tmp_path, store)
    trees.remove(plan1)
    assert not Path(str(plan2.repo_root)).exists()
    trees.remove(plan2)  # raised GitUnavailable ("cannot run git") before
    trees.remove(plan2)  # idempotent
    assert not Path(plan2.path).exists() and not trees.partial_exists(plan2)
    assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 1


def test_remove_of_a_made_tree_whose_repository_root_is_gone_takes_its_branch_too(
    tmp_path: Path, store: ShadowStore
) -> None:
    """A whole tree of a fork of a fork, its repository root (the first tree) gone: git is run
    from the common git directory the tree names, so its registration and branch go with it."""
    repo, trees, plan1, plan2 = _fork_of_a_fork(tmp_path, store)
    trees.make(plan2)
    assert plan2.branch in fork_branches(repo)
    shutil.rmtree(str(plan2.repo_root))  # the first tree gone under it
    git(repo, "worktree", "prune")
    trees.remove(plan2)
    assert not Path(plan2.path).exists()
    assert plan2.branch not in fork_branches(repo)
    assert all(
        Path(line[9:]).name != Path(plan2.path).name
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    )


def _symlink_swap_repo(tmp_path: Path, committed_link: bool) -> tuple[Path, Path]:
    """A repository whose `data` is, at HEAD, a directory (or a symlink to the person's
    folder `outside`, when `committed_link`), and in the working tree the other one; the
    person's `outside` holds files named as `data`'s are."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("a.txt", "b.txt"):
        (outside / name).write_text(f"the person's own {name}\n")
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "keep.txt").write_text("k\n")
    data = repo / "data"
    if committed_link:
        data.symlink_to(outside)
    else:
        data.mkdir()
        for name in ("a.txt", "b.txt"):
            (data / name).write_text(f"committed {name}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    if committed_link:
        data.unlink()
        data.mkdir()
        (data / "a.txt").write_text("the turn's a.txt\n")
    else:
        shutil.rmtree(data)
        data.symlink_to(outside)
    return repo, outside


@pytest.mark.parametrize("committed_link", [False, True], ids=["dir_to_link", "link_to_dir"])
def test_a_fork_never_removes_a_file_through_a_symlink_to_the_persons_folder(
    tmp_path: Path, store: ShadowStore, committed_link: bool
) -> None:
    """A directory of HEAD that the Turn replaced by a symlink out of the tree (or the
    reverse): the tree's files are removed or replaced in the tree, never through the
    symlink. Before, each HEAD file of the old directory was unlinked through the new
    symlink (or each checkpoint file through HEAD's), deleting the person's own files."""
    repo, outside = _symlink_swap_repo(tmp_path, committed_link)
    theirs = tree_files(outside)
    checkpoint, expected = checkpointed(store, repo)
    tree = Worktrees(store).make(plan_tree(checkpoint, operation_id=OP, title="t"))
    assert tree_files(outside) == theirs
    child = tree_files(tree)
    assert child == expected
    assert (tree / "data").is_symlink() != committed_link


def test_a_worktree_add_killed_at_its_bound_leaves_no_registration_in_the_repository(
    tmp_path: Path, store: ShadowStore
) -> None:
    """`git worktree add` killed mid-checkout (past its bound: here a smudge filter of the
    person's repository that stalls, as a network-bound LFS can) leaves its registration
    locked `initializing`, which `git worktree prune` never takes. The failed fork's removal
    takes it: the person's repository is as before, no stale worktree listed and its branch
    free to delete. Before, the registration stayed for good, holding the fork's branch."""
    repo = make_repo(tmp_path / "project")
    (repo / ".gitattributes").write_text("src/*.py filter=slow\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "attributes")
    git(repo, "config", "filter.slow.smudge", "sleep 60; cat")
    checkpoint, _ = checkpointed(store, repo)
    before = repo_state(repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    trees = Worktrees(store, timeout_s=1.0)
    with pytest.raises(GitUnavailable):
        trees.make(plan)
    trees.remove(plan)
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert not list((repo / ".git" / "worktrees").glob("*"))
    assert fork_branches(repo) == []
    assert repo_state(repo) == before


def test_removing_the_last_tree_keeps_the_persons_worktrees_dir(
    tmp_path: Path, store: ShadowStore
) -> None:
    """`worktrees_dir` is the person's directory: removing the last tree under it (a failed
    fork's, a deleted child's) leaves it, as it leaves the repository; only the
    `<repository>.agenthost` directory the host made beside the repository goes once empty.
    Before, the person's directory was removed with the last tree."""
    repo = make_repo(tmp_path / "project")
    checkpoint, _ = checkpointed(store, repo)
    mine = tmp_path / "trees"
    mine.mkdir(mode=0o750)
    trees = Worktrees(store)
    for i, op in enumerate((OP, "1f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")):
        plan = plan_tree(checkpoint, operation_id=op, title="t", worktrees_dir=str(mine))
        trees.make(plan)
        trees.remove(plan) if i == 0 else trees.remove_child(plan)
        assert mine.is_dir() and list(mine.iterdir()) == []
    beside = plan_tree(checkpoint, operation_id=OP, title="t")
    trees.make(beside)
    trees.remove(beside)
    assert not Path(beside.path).parent.exists()


def test_a_tree_beside_the_repository_is_recorded_by_its_real_path_through_a_linked_dir(
    tmp_path: Path, store: ShadowStore
) -> None:
    """`<repository>.agenthost` a symlink the person made (the trees kept on another disk): the
    tree is recorded by its real path, as under a linked `worktrees_dir` — the spelling a
    resolved `cwd` shows, which the checks of who works in a tree compare. Before, the link's
    path was recorded."""
    repo = make_repo(tmp_path / "project")
    elsewhere = tmp_path / "disk" / "trees"
    elsewhere.mkdir(parents=True)
    (tmp_path / "project.agenthost").symlink_to(elsewhere)
    checkpoint, expected = checkpointed(store, repo)
    plan = plan_tree(checkpoint, operation_id=OP, title="t")
    assert plan.path == str(elsewhere.resolve() / "0f1e2d3c")
    tree = Worktrees(store).make(plan)
    assert os.path.realpath(tree) == plan.path
    child = tree_files(tree)
    assert {k: v for k, v in child.items() if k in expected} == expected


@pytest.mark.parametrize("enclosed", [False, True], ids=["alone", "in_another_repository"])
def test_a_half_made_tree_whose_repository_root_is_gone_leaves_nothing_in_the_repository(
    tmp_path: Path, store: ShadowStore, enclosed: bool
) -> None:
    """A fork of a fork's tree killed half-made (whole in its `.partial-` directory), then the
    source's tree (the plan's repository root) removed with its Session: the failed fork's
    removal finds the repository through what is left of the half-made tree and takes its
    registration and its branch. Before, it asked git in the `.partial-` directory above that
    tree, which is no worktree: nothing was found (the registration and branch stayed for good)
    or, with the trees inside another repository (a home kept in git), that repository was
    found and pruned instead."""
    outer_before = ""
    if enclosed:
        git(tmp_path, "init", "-q", "-b", "main")
        outer_before = git(tmp_path, "worktree", "list", "--porcelain")
    repo, trees, plan1, plan2 = _fork_of_a_fork(tmp_path, store)

    def crash(name: str) -> None:
        if name == "host.workspace.after_materialize":
            raise Crash(name)

    with pytest.raises(Crash):
        trees.make(plan2, crash)
    assert trees.partial_exists(plan2) and plan2.branch in fork_branches(repo)
    trees.remove(plan1)
    assert not Path(str(plan2.repo_root)).exists()
    trees.remove(plan2)
    assert not trees.partial_exists(plan2) and not Path(plan2.path).exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert plan2.branch not in fork_branches(repo)
    if enclosed:
        assert git(tmp_path, "worktree", "list", "--porcelain") == outer_before
