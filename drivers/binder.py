"""The `host_copy` provider-state binder for rollout homes (`tutti-agent-home`, `codex-home`): it
copies a fork child's rollout — and, for a Referenced child, the ancestor rollouts it reads
through — from the source home into the child's own home, crash-durably, and returns a receipt.

Rules (seed 000 §7, §10): exact lookup, every JSONL line validated, `session_meta.id` = thread,
size + SHA-256, atomic copy (temp, fsync, rename, fsync dir), no symlinked path anywhere,
idempotent; an existing target is kept (identical, or source bytes + post-fork appends),
repaired (a strict prefix of the source whose first line proves the identity), or — anything
else — refused with nothing written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from domain.errors import ProviderError
from drivers.failpoints import Failpoints

ROLLOUT_DIRS = ("sessions", "archived_sessions")
_THREAD_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_-]{0,127}$")
_MAX_LINEAGE_DEPTH = 64


class BindFailure(StrEnum):
    """Why the binder refused; every refusal writes nothing."""

    SYMLINKED_PATH = "symlinked_path"
    BAD_THREAD_ID = "bad_thread_id"
    SOURCE_ROLLOUT_MISSING = "source_rollout_missing"
    SOURCE_ROLLOUT_AMBIGUOUS = "source_rollout_ambiguous"
    SOURCE_ROLLOUT_CORRUPT = "source_rollout_corrupt"
    SOURCE_IDENTITY_MISMATCH = "source_identity_mismatch"
    TARGET_ROLLOUT_AMBIGUOUS = "target_rollout_ambiguous"
    TARGET_NOT_REGULAR = "target_not_regular"
    TARGET_IDENTITY_UNDETECTABLE = "target_identity_undetectable"
    TARGET_POST_FORK_CORRUPT = "target_post_fork_corrupt"
    TARGET_DIVERGED = "target_diverged"
    LINEAGE_INCOMPLETE = "lineage_incomplete"
    IO_ERROR = "io_error"


class BinderError(ProviderError):
    """The binder refused or failed; after a provider fork this makes the operation unknown."""

    default_reason = "provider_state_binding_failed"

    def __init__(self, failure: BindFailure, message: str) -> None:
        super().__init__(f"{failure.value}: {message}", params={"bindFailure": failure.value})
        self.failure = failure


class BindAction(StrEnum):
    COPIED = "copied"
    """The target had no rollout: the source bytes were copied."""
    IDENTICAL = "identical"
    """The target already held exactly the source bytes."""
    KEPT = "kept"
    """The target holds the source bytes plus valid post-fork appends (or the source is gone
    and the target validates on its own): left as is."""
    REPAIRED = "repaired"
    """The target was a strict prefix of the source (truncated, maybe a torn tail) whose first
    line proves the identity: rebuilt from the source in place."""


@dataclass(frozen=True, slots=True)
class RolloutReceipt:
    thread_id: str
    role: str  # "child" or "ancestor"
    relative_path: str
    action: BindAction
    source_size: int | None
    source_sha256: str | None
    target_size: int
    target_sha256: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "threadId": self.thread_id,
            "role": self.role,
            "relativePath": self.relative_path,
            "action": self.action.value,
            "sourceSize": self.source_size,
            "sourceSha256": self.source_sha256,
            "targetSize": self.target_size,
            "targetSha256": self.target_sha256,
        }


@dataclass(frozen=True, slots=True)
class BindReceipt:
    child_id: str
    source_home: str
    target_home: str
    rollouts: tuple[RolloutReceipt, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "childId": self.child_id,
            "sourceHome": self.source_home,
            "targetHome": self.target_home,
            "rollouts": [r.to_wire() for r in self.rollouts],
        }


@dataclass(frozen=True, slots=True)
class RolloutMeta:
    """What the first line says about a thread's identity and lineage."""

    thread_id: str
    first_ordinal: int
    last_ordinal: int
    forked_from_id: str | None
    referenced: bool


# --------------------------------------------------------------------------- validation


def _parse_line(raw: bytes) -> dict[str, Any]:
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("line is not a JSON object")
    for key in ("timestamp", "ordinal", "type", "payload"):
        if key not in obj:
            raise ValueError(f"line lacks {key!r}")
    if not isinstance(obj["ordinal"], int) or isinstance(obj["ordinal"], bool):
        raise ValueError("ordinal is not an integer")
    if not isinstance(obj["type"], str) or not isinstance(obj["payload"], dict):
        raise ValueError("bad type or payload")
    return obj


def validate_rollout(data: bytes, thread_id: str) -> RolloutMeta:
    """Validate a complete rollout: every line a JSON object `{timestamp, ordinal, type,
    payload}` ending in a newline, ordinals strictly increasing, first line `session_meta` with
    `payload.id == thread_id`. Raises ValueError describing the first defect."""
    if not data:
        raise ValueError("empty rollout")
    if not data.endswith(b"\n"):
        raise ValueError("torn last line")
    lines = data[:-1].split(b"\n")
    first: dict[str, Any] | None = None
    previous: int | None = None
    for index, raw in enumerate(lines):
        try:
            obj = _parse_line(raw)
        except ValueError as exc:
            raise ValueError(f"line {index + 1}: {exc}") from None
        if previous is not None and obj["ordinal"] <= previous:
            raise ValueError(f"line {index + 1}: ordinal not increasing")
        previous = obj["ordinal"]
        if first is None:
            first = obj
    assert first is not None and previous is not None
    if first["type"] != "session_meta":
        raise ValueError("first line is not session_meta")
    payload = first["payload"]
    if payload.get("id") != thread_id:
        raise ValueError(f"session_meta.id is {payload.get('id')!r}, expected {thread_id!r}")
    forked_from = payload.get("forked_from_id")
    # Referenced children start past ordinal 0 and name the ordinal they read through.
    referenced = bool(forked_from) and (
        payload.get("forked_from_ordinal_exclusive") is not None
        or payload.get("history_base") is not None
        or first["ordinal"] > 0
    )
    return RolloutMeta(
        thread_id=thread_id,
        first_ordinal=first["ordinal"],
        last_ordinal=previous,
        forked_from_id=str(forked_from) if forked_from else None,
        referenced=referenced,
    )


def _first_line_identity(data: bytes) -> str | None:
    """The `session_meta.id` of a complete first line, or None when it cannot be proven."""
    newline = data.find(b"\n")
    if newline < 0:
        return None
    try:
        obj = _parse_line(data[:newline])
    except ValueError:
        return None
    if obj["type"] != "session_meta":
        return None
    ident = obj["payload"].get("id")
    return ident if isinstance(ident, str) else None


def _referenced_ordinal(data: bytes) -> int | None:
    newline = data.find(b"\n")
    obj = _parse_line(data[:newline])
    payload = obj["payload"]
    value = payload.get("forked_from_ordinal_exclusive")
    if isinstance(value, int):
        return value
    base = payload.get("history_base")
    if isinstance(base, dict) and isinstance(base.get("ordinal_exclusive"), int):
        return int(base["ordinal_exclusive"])
    return int(obj["ordinal"])


# --------------------------------------------------------------------------- paths


def _assert_no_symlink(path: Path, *, must_exist: bool) -> None:
    """Refuse if `path` or any ancestor is a symlink (a copy through a link could land in, or
    read from, another session's home)."""
    path = Path(os.path.abspath(path))
    for part in [*reversed(path.parents), path]:
        try:
            st = os.lstat(part)
        except FileNotFoundError:
            if must_exist and part == path:
                raise BinderError(
                    BindFailure.SOURCE_ROLLOUT_MISSING, f"{part} does not exist"
                ) from None
            return  # nothing below a missing component can be a link yet
        if stat.S_ISLNK(st.st_mode):
            raise BinderError(BindFailure.SYMLINKED_PATH, f"{part} is a symlink")


def _rollout_matches(home: Path, thread_id: str) -> list[Path]:
    """Exact lookup: `<dir>/**/rollout-<ts>-<thread_id>.jsonl` under sessions and archives."""
    suffix = f"-{thread_id}.jsonl"
    found: list[Path] = []
    for dirname in ROLLOUT_DIRS:
        root = home / dirname
        if not root.is_dir() or root.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in filenames:
                if name.startswith("rollout-") and name.endswith(suffix):
                    found.append(Path(dirpath) / name)
            dirnames.sort()
    return sorted(found)


def _read_regular(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BinderError(BindFailure.TARGET_NOT_REGULAR, f"{path} is not a regular file")
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs(path: Path) -> list[Path]:
    """Create `path` and its missing ancestors; returns the directories whose entries
    changed (each created directory's parent), deepest first — the caller fsyncs each once."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    changed: list[Path] = []
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
        changed.append(directory.parent)
    changed.reverse()
    return changed


def _atomic_write(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename over, fsync the directory: a crash leaves old or new bytes.

    Every directory whose entries changed (the file's, and each created directory's parent)
    is fsynced exactly once, after the rename and before this returns. The directories are
    all created first and fsynced last, not each right after its mkdir (issue 20): the same
    fsyncs, but the file's fsync commits the mkdirs in the same filesystem journal
    transaction, so the directory fsyncs find little left to do (one journal commit per
    fsync in a row was most of a fork's binder time). A crash before the last fsync leaves
    at most an unaccepted partial tree, which a re-bind completes (idempotent)."""
    changed = _makedirs(path.parent)
    tmp = path.parent / f".{path.name}.bind-{os.getpid()}-{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    os.close(fd)
    os.replace(tmp, path)
    for directory in [path.parent, *changed]:
        _fsync_dir(directory)


def _tamper_with(paths: Iterable[Path]) -> None:
    """The `tamper` failpoint's damage (tests only): cut each rollout just written to its
    session_meta line, as a lost or damaged copy would look. Identity stays provable; the
    history (a Copied child's turns, the prefix a Referenced child reads) is gone."""
    for path in paths:
        data = path.read_bytes()
        path.write_bytes(data[: data.index(b"\n") + 1])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- the binder


@dataclass(frozen=True, slots=True)
class _Plan:
    """One rollout's decided action, computed for every rollout before anything is written."""

    thread_id: str
    role: str
    relative: Path
    target: Path
    action: BindAction
    source_bytes: bytes | None
    target_bytes: bytes


class RolloutBinder:
    """Binds fork children between rollout homes; stateless, safe to call concurrently for
    different targets and idempotent for the same one."""

    def __init__(self, failpoints: Failpoints | None = None) -> None:
        self._failpoints = failpoints or Failpoints()

    def available(self) -> bool:
        """What an attestation reports as `binderAvailable` (seed 000 §7: a host_copy fork
        without a working binder fails closed before dispatch). True only when this platform
        has what `bind` relies on: no-follow opens, directory fsync (crash-durable rename) and
        atomic replace."""
        return all(hasattr(os, name) for name in ("O_NOFOLLOW", "O_DIRECTORY", "fsync", "replace"))

    def bind(self, source_home: Path, target_home: Path, child_id: str) -> BindReceipt:
        source_home = Path(os.path.abspath(source_home))
        target_home = Path(os.path.abspath(target_home))
        _assert_no_symlink(source_home, must_exist=False)
        _assert_no_symlink(target_home, must_exist=False)
        plans: list[_Plan] = []
        seen: set[str] = set()
        thread_id: str | None = child_id
        needed_ordinal: int | None = None
        role = "child"
        while thread_id is not None:
            if thread_id in seen or len(seen) >= _MAX_LINEAGE_DEPTH:
                raise BinderError(BindFailure.LINEAGE_INCOMPLETE, f"lineage loops at {thread_id}")
            seen.add(thread_id)
            plan, meta = self._plan(source_home, target_home, thread_id, role)
            if needed_ordinal is not None and meta.last_ordinal < needed_ordinal - 1:
                raise BinderError(
                    BindFailure.LINEAGE_INCOMPLETE,
                    f"{thread_id} ends at ordinal {meta.last_ordinal}, "
                    f"a descendant reads through {needed_ordinal - 1}",
                )
            plans.append(plan)
            if meta.referenced and meta.forked_from_id:
                needed_ordinal = _referenced_ordinal(plan.target_bytes)
                thread_id, role = meta.forked_from_id, "ancestor"
            else:
                thread_id = None
        # Every rollout was validated and planned before the first write (fail closed).
        writes = [p for p in plans if p.action in (BindAction.COPIED, BindAction.REPAIRED)]
        if writes:
            self._failpoints.hit("worker.bind.before_copy")
        try:
            # Ancestors first: a crash mid-bind never leaves a child whose lineage is missing.
            for plan in reversed(writes):
                _assert_no_symlink(plan.target, must_exist=False)
                _atomic_write(plan.target, plan.target_bytes)
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, str(exc)) from exc
        if writes:
            self._failpoints.hit(
                "worker.bind.after_copy", tamper=lambda: _tamper_with(p.target for p in writes)
            )
        return BindReceipt(
            child_id=child_id,
            source_home=str(source_home),
            target_home=str(target_home),
            rollouts=tuple(
                RolloutReceipt(
                    thread_id=p.thread_id,
                    role=p.role,
                    relative_path=str(p.relative),
                    action=p.action,
                    source_size=len(p.source_bytes) if p.source_bytes is not None else None,
                    source_sha256=_sha(p.source_bytes) if p.source_bytes is not None else None,
                    target_size=len(p.target_bytes),
                    target_sha256=_sha(p.target_bytes),
                )
                for p in plans
            ),
        )

    def _plan(
        self, source_home: Path, target_home: Path, thread_id: str, role: str
    ) -> tuple[_Plan, RolloutMeta]:
        if not _THREAD_ID.match(thread_id):
            raise BinderError(BindFailure.BAD_THREAD_ID, f"bad thread id {thread_id!r}")
        try:
            sources = _rollout_matches(source_home, thread_id)
            targets = _rollout_matches(target_home, thread_id)
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, str(exc)) from exc
        if len(sources) > 1:
            raise BinderError(
                BindFailure.SOURCE_ROLLOUT_AMBIGUOUS, f"{len(sources)} for {thread_id}"
            )
        if len(targets) > 1:
            raise BinderError(
                BindFailure.TARGET_ROLLOUT_AMBIGUOUS, f"{len(targets)} for {thread_id}"
            )
        target_existing = targets[0] if targets else None
        target_bytes = self._read(target_existing) if target_existing is not None else None

        if not sources:
            # The source may be cleaned up: only a target that validates on its own is accepted.
            if target_existing is None or target_bytes is None:
                raise BinderError(BindFailure.SOURCE_ROLLOUT_MISSING, f"no rollout for {thread_id}")
            try:
                meta = validate_rollout(target_bytes, thread_id)
            except ValueError as exc:
                raise BinderError(
                    BindFailure.SOURCE_ROLLOUT_MISSING, f"and target: {exc}"
                ) from None
            relative = target_existing.relative_to(target_home)
            return (
                _Plan(
                    thread_id, role, relative, target_existing, BindAction.KEPT, None, target_bytes
                ),
                meta,
            )

        source = sources[0]
        _assert_no_symlink(source, must_exist=True)
        source_bytes = self._read(source)
        try:
            meta = validate_rollout(source_bytes, thread_id)
        except ValueError as exc:
            failure = (
                BindFailure.SOURCE_IDENTITY_MISMATCH
                if "session_meta.id" in str(exc)
                else BindFailure.SOURCE_ROLLOUT_CORRUPT
            )
            raise BinderError(failure, f"{source}: {exc}") from None
        relative = source.relative_to(source_home)
        # An archived target is repaired where it lives, never duplicated into sessions/.
        target = target_existing if target_existing is not None else target_home / relative
        relative_target = target.relative_to(target_home)
        _assert_no_symlink(target, must_exist=False)

        def plan(action: BindAction, data: bytes) -> tuple[_Plan, RolloutMeta]:
            return _Plan(thread_id, role, relative_target, target, action, source_bytes, data), meta

        if target_bytes is None:
            return plan(BindAction.COPIED, source_bytes)
        if target_bytes == source_bytes:
            return plan(BindAction.IDENTICAL, target_bytes)
        if target_bytes.startswith(source_bytes):
            try:
                validate_rollout(target_bytes, thread_id)
            except ValueError as exc:
                # Rolling back would destroy the child's own history: refuse instead.
                raise BinderError(
                    BindFailure.TARGET_POST_FORK_CORRUPT, f"{target}: {exc}"
                ) from None
            return plan(BindAction.KEPT, target_bytes)
        if source_bytes.startswith(target_bytes):
            if _first_line_identity(target_bytes) != thread_id:
                raise BinderError(
                    BindFailure.TARGET_IDENTITY_UNDETECTABLE,
                    f"{target} is a truncated prefix without a provable session_meta",
                )
            return plan(BindAction.REPAIRED, source_bytes)
        raise BinderError(BindFailure.TARGET_DIVERGED, f"{target} diverges from {source}")

    @staticmethod
    def _read(path: Path) -> bytes:
        try:
            return _read_regular(path)
        except BinderError:
            raise
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: O_NOFOLLOW met a symlinked file
                raise BinderError(BindFailure.SYMLINKED_PATH, f"{path} is a symlink") from exc
            raise BinderError(BindFailure.IO_ERROR, f"{path}: {exc}") from exc


def iter_rollouts(home: Path) -> Iterator[Path]:
    """Every rollout file in a home (tests count provider children with it)."""
    for dirname in ROLLOUT_DIRS:
        root = home / dirname
        if root.is_dir():
            yield from sorted(root.rglob("rollout-*.jsonl"))
