"""A person's git repository made by a test for worktree forks, with every kind of file a checkpoint
meets, and the readings that prove a worktree fork left it alone (law 10)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

BINARY = bytes(range(256)) * 4
BIG = b"B" * 2048
"""Over the 1 KiB size limit the tests give their shadow stores."""


def git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "u",
        "GIT_AUTHOR_EMAIL": "u@x",
        "GIT_COMMITTER_NAME": "u",
        "GIT_COMMITTER_EMAIL": "u@x",
        # `git status` would otherwise refresh the index it reads (the test's own write).
        "GIT_OPTIONAL_LOCKS": "0",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_repo(root: Path) -> Path:
    """Committed files (a .gitignore, a binary file, a symlink, a file over the size limit),
    a stash, then uncommitted work: modified, untracked, deleted, ignored and excluded files,
    and the big file changed (never captured: a worktree keeps HEAD's version)."""
    r = root
    r.mkdir(parents=True)
    git(r, "init", "-q", "-b", "main")
    (r / ".gitignore").write_text("ignored/\n*.log\n")
    (r / "src").mkdir()
    (r / "src" / "app.py").write_text("print('v1')\n")
    (r / "doomed.txt").write_text("to be deleted\n")
    (r / "logo.bin").write_bytes(BINARY)
    (r / "link").symlink_to("src/app.py")
    (r / "big.dat").write_bytes(BIG)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "first")
    (r / "src" / "app.py").write_text("print('stashed')\n")
    git(r, "stash", "-q")
    (r / "src" / "app.py").write_text("print('v2')\n")
    (r / "notes.md").write_text("untracked\n")
    (r / "doomed.txt").unlink()
    (r / "ignored").mkdir()
    (r / "ignored" / "cache.dat").write_text("not captured\n")
    (r / "run.log").write_text("not captured\n")
    (r / "node_modules").mkdir()
    (r / "node_modules" / "dep.js").write_text("excluded by default\n")
    (r / ".env").write_text("SECRET=1\n")
    (r / "big.dat").write_bytes(BIG + b"changed")
    (r / "new.bin").write_bytes(BINARY[::-1])
    return r


def tree_files(root: Path) -> dict[str, bytes | str]:
    """Every file and symlink under `root` (not `.git`): bytes, or `-> target` for links."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        here = Path(dirpath)
        links = [d for d in dirs if (here / d).is_symlink()]
        for name in files + links:
            if name == ".git" and here == root:
                continue
            path = here / name
            rel = str(path.relative_to(root))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes()
    return out


def repo_state(r: Path, *, except_branch_prefix: str | None = None) -> dict[str, str]:
    """What of the person's repository a checkpoint or a worktree fork must never change
    (refs of `except_branch_prefix` are left out: the fork's own branch)."""
    gitdir = r / ".git"
    refs = git(r, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
    if except_branch_prefix is not None:
        refs = [x for x in refs if not x.startswith(f"refs/heads/{except_branch_prefix}")]
    return {
        "HEAD": (gitdir / "HEAD").read_text(),
        "head_commit": git(r, "rev-parse", "HEAD"),
        "index": hashlib.sha256((gitdir / "index").read_bytes()).hexdigest(),
        "refs": "\n".join(refs),
        "config": (gitdir / "config").read_text(),
        "stash": git(r, "stash", "list"),
        "stash_ref": git(r, "rev-parse", "refs/stash"),
        "status": git(r, "status", "--porcelain", "--ignored"),
        "files": hashlib.sha256(repr(sorted(tree_files(r).items())).encode()).hexdigest(),
    }


def make_unremovable(path: Path) -> Callable[[], None]:
    """Make a file nothing of ours can unlink, so removing its tree fails for real (git and
    `shutil.rmtree` alike); returns the undo. As root (which ignores permissions) the file is
    made immutable (`chattr +i`; skipped where the filesystem has no such flag); otherwise its
    directory is made read-only."""
    import pytest

    if os.geteuid() != 0:
        parent = path.parent
        mode = parent.stat().st_mode & 0o7777
        parent.chmod(0o555)
        return lambda: parent.chmod(mode)
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot make {path} immutable: {done.stderr.decode().strip()}")
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)
