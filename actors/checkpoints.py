"""Workspace checkpoints of a Turn (docs/design/workspace.md): the captures at a Turn's start
and end, run off the actor threads, and the record the Turn keeps.

A capture is git work on the person's directory, which may be slow: it never runs on a
Session actor's thread (its mailbox would stall), but on a small pool of its own, and the
actor is told the answer. Two captures of one directory never run at once (they share that
directory's shadow index). The record (`turn_record`) is what the store keeps on the Turn and
the wire sends as its `workspace`:

    {"cwd", "before", "after", "changedFiles": [{"path", "kind"}], "headCommit", "repoRoot",
     "tooLarge"}
    or {"state": "unavailable", "reason", "message"}
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workspace.shadow import Checkpoint, ShadowStore, Unavailable

log = logging.getLogger(__name__)

CAPTURE_THREADS = 2
"""Captures running at once, whatever the number of Sessions (2 cores is the target host)."""


def ref_segment(text: str) -> str:
    """`text` as one path segment of a git ref name: a plain id as it is, anything else
    hashed (git refuses `..`, a leading dot, `.lock`, spaces, control characters, ...)."""
    if (
        re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}", text)
        and ".." not in text
        and not text.endswith((".", ".lock"))
    ):
        return text
    return "x-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def checkpoint_ref(session_id: str, turn_id: str, which: str) -> str:
    """The name under `refs/agenthost/` that keeps a Turn's `before` or `after` checkpoint."""
    return f"{ref_segment(session_id)}/{ref_segment(turn_id)}/{which}"


def session_ref_prefix(session_id: str) -> str:
    """The prefix under `refs/agenthost/` of every checkpoint ref of one Session."""
    return ref_segment(session_id)


def unavailable(reason: str, message: str) -> dict[str, Any]:
    return {"state": "unavailable", "reason": reason, "message": message}


@dataclass(frozen=True, slots=True)
class Capture:
    """One capture's answer: the checkpoint (kept by its ref) or why there is none, and, for
    an `after` taken with its `before` known, the files the Turn changed."""

    cwd: str
    checkpoint: Checkpoint | Unavailable
    changed: tuple[dict[str, str], ...] = ()

    @staticmethod
    def missing(cwd: str, reason: str, message: str) -> Capture:
        return Capture(cwd, Unavailable(reason, message))


def turn_record(before: Capture | None, after: Capture | None) -> dict[str, Any]:
    """The Turn's checkpoint record from its two captures (None: not taken, or not yet). With
    no usable `after` (a settled Turn) the record is `unavailable` with the reason; a Turn
    still running has `after: null`."""
    if after is not None and isinstance(after.checkpoint, Unavailable):
        return unavailable(after.checkpoint.reason, after.checkpoint.message)
    if after is None and (before is None or isinstance(before.checkpoint, Unavailable)):
        if before is None:
            return unavailable("not_captured", "no checkpoint was taken")
        assert isinstance(before.checkpoint, Unavailable)
        return unavailable(before.checkpoint.reason, before.checkpoint.message)
    b = before.checkpoint if before is not None else None
    a = after.checkpoint if after is not None else None
    newest = a if isinstance(a, Checkpoint) else b
    assert isinstance(newest, Checkpoint)
    cwd = (after or before).cwd  # type: ignore[union-attr]
    return {
        "cwd": cwd,
        "before": b.tree if isinstance(b, Checkpoint) else None,
        "after": a.tree if isinstance(a, Checkpoint) else None,
        "changedFiles": list(after.changed) if after is not None else [],
        "headCommit": newest.head_commit,
        "repoRoot": newest.repo_root,
        "tooLarge": list(newest.too_large),
    }


@dataclass(eq=False)
class TurnCheckpoints:
    """The daemon's captures of Turns' working directories (one per daemon, on
    `HostContext.turn_checkpoints`); `shadow` is the one `ShadowStore` of the home."""

    shadow: ShadowStore
    threads: int = CAPTURE_THREADS
    _pool: ThreadPoolExecutor | None = None
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def bound_s(self) -> float:
        """How long a Turn waits for a capture before it is recorded `timed_out`."""
        return self.shadow.timeout_s

    def _executor(self) -> ThreadPoolExecutor:
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.threads, thread_name_prefix="agenthost-checkpoint"
                )
            return self._pool

    def _lock(self, cwd: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(cwd, threading.Lock())

    def capture(
        self, cwd: str, session_id: str, turn_id: str, which: str, before: str | None = None
    ) -> Future[Capture]:
        """Capture `cwd` on the pool and keep it under its Turn's ref; `before` (a tree):
        the answer lists the files changed since it. The future never fails."""
        return self._executor().submit(self._run, cwd, session_id, turn_id, which, before)

    def _run(
        self, cwd: str, session_id: str, turn_id: str, which: str, before: str | None
    ) -> Capture:
        real = os.path.realpath(cwd)
        try:
            with self._lock(real):
                path = Path(real)
                checkpoint = self.shadow.capture(path)
                if isinstance(checkpoint, Unavailable):
                    return Capture(real, checkpoint)
                self.shadow.keep(
                    path, checkpoint_ref(session_id, turn_id, which), checkpoint.commit
                )
                changed: tuple[dict[str, str], ...] = ()
                if before is not None:
                    changed = tuple(
                        {"path": c.path, "kind": c.kind.value}
                        for c in self.shadow.changed_files(path, before, checkpoint.tree)
                    )
                return Capture(real, checkpoint, changed)
        except Exception as exc:  # noqa: BLE001 - a checkpoint never fails a Turn
            reason = getattr(exc, "reason", "git_failed")
            log.warning("checkpoint of %s (%s) failed: %s", real, which, exc)
            return Capture.missing(real, str(reason), f"the checkpoint failed: {exc}")

    def close(self) -> None:
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
