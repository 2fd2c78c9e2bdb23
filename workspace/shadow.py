"""The shadow object store of workspace checkpoints: one bare git repository per workspace
directory under the agenthost home (`checkpoints/<key>/`), with its own persistent index, so a
checkpoint of a large tree with few changes costs what `git status` costs. It reads the
working tree and writes only under the home; nothing of the person's repository (index, HEAD,
refs, config, hooks) is written or run (law 10).

A checkpoint is the git tree of what git would see in that directory — the person's
`.gitignore` files respected — minus a default exclude list (`DEFAULT_EXCLUDES`, configurable)
and minus files over a size limit, which are listed instead. Checkpoints are kept by refs to
their trees: one a tree per Session (`refs/agenthost/<session>/+<commit>`, `keep_commit`: a
Turn on an unchanged folder names a tree whose ref is already there, and writes nothing), or,
as stores written before kept them and a restore's undo still is, one a Turn
(`refs/agenthost/<session>/<turn>/<before|after>`); `drop` removes a Session's refs and `gc`
collects what no ref (nor the shadow index's newest state) keeps.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from workspace.git import Git, GitUnavailable, LeftGits, failed

DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git/",
    "node_modules/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "build/",
    "dist/",
    "target/",
    ".env",
    ".env.*",
)
"""What a checkpoint never captures (gitignore syntax): VCS data, dependency and build
output, virtualenvs, and `.env*` files (secrets)."""

DEFAULT_SIZE_LIMIT = 10 * 1024 * 1024
REF_ROOT = "refs/agenthost"
STAT_WALK_LIMIT = 5_000
"""Entries (directories and files) a directory's stat snapshot holds at most: a larger tree is
left to `ls-files` alone (walking it in Python would cost more than the process saves)."""
SNAPSHOT_BACKOFF_MAX = 16
"""At most this many captures in a row skip the walk of a directory whose last walks were
wasted (it changed before the snapshot was used, or cannot have one). A walk that found an
entry too young to take is tried again once that entry is old enough, not counted."""
LONG_TIMEOUT_S = 120.0
"""The default bound of the git calls that write a whole tree or store (`gc`, `materialize`'s
and `restore`'s `checkout-index`; `[workspace] long_timeout_s`), where a capture's is
`timeout_s`."""
RACY_MARGIN_NS = 2 * 10**9
"""A stat snapshot holds no entry changed (ctime or mtime) this close before the capture's
`ls-files` began: a later change within the filesystem clock's granularity (or a clock a
little behind this one) could leave such an entry's stat as it was."""


PACK_LOOSE = 6_700
"""A store with more loose objects than this is packed by the sweep (git's `gc.auto`)."""

ADD_TRIES = 3
"""A capture's listing and `add`, tried again this many times in all while a file the listing
named is gone by the `add` (a folder written while it is captured)."""
_VANISHED = b"did not match any files"
# git's `add` finding a file it had listed gone when it reads it (LC_ALL=C): at its `lstat`,
# or after it, at the `open` (or `readlink`, a symlink) that hashes the file's content.
_STAT_GONE = re.compile(
    rb"^fatal: unable to stat '(.+)': (?:No such file or directory|Not a directory)$"
)
_OPEN_GONE = re.compile(
    rb'^error: (?:open|readlink)\("(.+)"\): (?:No such file or directory|Not a directory)$'
)


def _vanished(cwd: Path, stderr: bytes) -> bool:
    """Whether a failed `add` in `cwd` failed only on files gone since the listing: its
    pathspec matched nothing (gone before the add began), or git could not `lstat` a file it
    had found, or open a file its `lstat` had found (gone while it ran), and each such file is
    indeed gone now — anything else (a file unreadable, one still there, a full disk) is a
    real failure."""
    if _VANISHED in stderr:
        return True
    named = [
        match.group(1)
        for line in stderr.splitlines()
        if (match := _STAT_GONE.match(line) or _OPEN_GONE.match(line)) is not None
    ]
    # A file that failed otherwise beside them fails the next try (at most ADD_TRIES).
    return bool(named) and not any(
        os.path.lexists(os.path.join(cwd, os.fsdecode(name))) for name in named
    )


GONE_INFIX = ".gone-"
"""A shadow repository being removed (`ShadowStore.discard`) is renamed `.<key>.gone-<id>`."""
INIT_PREFIX = ".init-"
"""A shadow repository is made as `.init-<pid>-<id>` (the pid of the process making it), then
renamed into place whole (`ShadowStore._repo`)."""

# The `.init-` directories this process is making now (`_creating`): what
# `ShadowStore.clear_leftovers` must never remove.
_CREATING: set[Path] = set()
_CREATING_GUARD = threading.Lock()


@contextlib.contextmanager
def _creating(tmp: Path) -> Iterator[None]:
    """`tmp` is being made by this process while the block runs (entered before it exists,
    left once it is renamed or removed)."""
    with _CREATING_GUARD:
        _CREATING.add(tmp)
    try:
        yield
    finally:
        with _CREATING_GUARD:
            _CREATING.discard(tmp)


def _init_left(path: Path) -> bool:
    """Whether the `.init-` directory `path` is a leftover: made by a process that is gone (a
    kill during a repository's creation), or by this one and not being made now. One made by
    another live process is kept (only the daemon holding the home makes them; a pid used
    again keeps a leftover only until that process ends); a name with no pid is an older
    build's, gone."""
    pid_text = path.name[len(INIT_PREFIX) :].partition("-")[0]
    if not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if pid == os.getpid():
        with _CREATING_GUARD:
            return path not in _CREATING
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False


class ChangeKind(StrEnum):
    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"


_KIND = {"A": ChangeKind.ADDED, "M": ChangeKind.MODIFIED, "D": ChangeKind.DELETED}


@dataclass(frozen=True, slots=True)
class FileChange:
    path: str
    kind: ChangeKind


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The working tree of `cwd` at one moment: its git `tree` in the shadow store (`commit`
    names the same object: what refs keep and reads take), the HEAD commit of the repository
    `cwd` lies in (None outside one), and the files left out for their size."""

    commit: str
    tree: str
    head_commit: str | None
    repo_root: str | None
    too_large: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unavailable:
    """No checkpoint: `reason` is one word (`git_missing`, `cwd_missing`, `timed_out`,
    `git_failed`), `message` says it in words."""

    reason: str
    message: str


def _missing(cwd: Path) -> Unavailable:
    return Unavailable("cwd_missing", f"the working directory {cwd} does not exist")


def unlink_in(top: Path, rel: str) -> None:
    """Remove the file or symlink at `rel` in the tree `top` (a fork's tree, a restored folder),
    only if it is in the tree: every directory on its way is a real directory (`lstat`), never
    a symlink, which may lead out of the tree — to the person's own folder, whose files are
    never touched through it. A path with a symlink on its way names nothing of the tree
    (`checkout-index -f` replaces that symlink by a directory itself)."""
    path = top
    parts = rel.split("/")
    for part in parts[:-1]:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return
        except FileNotFoundError:
            return
    path = path / parts[-1]
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            path.unlink()


def _prune_empty(directory: Path, stop: Path) -> None:
    """Remove now-empty directories from `directory` up to (not including) `stop`."""
    while directory != stop and stop in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def _key(cwd: Path) -> str:
    return _real_key(os.path.realpath(cwd))


def _real_key(real: str) -> str:
    """`_key` of a path already resolved (`os.path.realpath`)."""
    return hashlib.sha256(os.fsencode(real)).hexdigest()[:20]


def _signature(path: str | Path) -> tuple[int, int, int, int] | None:
    """What tells a file written again from the one seen before (device, inode, size,
    modification time in ns); None when it is not a regular file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _make_parent(path: str) -> None:
    """The directory `path` goes in, made if missing (one `mkdir` when its parent is
    there, as for a Turn's own ref directory under its Session's)."""
    parent = os.path.dirname(path)
    try:
        os.mkdir(parent)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(parent, exist_ok=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _nul(items: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(i) + b"\0" for i in items)


def _split_nul(data: bytes) -> list[str]:
    return [os.fsdecode(p) for p in data.split(b"\0") if p]


_HEX = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
_ASK = (False, None)
"""`_read_head`'s answer when the ref files cannot say."""
# Refs git keeps per worktree (in the worktree's own git directory, not the common one).
_PER_WORKTREE = ("refs/bisect/", "refs/worktree/", "refs/rewritten/")


def _index_key(index: Path) -> bytes | None:
    """What identifies the shadow index's content: its size and the checksum git writes at
    its end (a hash of every byte before it), so any change to the index changes the key
    whatever the file's timestamps say; empty for no index (nothing tracked: the empty
    tree). None when there is no checksum to trust (an unreadable index, or one written with
    `index.skipHash`)."""
    # Four system calls (a Python file object would add a `fstat`, an `ioctl` and two
    # `lseek`s: two captures a Turn read this; ckpt).
    try:
        fd = os.open(index, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < 32:
            return None
        trailer = os.pread(fd, 20, size - 20)
    except OSError:
        return None
    finally:
        os.close(fd)
    if trailer == bytes(20):
        return None
    return size.to_bytes(8, "big") + trailer


def _read_small(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("utf-8", "surrogateescape")
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class _Location:
    """The repository holding `cwd` as git discovered it (`root` None: none does), and the
    `.git` entries of `cwd` and every directory above it at that time: while they are the
    same, git would discover the same repository."""

    probe: tuple[object, ...]
    root: str | None
    git_dir: str | None
    common_dir: str | None


def _discovery_probe(real: str) -> tuple[object, ...]:
    """The `.git` entry (absent, a directory and its inode, or a `gitdir:` file's text) of
    the resolved directory `real` and each directory above it: what git's repository
    discovery looks at."""
    out: list[object] = []
    d = real
    while True:
        entry = os.path.join(d, ".git")
        try:
            st = os.lstat(entry)
        except OSError:
            out.append(None)
        else:
            if stat.S_ISDIR(st.st_mode):
                out.append((st.st_dev, st.st_ino))
            else:
                out.append(_read_small(Path(entry)))
        parent = os.path.dirname(d)
        if parent == d:
            return tuple(out)
        d = parent


_StatKey = tuple[int, int, int, int, int] | None


def _stat_key(path: str) -> _StatKey:
    """What any change of an entry changes: inode, mode, size, mtime and ctime (the kernel
    sets ctime on every write, rename, link or unlink in it, and nobody can set it back);
    None when it is absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class _StatSnapshot:
    """A directory as a clean capture left it: every entry `ls-files` could have to look at
    (each directory — a file added, removed or renamed in it changes its ctime — and each
    file), with its `_stat_key`, and the tree captured with the key of the shadow index it
    is written in. While every key is the same, the tree is the directory's."""

    index_key: bytes
    tree: str
    paths: tuple[str, ...]
    keys: tuple[_StatKey, ...]
    exclude: str = ""
    """The shadow repository's exclude file, one of `paths`: while the snapshot answers, that
    file is the one `_repo` checked (its `lstat` key is stricter than `_repo`'s signature)."""


def _walk_skips(excludes: Sequence[str]) -> frozenset[str]:
    """The directory names the exclude patterns leave out wherever they are (`name/`, no
    slash or wildcard within): git never looks inside an excluded directory, so neither does
    a stat snapshot. `.git` is never content."""
    names = {".git"}
    for pattern in excludes:
        name = pattern[:-1] if pattern.endswith("/") else ""
        if name and not any(c in name for c in "/*?[\\!#"):
            names.add(name)
    return frozenset(names)


def _negates(gitignore: str, skipped: frozenset[str]) -> bool:
    """Whether a `.gitignore` may re-include a directory the walk skips (`skipped`: their
    names): a negation (a line beginning `!`) with a wildcard, or naming one of them anywhere
    in its text. git never re-includes a path below an excluded directory, so only a
    negation that can match such a directory itself makes the walk's skipping wrong;
    `!.gitkeep` cannot."""
    try:
        with open(gitignore, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return True
    names = [os.fsencode(n) for n in skipped]
    for line in lines:
        if not line.startswith(b"!"):
            continue
        if any(c in line for c in (b"*", b"?", b"[", b"\\")) or any(n in line for n in names):
            return True
    return False


def _stat_walk(
    real: str, skips: frozenset[str], skip_dirs: frozenset[str], racy_from_ns: int
) -> tuple[tuple[str, ...], tuple[_StatKey, ...]] | bool | int:
    """The entries of `real` (resolved) a snapshot holds, with their keys; True when there
    are more than `STAT_WALK_LIMIT`; an entry's newer timestamp (ns, an int) when it changed
    at `racy_from_ns` or later; False when a `.gitignore` may re-include a skipped directory
    (`_negates`), a repository lies inside, or the walk failed."""
    paths: list[str] = []
    keys: list[_StatKey] = []
    skip_names = frozenset(os.path.basename(p) for p in skip_dirs)
    stack = [real]
    try:
        while stack:
            d = stack.pop()
            st = os.lstat(d)
            if st.st_ctime_ns >= racy_from_ns or st.st_mtime_ns >= racy_from_ns:
                return max(st.st_ctime_ns, st.st_mtime_ns)
            paths.append(d)
            keys.append((st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            with os.scandir(d) as entries:
                for e in entries:
                    if e.name == ".git" and d != real:
                        # A repository inside: git captures its HEAD (a gitlink), which
                        # changes with no stat of the entries walked here.
                        return False
                    if e.is_dir(follow_symlinks=False):
                        if e.name not in skips and e.path not in skip_dirs:
                            stack.append(e.path)
                        continue
                    st = e.stat(follow_symlinks=False)
                    if st.st_ctime_ns >= racy_from_ns or st.st_mtime_ns >= racy_from_ns:
                        return max(st.st_ctime_ns, st.st_mtime_ns)
                    if e.name == ".gitignore" and _negates(e.path, skips | skip_names):
                        return False
                    paths.append(e.path)
                    keys.append((st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            if len(paths) > STAT_WALK_LIMIT:
                return True
    except OSError:
        return False
    return tuple(paths), tuple(keys)


class ShadowStore:
    """Checkpoints of any number of workspace directories under `root`."""

    def __init__(
        self,
        root: Path,
        *,
        excludes: Sequence[str] = DEFAULT_EXCLUDES,
        size_limit: int = DEFAULT_SIZE_LIMIT,
        timeout_s: float = 5.0,
        long_timeout_s: float = LONG_TIMEOUT_S,
        left_gits: LeftGits | None = None,
        private: Sequence[Path] = (),
    ) -> None:
        self.root = root
        # Folders no checkpoint captures wherever a captured directory holds them: this
        # store's own, and the daemon's home it lies in (its store, WAL, runtimes, logs).
        self._private = tuple(dict.fromkeys(os.path.realpath(p) for p in (root, *private)))
        # A killed daemon's gits that outlived their kill at start: their lock files stay.
        self.left_gits = left_gits
        self.excludes = tuple(excludes)
        self.size_limit = size_limit
        self.timeout_s = timeout_s
        self.long_timeout_s = long_timeout_s
        # Per shadow repository: the tree its index last wrote, keyed by the index's content
        # (`_index_key`); per working directory: where its repository lies.
        self._trees: dict[Path, tuple[bytes, str]] = {}
        self._locations: dict[str, _Location] = {}
        # The git found on PATH (looked for again only while none is, or once it failed to
        # start); per resolved working directory: its shadow repository and the signature of
        # the exclude file last checked there (`_repo`).
        self._git_found: Git | None = None
        self._repos: dict[str, tuple[Path, tuple[int, int, int, int], tuple[str, ...], str]] = {}
        self._repo_locks: dict[Path, threading.Lock] = {}
        self._guard = threading.Lock()
        # Per shadow repository: the directory as its last clean capture left it (`_snapshot`);
        # a directory too large to walk is remembered as such.
        self._snapshots: dict[Path, _StatSnapshot] = {}
        self._too_big: set[Path] = set()
        # Repositories whose exclude file this store rewrote: their next capture drops what
        # the new rules ignore from the shadow index.
        self._rules_changed: set[Path] = set()
        # Per shadow repository: how many captures skip the walk after a wasted one (doubled
        # by each wasted walk, reset by a snapshot used), and how many are still to skip.
        self._backoff: dict[Path, int] = {}
        self._skip_walks: dict[Path, int] = {}
        # Per shadow repository: when (ns) an entry the last walk found too young is old
        # enough for a capture begun then; no walk before.
        self._young_until: dict[Path, int] = {}
        # Per shadow repository: whether its refs are loose files (`_loose_refs`).
        self._loose: dict[Path, bool] = {}
        # Per shadow repository: the names under `refs/agenthost/` it holds, read from the
        # disk at its first `keep_commit` and kept up to date by this store's own writes and
        # drops (nothing else writes there: the daemon holds its home).
        self._named: dict[Path, set[str]] = {}
        self.racy_margin_ns = RACY_MARGIN_NS

    # -- plumbing --------------------------------------------------------------------------

    def _git(self) -> Git:
        """The git to run: found on PATH once (a capture runs several), and looked for again
        while there is none or after it could not be started (`_run_git`)."""
        git = self._git_found
        if git is None:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            git = self._git_found = Git.find(self.root, self.timeout_s)
        return git

    def repo_dir(self, cwd: Path) -> Path:
        return self.root / _key(cwd)

    def _repo(self, git: Git, cwd: Path, real: str | None = None) -> Path:
        """`cwd`'s shadow repository, made if missing, with its exclude file as this store's
        settings write it. `real`: `cwd` already resolved. Once checked, a directory's
        repository is taken on the word of one `stat` of that exclude file: the same file
        (device, inode, size, mtime) holds what was checked; a repository removed or
        made again, or an exclude file changed by anyone, fails the comparison and is
        checked (and mended) in full again, as it is when this store's excludes changed."""
        real = os.path.realpath(cwd) if real is None else real
        known = self._repos.get(real)
        if known is not None and known[2] == self.excludes and _signature(known[3]) == known[1]:
            return known[0]
        repo = self.root / _real_key(real)
        if not (repo / "HEAD").is_file():
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.root / f"{INIT_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
            with _creating(tmp):
                try:
                    git.run(["init", "-q", "--bare", str(tmp)])
                    (tmp / "agenthost-workdir").write_text(real + "\n")
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)  # a failed (or timed-out) init
                    raise
                try:
                    os.rename(tmp, repo)
                except OSError:
                    shutil.rmtree(tmp, ignore_errors=True)  # another capture made it first
        exclude = repo / "info" / "exclude"
        patterns = list(self.excludes)
        for private in self._private:
            inside = os.path.relpath(private, real)
            if inside != "." and not inside.startswith(".."):
                patterns.append(f"/{inside}/")  # never the checkpoints, nor the daemon's home
        wanted = "\n".join(patterns) + "\n"
        if not exclude.is_file() or exclude.read_text() != wanted:
            if exclude.is_file():  # changed rules: a new repository's index holds nothing
                with self._guard:
                    self._rules_changed.add(repo)
            exclude.parent.mkdir(exist_ok=True)
            exclude.write_text(wanted)
        signature = _signature(exclude)
        self._loose.pop(repo, None)
        self._named.pop(repo, None)
        if signature is not None:
            # The exclude file's path as a string, held: each later look `stat`s it and
            # builds no `Path` (two a Turn, each Turn's two looks: turnall).
            self._repos[real] = (repo, signature, self.excludes, str(exclude))
        return repo

    @staticmethod
    def _env(repo: Path, cwd: Path, index: Path | None = None) -> dict[str, str]:
        return {
            "GIT_DIR": str(repo),
            "GIT_WORK_TREE": str(cwd),
            "GIT_INDEX_FILE": str(index or repo / "index"),
        }

    def clear_stale_locks(self, cwd: Path) -> int:
        """Remove the lock files (and restore indexes) a killed process left in `cwd`'s shadow
        repository; git refuses to write past them. Only for a caller that knows nothing else
        works on that repository now (the daemon holds its home, and serialises each
        directory's work); returns how many were removed: none while a left git still alive
        works there (`left_git_in`), whose lock files they are."""
        return self._clear_locks(self.repo_dir(cwd))

    def left_git_in(self, cwd: Path) -> bool:
        """Whether a git a killed daemon left, still alive, may write in `cwd`'s shadow
        repository: its lock files are its own while it lives (`clear_stale_locks` keeps them,
        and git refuses to write past them: that folder's checkpoints are `unavailable`)."""
        return self.left_gits is not None and self.left_gits.holds(self.repo_dir(cwd))

    def _clear_locks(self, repo: Path) -> int:
        if self.left_gits is not None and self.left_gits.holds(repo):
            return 0
        try:
            top = os.listdir(repo)
        except OSError:
            return 0
        # `index.lock`, `packed-refs.lock` (and any other of the top: `config`, `HEAD`), a
        # restore's own index and its lock; a killed `gc`'s commit-graph locks; refs' locks.
        stale = [repo / n for n in top if n.endswith(".lock") or n.startswith("restore-")]
        info = repo / "objects" / "info"
        stale += [info / "commit-graph.lock", info / "commit-graphs" / "commit-graph-chain.lock"]
        refs = repo / "refs"
        if refs.is_dir():
            stale.extend(refs.rglob("*.lock"))
        removed = 0
        for path in stale:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
        return removed

    # -- capture ---------------------------------------------------------------------------

    def capture(self, cwd: Path, real: str | None = None) -> Checkpoint | Unavailable:
        """Record the working tree of `cwd` now; never raises for a missing git, directory or
        a slow tree (the answer is `Unavailable`). `real`: `cwd` already resolved
        (`os.path.realpath`), so it is not resolved again."""
        try:
            real = os.path.realpath(cwd) if real is None else real
            tree = self._snapshot_tree(real)
            if tree is not None:
                head, root = self._head_of(self._git(), cwd, real)
                return Checkpoint(tree, tree, head, root)
            # A directory this store knows is asked whether it is there only when its stat
            # snapshot cannot answer (`_capture_tree`): the snapshot's `lstat` of it says so.
            known = real in self._repos
            if not known and not cwd.is_dir():
                return _missing(cwd)
            git = self._git()
            repo = self._repo(git, cwd, real)
            with self._repo_lock(repo):
                try:
                    tree, too_large = self._capture_tree(git, repo, cwd, real, ask_dir=known)
                except GitUnavailable as exc:
                    if exc.stale_locks:
                        # Its git killed past the bound (or refused on a lock a killed one
                        # left): the next capture must not meet its `index.lock`.
                        self._clear_locks(repo)
                    raise
            head, root = self._head_of(git, cwd, real)
            return Checkpoint(tree, tree, head, root, tuple(sorted(too_large)))
        except GitUnavailable as exc:
            self._forget_git(exc)
            return Unavailable(exc.reason, str(exc))

    def _snapshot_tree(self, real: str) -> str | None:
        """The tree of the known directory `real` from its stat snapshot, when it answers,
        with no `_repo` look: the snapshot's keys hold the shadow repository's exclude file
        (inode, mode, size, mtime, ctime: any rewrite, removal or new repository changes
        them), so one `lstat` checks both (one `stat` a capture fewer). None: `capture`'s
        full way (`_repo`, then git or a walk)."""
        known = self._repos.get(real)
        if known is None or known[2] != self.excludes:
            return None
        repo = known[0]
        snap = self._snapshots.get(repo)
        if snap is None or snap.exclude != known[3]:
            return None
        with self._repo_lock(repo):
            return self._unchanged(repo, repo / "index")

    def capture_unchanged(self, cwd: Path, real: str, max_entries: int) -> Checkpoint | None:
        """`capture`'s answer when it takes no process and at most `max_entries` `lstat`s:
        the directory has a stat snapshot of that size or less, unchanged, its repository and
        the place of the repository it lies in are known, and HEAD reads from files. None:
        ask `capture` (git, or a longer walk). Never starts a process; leaves the store as
        `capture` would (a snapshot found changed is dropped). `real`: `cwd` resolved. The
        caller serialises the directory's work, as for `capture`."""
        known = self._repos.get(real)
        if self._git_found is None or known is None or known[2] != self.excludes:
            return None
        repo = known[0]
        snap = self._snapshots.get(repo)
        loc = self._locations.get(real)
        # The snapshot's keys hold the exclude file (`_snapshot_tree`): no `stat` of it here.
        if snap is None or len(snap.paths) > max_entries or loc is None or snap.exclude != known[3]:
            return None
        if loc.probe != _discovery_probe(real):
            return None
        lock = self._repo_lock(repo)
        if not lock.acquire(blocking=False):
            return None
        try:
            tree = self._unchanged(repo, repo / "index")
        finally:
            lock.release()
        if tree is None:
            return None
        if loc.root is None:
            return Checkpoint(tree, tree, None, None)
        readable, head = self._read_head(loc)
        if not readable:
            return None
        return Checkpoint(tree, tree, head, loc.root)

    def _forget_git(self, exc: GitUnavailable) -> None:
        """git could not be started: look for it on PATH again next time."""
        if exc.reason == "git_missing":
            self._git_found = None

    def forget(self, real: str) -> None:
        """Drop what this store keeps in memory for the directory `real` (resolved) and its
        shadow repository: the directory is gone (a removed worktree fork's tree). Only
        caches: a later capture of `real` finds each again. The caller holds the directory's
        lock, as every user of these entries does (`actors.checkpoints.DirectoryLocks`)."""
        with self._guard:
            known = self._repos.pop(real, None)
            repo = known[0] if known is not None else self.root / _real_key(real)
            self._locations.pop(real, None)
            self._repo_locks.pop(repo, None)
            self._trees.pop(repo, None)
            self._snapshots.pop(repo, None)
            self._too_big.discard(repo)
            self._rules_changed.discard(repo)
            self._backoff.pop(repo, None)
            self._skip_walks.pop(repo, None)
            self._young_until.pop(repo, None)
            self._loose.pop(repo, None)
            self._named.pop(repo, None)

    def _repo_lock(self, repo: Path) -> threading.Lock:
        with self._guard:
            return self._repo_locks.setdefault(repo, threading.Lock())

    def _unchanged(self, repo: Path, index: Path) -> str | None:
        """The tree of the directory's last clean capture when not one entry of its stat
        snapshot changed since and the shadow index is the one that tree is written in;
        None: ask git."""
        snap = self._snapshots.get(repo)
        if snap is None:
            return None
        if _index_key(index) != snap.index_key or [_stat_key(p) for p in snap.paths] != list(
            snap.keys
        ):
            del self._snapshots[repo]
            self._wasted(repo)
            return None
        self._backoff.pop(repo, None)
        return snap.tree

    def _wasted(self, repo: Path) -> None:
        """A walk of `repo`'s directory served no capture: skip the next ones (doubling)."""
        backoff = min(max(1, 2 * self._backoff.get(repo, 0)), SNAPSHOT_BACKOFF_MAX)
        self._backoff[repo] = backoff
        self._skip_walks[repo] = backoff

    def _snapshot(self, repo: Path, real: str, index: Path, tree: str, racy_from_ns: int) -> None:
        """Remember the directory as this capture found it (`_StatSnapshot`): walked after
        git read it, so only entries older than the read's start (less the racy margin) are
        taken on their stat; a younger one, like too many, leaves no snapshot."""
        self._snapshots.pop(repo, None)
        if repo in self._too_big:
            return
        if racy_from_ns + self.racy_margin_ns < self._young_until.get(repo, 0):
            return  # the entry the last walk found too young still is
        skip = self._skip_walks.get(repo, 0)
        if skip > 0:
            # The directory kept changing between captures: a walk would likely be wasted.
            self._skip_walks[repo] = skip - 1
            return
        key = _index_key(index)
        if key is None:
            return
        walked = _stat_walk(
            real, _walk_skips(self.excludes), frozenset(self._private), racy_from_ns
        )
        if walked is True:
            self._too_big.add(repo)
        if walked is False:
            self._wasted(repo)
        if isinstance(walked, bool):
            return
        if isinstance(walked, int):
            # An entry too young to take on its stat: walk again once it is old enough.
            self._young_until[repo] = walked + self.racy_margin_ns
            return
        paths, keys = walked
        # The shadow repository's exclude file and config: what else says what git ignores;
        # git's default excludes file under the private HOME too.
        extra = (
            str(repo / "info" / "exclude"),
            str(repo / "config"),
            str(self.root / "git" / "ignore"),
        )
        self._snapshots[repo] = _StatSnapshot(
            key, tree, paths + extra, keys + tuple(_stat_key(p) for p in extra), extra[0]
        )

    def _capture_tree(
        self, git: Git, repo: Path, cwd: Path, real: str | None = None, ask_dir: bool = False
    ) -> tuple[str, list[str]]:
        """`ask_dir`: whether `cwd` is a directory is not known yet (asked only here, where
        the snapshot did not answer)."""
        real = os.path.realpath(cwd) if real is None else real
        index = repo / "index"
        unchanged = self._unchanged(repo, index)
        if unchanged is not None:
            return unchanged, []
        if ask_dir and not cwd.is_dir():
            raise GitUnavailable("cwd_missing", _missing(cwd).message)
        env = self._env(repo, cwd)
        racy_from_ns = time.time_ns() - self.racy_margin_ns
        # Only what may have changed since the last checkpoint of this directory, in one
        # call as cheap as `git status`: tracked files whose stat differs from the shadow
        # index (deleted ones too; git's racy-index rule compares the content of a file
        # changed within the index's own timestamp) and untracked ones; the rest is in the
        # index as it is.
        for attempt in range(ADD_TRIES):
            candidates = _split_nul(
                git.run(
                    ["ls-files", "-z", "--modified", "--others", "--exclude-standard"],
                    env=env,
                    cwd=cwd,
                ).stdout
            )
            if not candidates:
                # Nothing differs from the index: the tree is the one it last wrote, if the
                # index is byte for byte the one that tree was written from.
                cached = self._trees.get(repo)
                key = _index_key(index)
                if cached is not None and key is not None and cached[0] == key:
                    self._snapshot(repo, real, index, cached[1], racy_from_ns)
                    return cached[1], []
            too_large = self._too_large(cwd, candidates)
            ignored = self._newly_ignored(git, repo, env, cwd, candidates)
            left_out = set(too_large) | set(ignored)
            keep = list(dict.fromkeys(p for p in candidates if p not in left_out))
            if too_large or ignored:
                git.run(
                    [
                        "rm",
                        "-q",
                        "--cached",
                        # The shadow index has no HEAD: without `-f` git refuses a file whose
                        # captured content differs from the file's (a file grown past the
                        # limit), and every capture of the folder failed while it stayed so.
                        "-f",
                        "--ignore-unmatch",
                        "--pathspec-from-file=-",
                        "--pathspec-file-nul",
                    ],
                    env=env,
                    cwd=cwd,
                    input_bytes=_nul([f":(literal){p}" for p in too_large + ignored]),
                )
            if keep:
                add = ["add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"]
                done = git.run(
                    add,
                    env=env,
                    cwd=cwd,
                    input_bytes=_nul([f":(literal){p}" for p in keep]),
                    check=False,
                )
                if done.returncode != 0:
                    # A file listed above and gone by now (a build's temp file, an editor's
                    # swap file) fails the add, the index untouched: list again, without it.
                    if attempt + 1 < ADD_TRIES and _vanished(cwd, done.stderr):
                        continue
                    raise failed(add, done)
            break
        self._trees.pop(repo, None)
        tree = git.out(["write-tree"], env=env, cwd=cwd)
        # Keyed after `write-tree`, which stores the tree in the index (rewriting it).
        key = _index_key(index)
        if key is not None:
            self._trees[repo] = (key, tree)
            if not too_large:
                self._snapshot(repo, real, index, tree, racy_from_ns)
        return tree, too_large

    def _newly_ignored(
        self, git: Git, repo: Path, env: Mapping[str, str], cwd: Path, candidates: Sequence[str]
    ) -> list[str]:
        """The files the shadow index holds that the ignore rules now ignore — asked only when
        those rules may have changed since the last capture: a `.gitignore` among the changed
        paths, or this store's excludes rewritten. The shadow index tracks what it captured,
        and git keeps capturing a tracked file whatever ignores it: a file ignored after its
        first capture stayed in every checkpoint, as no file ignored from the start does."""
        with self._guard:
            rewritten = repo in self._rules_changed
            self._rules_changed.discard(repo)
        if not rewritten and not any(
            p == ".gitignore" or p.endswith("/.gitignore") for p in candidates
        ):
            return []
        out = git.run(
            ["ls-files", "-z", "--cached", "--ignored", "--exclude-standard"], env=env, cwd=cwd
        ).stdout
        return _split_nul(out)

    def _too_large(self, cwd: Path, paths: Sequence[str]) -> list[str]:
        out = []
        for rel in paths:
            try:
                st = (cwd / rel).lstat()
            except OSError:
                continue  # deleted: `add -A` records that
            if stat.S_ISREG(st.st_mode) and st.st_size > self.size_limit:
                out.append(rel)
        return out

    def _head_of(
        self, git: Git, cwd: Path, real: str | None = None
    ) -> tuple[str | None, str | None]:
        """The HEAD commit and top of the repository `cwd` lies in, read only. Where the
        repository lies is asked of git once per directory (and again when a `.git` entry
        above it changes); HEAD and the ref it names are then read from their files (git's
        `files` ref format), exact whatever their timestamps; anything else is asked of git.
        `real`: `cwd` already resolved."""
        real = os.path.realpath(cwd) if real is None else real
        probe = _discovery_probe(real)
        loc = self._locations.get(real)
        if loc is None or loc.probe != probe:
            loc = self._locate(git, cwd, probe)
            self._locations[real] = loc
        if loc.root is None:
            return None, None
        known, head = self._read_head(loc)
        if not known:
            return self._rev_parse_head(git, cwd)
        return head, loc.root

    def _locate(self, git: Git, cwd: Path, probe: tuple[object, ...]) -> _Location:
        done = git.run(
            ["rev-parse", "--show-toplevel", "--absolute-git-dir", "--git-common-dir"],
            cwd=cwd,
            check=False,
        )
        lines = done.stdout.decode(errors="surrogateescape").splitlines()
        if done.returncode != 0 or len(lines) < 3 or not os.path.isabs(lines[0]):
            return _Location(probe, None, None, None)  # not in a work tree
        common = os.path.join(cwd, lines[2]) if not os.path.isabs(lines[2]) else lines[2]
        return _Location(probe, lines[0], lines[1], os.path.realpath(common))

    @staticmethod
    def _read_head(loc: _Location) -> tuple[bool, str | None]:
        """`(known, HEAD's commit)` from the files of a `files`-format repository: None for a
        branch with no commit yet; `known` False when these files cannot say (ask git)."""
        assert loc.git_dir is not None and loc.common_dir is not None
        common = Path(loc.common_dir)
        if (common / "reftable").exists():
            return _ASK
        head = _read_small(Path(loc.git_dir) / "HEAD")
        if head is None:
            return _ASK
        head = head.strip()
        if _HEX.fullmatch(head):
            return True, head
        if not head.startswith("ref: "):
            return _ASK
        ref = head[5:].strip()
        if not ref.startswith("refs/") or ref.startswith(_PER_WORKTREE) or ".." in ref:
            return _ASK
        loose = _read_small(common / ref)
        if loose is not None:
            loose = loose.strip()
            return (True, loose) if _HEX.fullmatch(loose) else _ASK
        if (common / ref).exists():
            return _ASK  # a directory, or unreadable: let git say
        try:
            packed = (common / "packed-refs").read_bytes()
        except FileNotFoundError:
            return True, None
        except OSError:
            return _ASK
        needle = b" " + os.fsencode(ref) + b"\n"
        at = packed.find(needle)
        while at != -1:
            start = packed.rfind(b"\n", 0, at) + 1
            sha = packed[start:at].decode("ascii", "replace")
            if _HEX.fullmatch(sha):
                return True, sha
            at = packed.find(needle, at + 1)
        return True, None  # a branch with no commit yet

    @staticmethod
    def _rev_parse_head(git: Git, cwd: Path) -> tuple[str | None, str | None]:
        done = git.run(["rev-parse", "--show-toplevel", "HEAD"], cwd=cwd, check=False)
        lines = done.stdout.decode(errors="surrogateescape").splitlines()
        if not lines or lines[0] == "HEAD" or not os.path.isabs(lines[0]):
            return None, None  # not in a repository
        head = lines[1].strip() if done.returncode == 0 and len(lines) > 1 else None
        return head or None, lines[0].strip()

    # -- refs and space --------------------------------------------------------------------

    def keep(
        self, cwd: Path, name: str, commit: str, real: str | None = None, checked: bool = False
    ) -> str:
        """Keep `commit` under `refs/agenthost/<name>` (e.g. a restore's undo,
        `<session>/restore-<ns>/before`); `real`: `cwd` already resolved; `checked`: the
        caller's capture of `real` (`capture`, `capture_unchanged`) just checked its shadow
        repository within the same hold of the directory's lock, so it is taken as that
        capture found it (its exclude file not `stat`ed again: one look a job, not two).

        Written as git's `files` ref format writes a ref, without starting git: the loose ref
        file through its `.lock` (created exclusively: a lock another writer holds, or a
        killed one left, fails the same way `update-ref` does), renamed into place."""
        git = self._git()
        return self._write_ref(git, self._kept_repo(git, cwd, real, checked), name, commit)

    def _kept_repo(self, git: Git, cwd: Path, real: str | None, checked: bool) -> Path:
        """The shadow repository a `keep` writes in: as the caller's capture just found it
        (`checked`), else checked now."""
        known = self._repos.get(real) if checked and real is not None else None
        return known[0] if known is not None else self._repo(git, cwd, real)

    def keep_commit(
        self, cwd: Path, name: str, commit: str, real: str | None = None, checked: bool = False
    ) -> bool:
        """Keep `commit` under `refs/agenthost/<name>`, a name the commit fixes (a Session's
        `<session>/+<commit>`): when this store knows that ref is there, nothing is written
        (no `mkdir`, no file created, none renamed: a Turn on an unchanged folder names the
        tree its previous Turn kept). Returns whether the ref was written now. The names a
        repository holds are read from the disk once (`git for-each-ref`) at its first use,
        then kept by this store's own `keep`s and drops. `real`, `checked`: as for `keep`."""
        git = self._git()
        repo = self._kept_repo(git, cwd, real, checked)
        if name in self._names(git, repo):
            return False
        self._write_ref(git, repo, name, commit, in_place=True)
        return True

    def names_ref(self, real: str, name: str) -> bool:
        """This store knows `refs/agenthost/<name>` is in the shadow repository of the
        resolved directory `real` (read or written by it; no look at the disk). The caller
        holds the directory's lock, as for `keep_commit`."""
        known = self._repos.get(real)
        named = self._named.get(known[0]) if known is not None else None
        return named is not None and name in named

    def _names(self, git: Git, repo: Path) -> set[str]:
        """The names under `refs/agenthost/` `repo` holds (`_named`), read once: from its
        loose ref files and `packed-refs` (what `git gc` packs them into), with no process;
        asked of git for a repository whose refs are not files."""
        named = self._named.get(repo)
        if named is not None:
            return named
        if not self._loose_refs(repo):
            out = git.out(
                ["for-each-ref", "--format=%(refname)", f"{REF_ROOT}/"], env={"GIT_DIR": str(repo)}
            )
            named = {r[len(REF_ROOT) + 1 :] for r in out.split()}
        else:
            named = set()
            prefix = f" {REF_ROOT}/"
            try:
                with open(repo / "packed-refs", encoding="utf-8", errors="surrogateescape") as pf:
                    for line in pf:
                        at = line.find(prefix)
                        if at != -1 and not line.startswith(("#", "^")):
                            named.add(line[at + len(prefix) :].rstrip("\n"))
            except FileNotFoundError:
                pass
            top = os.path.join(repo, REF_ROOT)
            for dirpath, _, files in os.walk(top):
                rel = os.path.relpath(dirpath, top)
                for file in files:
                    if not file.endswith(".lock"):
                        named.add(file if rel == "." else f"{rel}/{file}")
        self._named[repo] = named
        return named

    def _named_gone(self, repo: Path, names: Sequence[str]) -> None:
        named = self._named.get(repo)
        if named is not None:
            named.difference_update(names)

    def _write_ref(
        self, git: Git, repo: Path, name: str, commit: str, in_place: bool = False
    ) -> str:
        """`in_place`: the ref's directory is most likely there (a Session's, for its tree
        refs): its lock is created first, the directory made only if that fails for it."""
        ref = f"{REF_ROOT}/{name}"
        if not self._loose_refs(repo) or not _HEX.fullmatch(commit):
            git.run(["update-ref", ref, commit], env={"GIT_DIR": str(repo)})
        else:
            path = os.path.join(repo, ref)
            lock = path + ".lock"
            fd: int | None = None
            try:
                if in_place:
                    with contextlib.suppress(FileNotFoundError):  # no directory: made below
                        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                if fd is None:
                    _make_parent(path)
                    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except OSError as exc:
                raise GitUnavailable(
                    "git_failed",
                    f"cannot lock ref {ref}: {exc}",
                    stale_locks=isinstance(exc, FileExistsError),
                ) from None
            try:
                # Written by the descriptor: a Python file object around it would add a
                # `fstat`, an `ioctl` and a `lseek` to each ref (ckpt).
                try:
                    _write_all(fd, commit.encode() + b"\n")
                finally:
                    os.close(fd)
                os.replace(lock, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
                raise
        named = self._named.get(repo)
        if named is not None:
            named.add(name)
        return ref

    def _loose_refs(self, repo: Path) -> bool:
        """`repo` keeps its refs as loose files (git's `files` format), as this store makes
        its repositories; asked of the disk once per repository `_repo` checked in full (a
        repository made again is checked again)."""
        loose = self._loose.get(repo)
        if loose is None:
            loose = self._loose[repo] = not (repo / "reftable").exists()
        return loose

    def drop(self, cwd: Path, prefix: str) -> int:
        """Delete every ref under `refs/agenthost/<prefix>/`; returns how many."""
        repo = self.repo_dir(cwd)
        if not (repo / "HEAD").is_file():
            return 0
        git = self._git()
        env = {"GIT_DIR": str(repo)}
        refs = git.out(
            ["for-each-ref", "--format=%(refname)", f"{REF_ROOT}/{prefix}/"], env=env
        ).split()
        if refs:
            self._named.pop(repo, None)  # read again at the next `keep_commit`
            git.run(
                ["update-ref", "--stdin"],
                env=env,
                input_bytes="".join(f"delete {r}\n" for r in refs).encode(),
            )
        return len(refs)

    def workdirs(self) -> list[Path]:
        """Every directory this store holds checkpoints of (as each repository names it)."""
        out: list[Path] = []
        if not self.root.is_dir():
            return out
        for repo in sorted(self.root.iterdir()):
            name = repo / "agenthost-workdir"
            if repo.name.startswith(".") or not name.is_file():
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                out.append(Path(name.read_text().rstrip("\n")))
        return out

    def refs(self, cwd: Path) -> list[str]:
        """The names under `refs/agenthost/` kept for `cwd` (`<session>/+<commit>`, and
        `<session>/<turn>/<which>` of older stores and restores)."""
        repo = self.repo_dir(cwd)
        if not (repo / "HEAD").is_file():
            return []
        out = self._git().out(
            ["for-each-ref", "--format=%(refname)", f"{REF_ROOT}/"], env={"GIT_DIR": str(repo)}
        )
        return [r[len(REF_ROOT) + 1 :] for r in out.split()]

    def drop_refs(self, cwd: Path, names: Sequence[str]) -> int:
        """Delete the refs `refs/agenthost/<name>` of `names`; returns how many."""
        repo = self.repo_dir(cwd)
        if not names or not (repo / "HEAD").is_file():
            return 0
        self._named_gone(repo, names)
        self._git().run(
            ["update-ref", "--stdin"],
            env={"GIT_DIR": str(repo)},
            input_bytes="".join(f"delete {REF_ROOT}/{n}\n" for n in names).encode(),
        )
        return len(names)

    def discard(self, cwd: Path) -> bool:
        """Remove `cwd`'s shadow repository when it holds no ref at all (nothing any record
        names is there): renamed to a hidden name first (never listed by `workdirs`, so a kill
        leaves no half-removed repository in use), then removed. For a folder that is gone —
        its shadow index still names its last state, which a collection keeps. True when it
        went. The caller holds the directory's lock and forgets its caches (`forget`)."""
        repo = self.repo_dir(cwd)
        if not (repo / "HEAD").is_file():
            return False
        out = self._git().out(
            ["for-each-ref", "--count=1", "--format=%(refname)"], env={"GIT_DIR": str(repo)}
        )
        if out:
            return False
        gone = repo.with_name(f".{repo.name}{GONE_INFIX}{uuid.uuid4().hex}")
        os.rename(repo, gone)
        shutil.rmtree(gone, ignore_errors=True)
        return True

    def clear_leftovers(self) -> int:
        """Remove the hidden directories a kill left, which nothing reads: a `discard`'s
        between its rename and its removal (`.<key>.gone-<id>`), and a shadow repository's
        creation before its rename into place (`.init-<pid>-<id>`, unless this process is
        making it now: `_init_left`); returns how many."""
        if not self.root.is_dir():
            return 0
        left = [
            p
            for p in self.root.iterdir()
            if p.name.startswith(".")
            and (GONE_INFIX in p.name or (p.name.startswith(INIT_PREFIX) and _init_left(p)))
        ]
        for path in left:
            shutil.rmtree(path, ignore_errors=True)
        return len(left)

    def pack(self, cwd: Path) -> None:
        """Pack `cwd`'s store once git's own thresholds say so (`gc --auto`: loose objects past
        `gc.auto`, packs past `gc.autoPackLimit`; below them one cheap count), in the
        foreground: never a `gc` detached past the caller's hold of the directory's lock."""
        repo = self.repo_dir(cwd)
        if (repo / "HEAD").is_file():
            # `gc.auto` is 0 for every other call (no git of the store packs on its own).
            self._git().run(
                ["-c", f"gc.auto={PACK_LOOSE}", "-c", "gc.autoDetach=false"]
                + ["gc", "--auto", "--quiet"],
                env={"GIT_DIR": str(repo)},
                timeout_s=self.long_timeout_s,
            )

    def gc(self, cwd: Path) -> None:
        """Collect what no ref keeps (a dropped Session's checkpoints)."""
        repo = self.repo_dir(cwd)
        if (repo / "HEAD").is_file():
            self._git().run(
                ["gc", "-q", "--prune=now"],
                env={"GIT_DIR": str(repo)},
                timeout_s=self.long_timeout_s,
            )

    def size_bytes(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, f)).st_size
        return total

    # -- reading checkpoints ---------------------------------------------------------------

    def has(self, cwd: Path, commit: str) -> bool:
        """Whether `cwd`'s store holds the checkpoint `commit` (a tree)."""
        repo = self.repo_dir(cwd)
        if not (repo / "HEAD").is_file():
            return False
        done = self._git().run(
            ["cat-file", "-e", f"{commit}^{{tree}}"], env={"GIT_DIR": str(repo)}, check=False
        )
        return done.returncode == 0

    def changed_files(self, cwd: Path, before: str, after: str) -> list[FileChange]:
        git = self._git()
        out = git.run(
            ["diff-tree", "-r", "-z", "--no-renames", "--name-status", before, after],
            env={"GIT_DIR": str(self.repo_dir(cwd))},
        ).stdout
        parts = _split_nul(out)
        return [
            FileChange(path, _KIND.get(status[:1], ChangeKind.MODIFIED))
            for status, path in zip(parts[::2], parts[1::2], strict=False)
        ]

    def diff(
        self, cwd: Path, before: str, after: str, max_bytes: int = 256_000
    ) -> tuple[str, bool]:
        """A unified diff between two checkpoints (binary files named, not shown), cut at
        `max_bytes`; `(text, truncated)`."""
        out = (
            self._git()
            .run(
                ["diff", "--no-ext-diff", "--no-color", "--no-renames", before, after],
                env={"GIT_DIR": str(self.repo_dir(cwd))},
            )
            .stdout
        )
        truncated = len(out) > max_bytes
        return out[:max_bytes].decode(errors="replace"), truncated

    # -- writing a checkpoint's files ------------------------------------------------------

    def materialize(self, cwd: Path, commit: str, dest: Path) -> Path:
        """Write the checkpoint's files into a new directory `dest` (must not exist): into a
        temporary sibling first, renamed into place, so `dest` is whole or absent."""
        git = self._git()
        repo = self.repo_dir(cwd)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        index = tmp.with_name(tmp.name + ".index")
        try:
            env = self._env(repo, tmp, index)
            git.run(["read-tree", commit], env=env, cwd=tmp)
            git.run(["checkout-index", "-a", "-f"], env=env, cwd=tmp, timeout_s=self.long_timeout_s)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            index.unlink(missing_ok=True)
        return dest

    def restore(self, cwd: Path, commit: str, undo: str) -> Checkpoint | Unavailable:
        """Put `cwd`'s captured files back to the checkpoint `commit`: `begin_restore`, then
        `write_restore`. Returns the undo (a restore can itself be undone, even one killed
        or failed midway); files the checkpoints never capture (ignored, excluded, too large)
        are never touched."""
        now = self.begin_restore(cwd, undo)
        if isinstance(now, Unavailable):
            return now
        self.write_restore(cwd, now, commit)
        return now

    def begin_restore(self, cwd: Path, undo: str) -> Checkpoint | Unavailable:
        """A restore's first step: checkpoint `cwd`'s current files and keep them under
        `refs/agenthost/<undo>` — before any file is touched."""
        now = self.capture(cwd)
        if isinstance(now, Unavailable):
            return now
        self.keep(cwd, undo, now.commit)
        return now

    def write_restore(self, cwd: Path, now: Checkpoint, commit: str) -> None:
        """A restore's second step, from `now` (its `begin_restore`): write back the files
        that differ from `commit` and remove those it lacks. Raises `GitUnavailable` (a git
        failed or was killed at its bound) or `OSError` (a file could not be removed) with
        some files written: `now` puts them back."""
        changes = self.changed_files(cwd, now.commit, commit)
        git = self._git()
        repo = self.repo_dir(cwd)
        index = repo / f"restore-{uuid.uuid4().hex}.index"
        try:
            env = self._env(repo, cwd, index)
            git.run(["read-tree", commit], env=env, cwd=cwd)
            wanted = [c.path for c in changes if c.kind is not ChangeKind.DELETED]
            for change in changes:
                if change.kind is ChangeKind.DELETED:
                    target = cwd / change.path
                    unlink_in(cwd, change.path)
                    _prune_empty(target.parent, cwd)
            if wanted:
                for path in wanted:
                    unlink_in(cwd, path)  # a symlink or file is replaced, never written through
                git.run(
                    ["checkout-index", "-f", "-z", "--stdin"],
                    env=env,
                    cwd=cwd,
                    input_bytes=_nul(wanted),
                    timeout_s=self.long_timeout_s,
                )
        finally:
            index.unlink(missing_ok=True)
        # The shadow index learns the restored state (the next capture starts from it).
        self.capture(cwd)
