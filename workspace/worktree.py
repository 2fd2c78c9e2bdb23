"""A fork's own working tree made from a workspace checkpoint: inside a git repository a
`git worktree` of the person's repository on a new branch at the checkpoint's HEAD commit, with
the checkpoint's files applied on top as uncommitted changes; elsewhere a plain directory
holding the checkpoint's files. Made in a temporary directory and renamed into place, keyed by
the fork operation, so a second call finds the same tree and a half-made one is recognisable.

Nothing else of the person's repository changes (law 10): only `worktree add/repair/remove/
prune` and `branch -D` of the fork's own branch run there; everything else is written through
the shadow store's object database and a private index.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workspace.git import Git, GitUnavailable
from workspace.shadow import Checkpoint, ShadowStore, _nul, _split_nul, unlink_in

BRANCH_PREFIX = "agenthost/"
PARTIAL_PREFIX = ".partial-"
"""`<parent>/.partial-<short id>/`: where a tree is made before it is renamed into place; a
directory of that name is always half-made and removable."""


class TreeRefused(Exception):
    """The checkpoint cannot be made into a tree (no checkpoint, or one that is unavailable);
    `reason` is `workspace_checkpoint_missing`."""

    reason = "workspace_checkpoint_missing"


@dataclass(frozen=True, slots=True)
class TreePlan:
    """Where one fork operation's tree goes and what it holds, decided at prepare and frozen on
    the operation: `path` the tree's top, `child_cwd` the child Session's directory in it (the
    source cwd's place in its repository), `branch` None outside a repository."""

    operation_id: str
    path: str
    child_cwd: str
    branch: str | None
    source_cwd: str
    checkpoint: str
    head_commit: str | None
    repo_root: str | None
    too_large: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "path": self.path,
            "childCwd": self.child_cwd,
            "branch": self.branch,
            "sourceCwd": self.source_cwd,
            "checkpoint": self.checkpoint,
            "headCommit": self.head_commit,
            "repoRoot": self.repo_root,
            "tooLarge": list(self.too_large),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TreePlan:
        return cls(
            operation_id=str(data["operationId"]),
            path=str(data["path"]),
            child_cwd=str(data["childCwd"]),
            branch=None if data.get("branch") is None else str(data["branch"]),
            source_cwd=str(data["sourceCwd"]),
            checkpoint=str(data["checkpoint"]),
            head_commit=None if data.get("headCommit") is None else str(data["headCommit"]),
            repo_root=None if data.get("repoRoot") is None else str(data["repoRoot"]),
            too_large=tuple(str(p) for p in data.get("tooLarge") or ()),
        )

    @property
    def in_repository(self) -> bool:
        return self.repo_root is not None and self.head_commit is not None and bool(self.branch)

    @property
    def partial(self) -> Path:
        top = Path(self.path)
        return top.parent / f"{PARTIAL_PREFIX}{top.name}"


def short_id(operation_id: str) -> str:
    return operation_id.replace("-", "")[:8].lower()


def slug(title: str, limit: int = 40) -> str:
    """A branch-name-safe slug of a title (`Fix the parser (fork 2)` → `fix-the-parser-fork-2`)."""
    text = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return text[:limit].strip("-") or "fork"


def plan_tree(
    checkpoint: Mapping[str, Any] | None,
    *,
    operation_id: str,
    title: str,
    worktrees_dir: str | None = None,
) -> TreePlan:
    """The tree a fork through a Turn with `checkpoint` (its record, as the Turn stores it)
    gets. Default place: `<repository>.agenthost/<short id>` beside the repository, or beside
    the directory outside one; `worktrees_dir` puts every tree under that directory instead.
    Raises `TreeRefused` for a missing or unavailable checkpoint."""
    if not checkpoint or checkpoint.get("state") == "unavailable" or not checkpoint.get("after"):
        why = (checkpoint or {}).get("message") or "the Turn has no workspace checkpoint"
        raise TreeRefused(str(why))
    cwd = os.path.realpath(str(checkpoint["cwd"]))
    repo_root = checkpoint.get("repoRoot")
    head = checkpoint.get("headCommit")
    root = os.path.realpath(str(repo_root)) if repo_root else None
    inside = root is not None and bool(head)
    base = root if inside and root is not None else cwd
    short = short_id(operation_id)
    # Real paths on both sides (`cwd`, `root` above): a tree is recorded by the path a
    # resolved `cwd` shows (a Session started in it, `session.create`'s refusal of a deleted
    # child's tree), also under a `worktrees_dir` reached through a symlink.
    parent = (
        Path(os.path.realpath(os.path.expanduser(worktrees_dir)))
        if worktrees_dir
        else Path(os.path.realpath(base + ".agenthost"))  # a link a person made there too
    )
    top = parent / short
    rel = os.path.relpath(cwd, base) if inside else "."
    child = top if rel == "." else top / rel
    return TreePlan(
        operation_id=operation_id,
        path=str(top),
        child_cwd=str(child),
        branch=f"{BRANCH_PREFIX}{slug(title)}-{short}" if inside else None,
        source_cwd=cwd,
        checkpoint=str(checkpoint["after"]),
        head_commit=str(head) if inside else None,
        repo_root=root if inside else None,
        too_large=tuple(str(p) for p in checkpoint.get("tooLarge") or ()),
    )


Hit = Callable[[str], None]


def _no_hit(_: str) -> None:
    return None


class Worktrees:
    """Makes and removes fork trees from checkpoints in `shadow` (its git runner and store)."""

    def __init__(self, shadow: ShadowStore, *, timeout_s: float | None = None) -> None:
        self.shadow = shadow
        # Each git here writes a whole tree: the shadow store's long bound unless given.
        self.timeout_s = shadow.long_timeout_s if timeout_s is None else timeout_s

    def _git(self) -> Git:
        self.shadow.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Git.find(self.shadow.root, self.timeout_s)

    # -- making ----------------------------------------------------------------------------

    def make(self, plan: TreePlan, hit: Hit = _no_hit) -> Path:
        """The plan's tree, whole: made if absent (temp dir, `host.workspace.after_materialize`,
        rename, `host.workspace.after_rename`), found if already made. Never two trees or two
        branches for one operation: a leftover half-made tree is removed first."""
        top = Path(plan.path)
        if self.exists(plan):
            return top
        git = self._git()
        self.remove_partial(plan)
        partial_parent = plan.partial
        partial_parent.mkdir(parents=True, exist_ok=False)
        work = partial_parent / top.name
        try:
            if plan.in_repository:
                self._worktree_into(git, plan, work)
            else:
                self.shadow.materialize(Path(plan.source_cwd), plan.checkpoint, work)
        except BaseException:
            # The make's own failure is what the fork fails with; a half-made tree that will
            # not go now is removed with the failed fork's tree (retried while it stays).
            with contextlib.suppress(OSError):
                self.remove_partial(plan)
            raise
        # A crash from here on leaves a whole tree under `.partial-` or at `path`.
        hit("host.workspace.after_materialize")
        os.rename(work, top)
        if plan.in_repository:
            # The worktree's admin entry still names the temporary path.
            git.run(["worktree", "repair", str(top)], cwd=Path(str(plan.repo_root)))
        partial_parent.rmdir()
        hit("host.workspace.after_rename")
        return top

    def _worktree_into(self, git: Git, plan: TreePlan, work: Path) -> None:
        repo = Path(str(plan.repo_root))
        assert plan.branch is not None and plan.head_commit is not None
        # -B: a branch left by a crash before the rename belongs to this operation and has no
        # commits of its own (nothing ran in the tree); it is reset, never doubled.
        git.run(
            ["worktree", "add", "-q", "-B", plan.branch, str(work), plan.head_commit],
            cwd=repo,
        )
        rel = os.path.relpath(plan.child_cwd, plan.path)
        target = work if rel == "." else work / rel
        target.mkdir(parents=True, exist_ok=True)
        self._apply_checkpoint(git, plan, work, target)

    def _apply_checkpoint(self, git: Git, plan: TreePlan, work: Path, target: Path) -> None:
        """Make every path the checkpoint captured equal to it under `target` (`work`'s
        directory of the source cwd), and remove the HEAD files the checkpoint would have
        captured but does not hold (deleted in the source); what it never captures (ignored,
        excluded, too large) stays as the HEAD commit has it. Only the paths whose blob or
        mode differ from HEAD's are written (blob ids are content hashes, the same in both
        object stores): the cost of a checkout of the changes, not of the whole tree again."""
        shadow_repo = self.shadow.repo_dir(Path(plan.source_cwd))
        index = target.parent / f".{target.name}.agenthost-index"
        env = {
            "GIT_DIR": str(shadow_repo),
            "GIT_WORK_TREE": str(target),
            "GIT_INDEX_FILE": str(index),
        }
        rel = os.path.relpath(target, work)
        prefix = "" if rel == "." else rel.rstrip("/") + "/"
        head = {
            path[len(prefix) :]: entry
            for path, entry in _staged(git.run(["ls-files", "-s", "-z"], cwd=work).stdout)
            if path.startswith(prefix)
        }
        wanted = _tree_entries(
            git.run(["ls-tree", "-r", "-z", "--full-tree", plan.checkpoint], env=env).stdout
        )
        differ = sorted(p for p, entry in wanted.items() if head.get(p) != entry)
        missing = sorted(p for p in head if p not in wanted and p not in plan.too_large)
        try:
            if differ:
                git.run(["read-tree", plan.checkpoint], env=env, cwd=target)
                # Replace, never write through: a symlink or file in the way is removed first.
                for path_rel in differ:
                    unlink_in(target, path_rel)
                git.run(
                    ["checkout-index", "-f", "-z", "--stdin"],
                    env=env,
                    cwd=target,
                    input_bytes=_nul(differ),
                    timeout_s=self.timeout_s,
                )
            if missing:
                ignored = set(
                    _split_nul(
                        git.run(
                            ["check-ignore", "-z", "--no-index", "--stdin"],
                            env=env,
                            cwd=target,
                            input_bytes=_nul(missing),
                            check=False,
                        ).stdout
                    )
                )
                for path_rel in missing:
                    if path_rel in ignored:
                        continue  # never captured: HEAD's version stays
                    unlink_in(target, path_rel)
        finally:
            index.unlink(missing_ok=True)

    # -- finding ---------------------------------------------------------------------------

    def exists(self, plan: TreePlan) -> bool:
        """The plan's tree is in place (a renamed tree is whole: it is only ever renamed in
        once complete)."""
        top = Path(plan.path)
        return top.is_dir() and not top.is_symlink()

    def branch_exists(self, plan: TreePlan) -> bool:
        if not plan.in_repository or plan.branch is None:
            return False
        done = self._git().run(
            ["rev-parse", "--verify", "-q", f"refs/heads/{plan.branch}"],
            cwd=Path(str(plan.repo_root)),
            check=False,
        )
        return done.returncode == 0

    def partial_exists(self, plan: TreePlan) -> bool:
        return plan.partial.exists()

    # -- removing --------------------------------------------------------------------------

    def remove_partial(self, plan: TreePlan) -> None:
        """Remove a half-made tree of `plan` (and its worktree registration). Raises `OSError`
        when it is still there after (a file in it nothing can unlink): the caller's removal
        failed and is tried again, never recorded done over a tree left on disk."""
        partial = plan.partial
        if not partial.exists():
            return
        # Found before the half-made tree goes: it may be the only way left to the repository.
        home = _git_home(self._git(), plan) if plan.in_repository else None
        if home is not None:
            # A `worktree add` killed mid-checkout (past its bound, or with its daemon) leaves
            # its registration locked `initializing`, which `prune` never takes; `remove -f -f`
            # does (and says no more when the add got no further than the directory).
            work = partial / Path(plan.path).name
            self._git().run(
                ["worktree", "remove", "--force", "--force", str(work)], cwd=home, check=False
            )
        errors: list[str] = []
        shutil.rmtree(partial, onerror=lambda _fn, path, exc: errors.append(f"{path}: {exc[1]}"))
        if home is not None and home.is_dir():
            self._git().run(["worktree", "prune"], cwd=home, check=False)
        if os.path.lexists(partial):
            # A tree left on disk is never recorded removed (law 4): the removal fails, retried.
            why = errors[0] if errors else "still there"
            raise OSError(f"the half-made tree {partial} could not be removed: {why}")

    def remove(self, plan: TreePlan) -> None:
        """Remove the plan's tree, half-made or whole, and its branch when the branch has no
        commits of its own (still at the checkpoint's HEAD commit); idempotent.

        The repository's root may be gone by now (the source's own tree, a fork's worktree,
        removed with its Session while this fork failed): git is then run from the common git
        directory what is left of this tree names, and with nothing of it left, the plan has
        nothing git could still hold for it that this daemon can reach — the directories go,
        and the removal is done (a failed fork's tree is never retried forever)."""
        top = Path(plan.path)
        home = _git_home(self._git(), plan) if plan.in_repository else None
        self.remove_partial(plan)
        if plan.in_repository and home is None and top.exists():
            shutil.rmtree(top)
        elif plan.in_repository and home is not None:
            git = self._git()
            repo = home
            _drop_worktree(git, repo, top)
            assert plan.branch is not None
            ref = f"refs/heads/{plan.branch}"
            at = git.run(["rev-parse", "--verify", "-q", ref], cwd=repo, check=False)
            tip = at.stdout.decode().strip()
            if at.returncode == 0 and tip == plan.head_commit:
                git.run(["update-ref", "-d", ref, tip], cwd=repo, check=False)
        elif top.exists():
            shutil.rmtree(top)
        _drop_beside(plan)

    # -- a child's tree at its Session's delete ---------------------------------------------

    def unsaved(self, plan: TreePlan, newest: str | None) -> Unsaved:
        """What removing the plan's tree would lose. Captures the tree now (into the shadow
        store, so the state is recorded whatever follows) and compares it with `newest`, the
        Session's newest checkpoint (the fork's own when it has run no Turn); counts the
        branch's commits that no other branch holds."""
        top = Path(plan.path)
        if not top.is_dir():
            return Unsaved(uncaptured=False, commits=0, captured=None)
        cwd = Path(plan.child_cwd)
        now = self.shadow.capture(cwd if cwd.is_dir() else top)
        tree = now.tree if isinstance(now, Checkpoint) else None
        # Unreadable now (git failed, timed out): nothing proves the files are safe.
        uncaptured = tree is None or tree != (newest or plan.checkpoint)
        return Unsaved(uncaptured=uncaptured, commits=self.own_commits(plan), captured=tree)

    def own_commits(self, plan: TreePlan) -> int:
        """Commits on the plan's branch that no other branch of the repository holds."""
        if not plan.in_repository or plan.branch is None:
            return 0
        ref = f"refs/heads/{plan.branch}"
        done = self._git().run(
            # `--exclude` before `--branches` takes the name without `refs/heads/`.
            ["rev-list", "--count", ref, "--not", f"--exclude={plan.branch}", "--branches"],
            cwd=Path(str(plan.repo_root)),
            check=False,
        )
        out = done.stdout.decode().strip()
        return int(out) if done.returncode == 0 and out.isdigit() else 0

    def remove_child(self, plan: TreePlan) -> bool:
        """Remove a deleted child's tree (its uncommitted files go: the caller checked or was
        forced) and its branch unless that holds commits no other branch has (those are kept:
        a branch costs nothing and a commit is never lost by a delete). True when the branch
        is kept; idempotent.

        The repository's root may be gone by now (a person removed the project folder while
        the tree was left `removing`): as `remove` does, git then runs from the common git
        directory what is left of the tree names, and the branch is kept (its commits are not
        counted there); with nothing of the repository left, the directories go. Before, every
        git ran in the gone root and failed, so such a tree was retried for ever."""
        home = _git_home(self._git(), plan) if plan.in_repository else None
        self.remove_partial(plan)
        top = Path(plan.path)
        kept = False
        root = Path(str(plan.repo_root))
        if plan.in_repository and home is not None and home != root:
            _drop_worktree(self._git(), home, top)
            kept = True
        elif plan.in_repository and home is None:
            if top.exists():
                shutil.rmtree(top)
        elif plan.in_repository and plan.branch is not None:
            git = self._git()
            repo = root
            _drop_worktree(git, repo, top)
            ref = f"refs/heads/{plan.branch}"
            at = git.run(["rev-parse", "--verify", "-q", ref], cwd=repo, check=False)
            if at.returncode == 0:
                if self.own_commits(plan) > 0:
                    kept = True
                else:
                    git.run(
                        ["update-ref", "-d", ref, at.stdout.decode().strip()],
                        cwd=repo,
                        check=False,
                    )
        elif top.exists():
            shutil.rmtree(top)
        _drop_beside(plan)
        return kept


@dataclass(frozen=True, slots=True)
class Unsaved:
    """What removing a child's tree would lose: files its newest checkpoint does not hold,
    commits no other branch holds; `captured` the tree's state now (None: unreadable)."""

    uncaptured: bool
    commits: int
    captured: str | None

    @property
    def clean(self) -> bool:
        return not self.uncaptured and self.commits == 0


def _drop_beside(plan: TreePlan) -> None:
    """Remove the `<repository>.agenthost` directory the host made beside the repository (or
    the directory outside one) once it holds no tree — never a configured `worktrees_dir`,
    which is the person's (found emptied, it stays, as they made it)."""
    base = plan.repo_root if plan.in_repository else plan.source_cwd
    parent = Path(plan.path).parent
    if str(parent) == f"{base}.agenthost":
        with contextlib.suppress(OSError):
            parent.rmdir()


def _drop_worktree(git: Git, repo: Path, top: Path) -> None:
    """`git worktree remove` of `top` (forced: the caller decided), then its registration."""
    if top.exists():
        done = git.run(
            ["worktree", "remove", "--force", "--force", str(top)], cwd=repo, check=False
        )
        if done.returncode != 0 and top.exists():
            shutil.rmtree(top)
    git.run(["worktree", "prune"], cwd=repo, check=False)


def _git_home(git: Git, plan: TreePlan) -> Path | None:
    """Where to run git for the plan's repository: its root while it stands, else the common
    git directory (absolute) named by what is left of the plan's tree, whole or half-made; None
    when neither is left."""
    root = Path(str(plan.repo_root))
    if root.is_dir():
        return root
    # The tree itself, whole or half-made (`.partial-<short>/<short>`): only its own `.git`
    # names the repository — asked in a directory that is no worktree top (the `.partial-`
    # one above the tree), git would find whatever repository encloses it.
    for left in (Path(plan.path), plan.partial / Path(plan.path).name):
        if not left.is_dir():
            continue
        done = git.run(["rev-parse", "--show-toplevel", "--git-common-dir"], cwd=left, check=False)
        lines = done.stdout.decode(errors="surrogateescape").splitlines()
        if done.returncode != 0 or len(lines) < 2:
            continue
        if os.path.realpath(lines[0]) != os.path.realpath(left):
            continue  # another repository's directory: the tree's `.git` is gone
        common = (left / lines[1]).resolve()
        if common.is_dir():
            return common
    return None


class ForkTrees:
    """The fork saga's view: plans, makes and removes trees as the JSON its operation row
    keeps (`TreePlan.to_json`), under the configured `worktrees_dir` (None: beside the
    repository)."""

    def __init__(self, shadow: ShadowStore, worktrees_dir: str | None = None) -> None:
        self.trees = Worktrees(shadow)
        self.worktrees_dir = worktrees_dir

    def plan(self, checkpoint: Mapping[str, Any], operation_id: str, title: str) -> dict[str, Any]:
        return plan_tree(
            checkpoint, operation_id=operation_id, title=title, worktrees_dir=self.worktrees_dir
        ).to_json()

    def make(self, plan: Mapping[str, Any], hit: Hit = _no_hit) -> str:
        return str(self.trees.make(TreePlan.from_json(plan), hit))

    def remove(self, plan: Mapping[str, Any]) -> None:
        self.trees.remove(TreePlan.from_json(plan))


def _staged(out: bytes) -> list[tuple[str, tuple[str, str]]]:
    """`ls-files -s -z`: (path, (mode, blob)) of each index entry (stage 0 only)."""
    entries = []
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, blob, stage = meta.decode().split(" ")
        if stage == "0":
            entries.append((os.fsdecode(path), (mode, blob)))
    return entries


def _tree_entries(out: bytes) -> dict[str, tuple[str, str]]:
    """`ls-tree -r -z`: path → (mode, blob) of each file and symlink (a nested repository's
    gitlink has no files to write)."""
    entries = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, blob = meta.decode().split(" ")
        if kind == "blob":
            entries[os.fsdecode(path)] = (mode, blob)
    return entries


__all__ = [
    "ForkTrees",
    "GitUnavailable",
    "TreePlan",
    "TreeRefused",
    "Unsaved",
    "Worktrees",
    "plan_tree",
    "short_id",
    "slug",
]
