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

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from drivers.failpoints import Failpoints
from drivers.rollout_files import (
    _MAX_LINEAGE_DEPTH,
    _THREAD_ID,
    BinderError,
    BindFailure,
    NamesSyncing,
    ParsedRollout,
    RolloutMeta,
    assert_no_symlink,
    begin_atomic_write_all,
    first_line_identity,
    parse_rollout,
    read_regular,
    referenced_ordinal,
    rollout_matches,
    sha,
    tamper_with,
)


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
    parsed: Mapping[str, ParsedRollout] = field(default_factory=dict, compare=False, repr=False)
    """Each bound rollout's validated bytes and decoded lines, by its target path (never on
    the wire): the readability proof decodes a file holding exactly these bytes no more."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "childId": self.child_id,
            "sourceHome": self.source_home,
            "targetHome": self.target_home,
            "rollouts": [r.to_wire() for r in self.rollouts],
        }


class PendingNames:
    """The last round of a bind's syncs: `wait()` returns once every name it wrote is
    durable, or raises `BinderError` (`io_error`)."""

    def __init__(self, syncing: NamesSyncing | None) -> None:
        self._syncing = syncing

    def wait(self) -> None:
        if self._syncing is None:
            return
        try:
            self._syncing.wait()
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, f"the bound names' sync: {exc}") from exc


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
    target_parse: ParsedRollout
    """The validation's parse of `target_bytes` (the same bytes, or equal ones)."""


def _receipt(plan: _Plan) -> RolloutReceipt:
    source, target = plan.source_bytes, plan.target_bytes
    target_sha = sha(target)
    # A copy writes the source's very bytes object: hash it once.
    source_sha = None if source is None else target_sha if source is target else sha(source)
    return RolloutReceipt(
        thread_id=plan.thread_id,
        role=plan.role,
        relative_path=str(plan.relative),
        action=plan.action,
        source_size=len(source) if source is not None else None,
        source_sha256=source_sha,
        target_size=len(target),
        target_sha256=target_sha,
    )


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
        """`begin` and wait for it: when this returns the bound rollouts are durable."""
        receipt, names = self.begin(source_home, target_home, child_id)
        names.wait()
        return receipt

    def begin(
        self, source_home: Path, target_home: Path, child_id: str
    ) -> tuple[BindReceipt, PendingNames]:
        """The bind with its last round of syncs (the names' directories) still running:
        the files are in place, readable and their bytes durable; `wait()` on the second
        value before anything counts them durable (the fork answers `accepted` only after
        it, and meanwhile proves the child readable)."""
        source_home = Path(os.path.abspath(source_home))
        target_home = Path(os.path.abspath(target_home))
        assert_no_symlink(source_home, must_exist=False)
        assert_no_symlink(target_home, must_exist=False)
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
                needed_ordinal = referenced_ordinal(plan.target_bytes)
                thread_id, role = meta.forked_from_id, "ancestor"
            else:
                thread_id = None
        # Every rollout was validated and planned before the first write (fail closed).
        writes = [p for p in plans if p.action in (BindAction.COPIED, BindAction.REPAIRED)]
        if writes and self._failpoints.armed:
            self._failpoints.hit("worker.bind.before_copy")
        try:
            # Ancestors first: a crash mid-bind never leaves a child whose lineage is missing.
            ordered = list(reversed(writes))
            for plan in ordered:
                # Again just before the write: a link planted since the plan is still refused.
                assert_no_symlink(plan.target, must_exist=False, below=target_home)
            # Two rounds: every file's bytes fsynced together, then every name (in this
            # order) and their directories fsynced together, the latter in the background.
            syncing = (
                begin_atomic_write_all([(plan.target, plan.target_bytes) for plan in ordered])
                if ordered
                else None
            )
        except OSError as exc:
            raise BinderError(BindFailure.IO_ERROR, str(exc)) from exc
        names = PendingNames(syncing)
        if writes and self._failpoints.armed:
            self._failpoints.hit(
                "worker.bind.after_copy", tamper=lambda: tamper_with(p.target for p in writes)
            )
        receipt = BindReceipt(
            child_id=child_id,
            source_home=str(source_home),
            target_home=str(target_home),
            rollouts=tuple(_receipt(p) for p in plans),
            parsed={str(p.target): p.target_parse for p in plans},
        )
        return receipt, names

    def _plan(
        self, source_home: Path, target_home: Path, thread_id: str, role: str
    ) -> tuple[_Plan, RolloutMeta]:
        if not _THREAD_ID.match(thread_id):
            raise BinderError(BindFailure.BAD_THREAD_ID, f"bad thread id {thread_id!r}")
        try:
            sources = rollout_matches(source_home, thread_id)
            targets = rollout_matches(target_home, thread_id)
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
                kept = parse_rollout(target_bytes, thread_id)
            except ValueError as exc:
                raise BinderError(
                    BindFailure.SOURCE_ROLLOUT_MISSING, f"and target: {exc}"
                ) from None
            relative = target_existing.relative_to(target_home)
            return (
                _Plan(
                    thread_id,
                    role,
                    relative,
                    target_existing,
                    BindAction.KEPT,
                    None,
                    target_bytes,
                    kept,
                ),
                kept.meta,
            )

        source = sources[0]
        assert_no_symlink(source, must_exist=True, below=source_home)
        source_bytes = self._read(source)
        try:
            parsed = parse_rollout(source_bytes, thread_id)
        except ValueError as exc:
            failure = (
                BindFailure.SOURCE_IDENTITY_MISMATCH
                if "session_meta.id" in str(exc)
                else BindFailure.SOURCE_ROLLOUT_CORRUPT
            )
            raise BinderError(failure, f"{source}: {exc}") from None
        meta = parsed.meta
        relative = source.relative_to(source_home)
        # An archived target is repaired where it lives, never duplicated into sessions/.
        target = target_existing if target_existing is not None else target_home / relative
        relative_target = target.relative_to(target_home)
        assert_no_symlink(target, must_exist=False, below=target_home)

        def plan(
            action: BindAction, data: bytes, data_parse: ParsedRollout = parsed
        ) -> tuple[_Plan, RolloutMeta]:
            return (
                _Plan(
                    thread_id, role, relative_target, target, action, source_bytes, data, data_parse
                ),
                meta,
            )

        if target_bytes is None:
            return plan(BindAction.COPIED, source_bytes)
        if target_bytes == source_bytes:
            return plan(BindAction.IDENTICAL, target_bytes)
        if target_bytes.startswith(source_bytes):
            try:
                kept_parse = parse_rollout(target_bytes, thread_id)
            except ValueError as exc:
                # Rolling back would destroy the child's own history: refuse instead.
                raise BinderError(
                    BindFailure.TARGET_POST_FORK_CORRUPT, f"{target}: {exc}"
                ) from None
            return plan(BindAction.KEPT, target_bytes, kept_parse)
        if source_bytes.startswith(target_bytes):
            if first_line_identity(target_bytes) != thread_id:
                raise BinderError(
                    BindFailure.TARGET_IDENTITY_UNDETECTABLE,
                    f"{target} is a truncated prefix without a provable session_meta",
                )
            return plan(BindAction.REPAIRED, source_bytes)
        raise BinderError(BindFailure.TARGET_DIVERGED, f"{target} diverges from {source}")

    @staticmethod
    def _read(path: Path) -> bytes:
        try:
            return read_regular(path)
        except BinderError:
            raise
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: O_NOFOLLOW met a symlinked file
                raise BinderError(BindFailure.SYMLINKED_PATH, f"{path} is a symlink") from exc
            raise BinderError(BindFailure.IO_ERROR, f"{path}: {exc}") from exc
