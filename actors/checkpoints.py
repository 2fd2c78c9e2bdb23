"""Workspace checkpoints of a Turn (docs/design/workspace.md): the captures at a Turn's start
and end, run off the actor threads unless certain to be cheap, and the record the Turn keeps.

A capture is git work on the person's directory, which may be slow: it runs on a small pool
of its own, not on a Session actor's thread (its mailbox would stall), and the actor is told
the answer — except a Turn's `after` that is certain to need no process and few `lstat`s
(`TurnCheckpoints.capture_after_here`), taken on the actor's thread without the two hops.
Two captures of one directory never run at once (they share that directory's shadow index).
The record (`turn_record`) is what the store keeps on the Turn and the wire sends as its
`workspace`:

    {"cwd", "before", "after", "changedFiles": [{"path", "kind"}], "headCommit", "repoRoot",
     "tooLarge"[, "beforeUnavailable": {"reason", "message"}]}
    or {"state": "unavailable", "reason", "message"}
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

from actors.ports import Failpoints
from actors.store_ports import DeletedSessions
from domain.wake_one import WakeOneThreads
from workspace.git import GitUnavailable
from workspace.shadow import Checkpoint, ShadowStore, Unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

CAPTURE_THREADS = 2
"""Checkpoint jobs running at once, whatever the number of Sessions (2 cores is the target
host)."""
FIRST_SWEEP_S = 30.0
"""The first sweep runs this long after the daemon starts (or after `interval_s` if sooner)."""
SIZE_CACHE_S = 5.0
"""`host.status` walks the checkpoint store at most this often."""
HERE_MAX_ENTRIES = 1_000
"""An `after` capture runs on the asking thread (`TurnCheckpoints.capture_after_here`) only
for a directory whose stat snapshot holds at most this many entries (an `lstat` each)."""
HERE_BUDGET_S = 0.005
"""`HERE_SLOW_RUN` captures in a row on the asking thread that each took longer than this (a
slow filesystem) send that directory's captures back to the pool for `HERE_PAUSE_S`."""
HERE_SLOW_RUN = 2
"""A slow filesystem is slow at every capture; one slow capture alone is most often the
thread waiting for a core on a loaded host, which the pool would not spare it."""
HERE_PAUSE_S = 60.0
HERE_KEPT = 256
"""Folders whose one slow capture here is remembered at most (`HERE_SLOW_RUN`); past it the
count starts again (a folder slow once and never captured again is a removed tree)."""


@functools.lru_cache(maxsize=4096)
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
    """The name under `refs/agenthost/` that kept a Turn's `before` or `after` checkpoint in
    stores written before `commit_ref` (still honoured and dropped), and keeps a restore's
    undo."""
    return f"{ref_segment(session_id)}/{ref_segment(turn_id)}/{which}"


def commit_ref(session_id: str, commit: str) -> str:
    """The name under `refs/agenthost/` that keeps a Session's checkpoint `commit`: every
    Turn of the Session naming that tree shares it (`+` is in no `ref_segment`, so it never
    meets a Turn's directory of `checkpoint_ref`)."""
    return f"{ref_segment(session_id)}/+{commit}"


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
    still running has `after: null`. A usable `after` with no `before` keeps why
    (`beforeUnavailable`)."""
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
    record = {
        "cwd": cwd,
        "before": b.tree if isinstance(b, Checkpoint) else None,
        "after": a.tree if isinstance(a, Checkpoint) else None,
        "changedFiles": list(after.changed) if after is not None else [],
        "headCommit": newest.head_commit,
        "repoRoot": newest.repo_root,
        "tooLarge": list(newest.too_large),
    }
    if isinstance(b, Unavailable):
        record["beforeUnavailable"] = {"reason": b.reason, "message": b.message}
    return record


SETTLED_KEPT = 4096
"""Settled Turns `RefPins` remembers, so a capture landing after its Turn pins nothing (a
capture outliving its bound by more Turns than this pins its ref until the daemon stops)."""

_PinKey = tuple[str, str]
"""(a resolved working directory, a `commit_ref` name)."""


class RefPins:
    """The `commit_ref`s Turns in flight name: a capture kept the ref, and the Turn's record
    is not durable yet, so nothing in the store says that Turn needs it; the size cap leaves
    a pinned ref. A pin is taken within the directory lock's hold that kept the ref, and
    given up once the Turn's settlement landed (`settled`) or the Turn was never created
    (`discardable`). Also which refs a capture wrote that no other Turn named since: the only
    ones a discarded capture may drop."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pins: dict[_PinKey, set[tuple[str, str]]] = {}
        self._fresh: dict[_PinKey, tuple[str, str]] = {}
        self._by_turn: dict[tuple[str, str], list[_PinKey]] = {}
        # The Turns whose pins went (`settled`), newest last, `SETTLED_KEPT` at most: a
        # capture that lands after its Turn settled (one the bound gave up on) pins nothing,
        # so no pin outlives its Turn.
        self._settled: OrderedDict[tuple[str, str], None] = OrderedDict()

    def pin(self, real: str, name: str, session_id: str, turn_id: str, written: bool) -> None:
        key, turn = (real, name), (session_id, turn_id)
        with self._guard:
            if turn in self._settled:
                return  # its record is written already, without this capture
            self._pins.setdefault(key, set()).add(turn)
            self._by_turn.setdefault(turn, []).append(key)
            if written:
                self._fresh[key] = turn
            elif self._fresh.get(key) != turn:
                self._fresh.pop(key, None)  # another Turn names it too: never discarded

    def _unpin(self, turn: tuple[str, str]) -> list[_PinKey]:
        keys = self._by_turn.pop(turn, [])
        for key in keys:
            turns = self._pins.get(key)
            if turns is not None:
                turns.discard(turn)
                if not turns:
                    del self._pins[key]
        return keys

    def settled(self, session_id: str, turn_id: str) -> None:
        """The Turn's record is durable (or will never be written): its pins go."""
        turn = (session_id, turn_id)
        with self._guard:
            for key in self._unpin(turn):
                if self._fresh.get(key) == turn:
                    del self._fresh[key]
            self._settled[turn] = None
            if len(self._settled) > SETTLED_KEPT:
                self._settled.popitem(last=False)

    def discardable(self, session_id: str, turn_id: str) -> list[_PinKey]:
        """A Turn that was never created: its pins go, and the refs its captures wrote that
        no other Turn named since (nor names now) are returned, to be dropped."""
        turn = (session_id, turn_id)
        with self._guard:
            keys = self._unpin(turn)
            out = [k for k in keys if self._fresh.get(k) == turn and k not in self._pins]
            for key in keys:
                if self._fresh.get(key) == turn:
                    del self._fresh[key]
            return out

    def pinned(self, real: str, names: list[str]) -> set[str]:
        with self._guard:
            return {n for n in names if (real, n) in self._pins}


class FolderLock:
    """One working directory's lock, a FIFO: `acquire`/`release` as a `threading.Lock` (a
    blocked `acquire` waits its turn), and `submit`, a job run on a pool thread holding the
    lock, parked here while another holder has it and handed to the pool when that holder lets
    it go, so a pool thread never waits on a folder another job holds (one folder's stalled
    git holds one pool thread, never every folder's captures). A parked job whose future was
    cancelled (its Turn stopped waiting) is skipped, never run."""

    __slots__ = ("_held", "_mutex", "_users", "_waiting")

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiting: deque[threading.Event | tuple[Executor, _FolderJob]] = deque()
        # Threads that took this lock from `DirectoryLocks` and have not yet acquired it or
        # parked on it (counted under its guard; `DirectoryLocks.retire_held`).
        self._users = 0

    def waited_on(self) -> bool:
        """Whether a thread or a parked job waits for this lock."""
        with self._mutex:
            return bool(self._waiting)

    def acquire(self, blocking: bool = True) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            if not blocking:
                return False
            turn = threading.Event()
            self._waiting.append(turn)
        turn.wait()  # `release` handed the lock over
        return True

    def release(self) -> None:
        """Let the lock go, or hand it to the first waiter: a thread blocked in `acquire`, or
        a parked job (sent to its pool; a cancelled one skipped)."""
        while True:
            with self._mutex:
                while self._waiting:
                    waiter = self._waiting.popleft()
                    if isinstance(waiter, threading.Event):
                        waiter.set()
                        return
                    if not waiter[1].future.cancelled():
                        break
                else:
                    self._held = False
                    return
            pool, job = waiter
            if self._send(pool, job):
                return

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def submit(self, pool: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` on a pool thread holding this lock (FIFO after its holders); the
        future is cancelled when the pool is shut down. Cancel it to skip a job not begun."""
        job = _FolderJob(self, fn, args)
        with self._mutex:
            if self._held:
                self._waiting.append((pool, job))
                return job.future
            self._held = True
        if not self._send(pool, job):
            self.release()
        return job.future

    def _send(self, pool: Executor, job: _FolderJob) -> bool:
        """Hand the held lock to `job` on `pool`; False (the job cancelled) if it is shut
        down."""
        try:
            sent = pool.submit(job.run)
        except RuntimeError:
            job.future.cancel()
            return False
        sent.add_done_callback(job.dropped)
        return True


class _FolderJob:
    """A `FolderLock.submit` job: runs holding the lock, then lets it go."""

    __slots__ = ("args", "fn", "future", "lock")

    def __init__(self, lock: FolderLock, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.lock = lock
        self.fn = fn
        self.args = args
        self.future: Future[Any] = Future()

    def run(self) -> None:
        future = self.future
        try:
            if future.set_running_or_notify_cancel():
                try:
                    result = self.fn(*self.args)
                except BaseException as exc:  # noqa: BLE001 - the future carries it
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        finally:
            self.fn = self.args = None  # type: ignore[assignment]
            self.lock.release()

    def dropped(self, sent: Future[None]) -> None:
        """The pool cancelled the job unrun (shut down with `cancel_futures`): so is its
        future, and the lock goes on (to jobs the shut pool cancels in turn)."""
        if sent.cancelled():
            self.future.cancel()
            self.lock.release()


class DirectoryLocks:
    """One lock per working directory (`FolderLock`): its captures, drops and collections
    never overlap (they share the directory's shadow repository and index), and a job for a
    busy directory waits parked on it, never on a pool thread; and the `RefPins` of the
    checkpoint refs Turns in flight name.

    A folder that is gone (a worktree fork's tree removed) has its entry retired
    (`retire_held`), or the map would hold one lock per tree ever made. Never two locks of
    one folder: a lock is handed out under the guard with `_users` counted until its taker
    holds it or waits on it (`_using`), and an entry is dropped, under the same guard, only
    by its holder and only while no one else is counted, holds or waits: no thread can
    reach the old lock after that, and the next one makes the folder's only lock."""

    def __init__(self) -> None:
        self._locks: dict[str, FolderLock] = {}
        self._cleared: set[str] = set()
        self._guard = threading.Lock()
        self.pins = RefPins()

    def __call__(self, cwd: str) -> FolderLock:
        return self.resolved(os.path.realpath(cwd))

    def resolved(self, real: str) -> FolderLock:
        """The lock of a directory already resolved (`os.path.realpath`), handed out bare: it
        is never retired (its taker is never known to be done with it)."""
        with self._guard:
            lock = self._entry(real)
            lock._users += 1
            return lock

    def _entry(self, real: str) -> FolderLock:
        lock = self._locks.get(real)
        if lock is None:
            lock = self._locks[real] = FolderLock()
        return lock

    @contextlib.contextmanager
    def _using(self, real: str) -> Iterator[FolderLock]:
        """`real`'s lock, counted as in use until the block ends: the block acquires it or
        parks on it (where a retirement sees it), nothing more."""
        with self._guard:
            lock = self._entry(real)
            lock._users += 1
        try:
            yield lock
        finally:
            with self._guard:
                lock._users -= 1

    def retire_held(self, shadow: ShadowStore, real: str) -> bool:
        """Holding `real`'s lock, its folder gone: forget what this daemon keeps for it (its
        lock's entry, `cleared`, the shadow store's caches of it). The entry stays while any
        other thread took the lock and has not acquired it, or waits on it: True when it went.
        The caller only lets the lock go after this."""
        shadow.forget(real)
        with self._guard:
            lock = self._locks.get(real)
            if lock is None or lock._users or lock.waited_on():
                return False
            del self._locks[real]
            self._cleared.discard(real)
            return True

    def __len__(self) -> int:
        """Folders with a lock now."""
        with self._guard:
            return len(self._locks)

    def cleared(self, cwd: str) -> bool:
        """`clear_stale_once` ran for `cwd` (resolved)."""
        return cwd in self._cleared

    def clear_stale_once(self, shadow: ShadowStore, cwd: str) -> None:
        """The first time this daemon works on `cwd`'s store (holding its lock): remove the
        lock files a killed daemon left, which git would refuse to write past. Nothing else
        writes there: the daemon holds its home and serialises each directory's work — but
        for a git that daemon left that outlived its kill at start, whose lock files stay
        until it is gone (asked again at each job until then)."""
        with self._guard:
            first = cwd not in self._cleared
            self._cleared.add(cwd)
        if not first:
            return
        if shadow.left_git_in(Path(cwd)):
            with self._guard:
                self._cleared.discard(cwd)
            return
        shadow.clear_stale_locks(Path(cwd))

    @contextlib.contextmanager
    def held(self, shadow: ShadowStore, cwd: str) -> Iterator[None]:
        """Hold `cwd`'s (resolved) lock for one job on its shadow repository, waiting for it
        (a thread off the pool: a pool job goes through `submit`)."""
        with self._using(cwd) as lock:
            lock.acquire()
        try:
            with self.holding(shadow, cwd):
                yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def holding(self, shadow: ShadowStore, cwd: str) -> Iterator[None]:
        """Within `cwd`'s lock's hold, one job on its shadow repository: the lock files a
        killed daemon left are removed first (`clear_stale_once`), and those a git of this job
        left — killed past its bound, or refused on one — before the lock is let go, so the
        folder's next job is not refused on them."""
        self.clear_stale_once(shadow, cwd)
        try:
            yield
        except GitUnavailable as exc:
            if exc.stale_locks:
                shadow.clear_stale_locks(Path(cwd))
            raise

    def submit(self, pool: Executor, cwd: str, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` on `pool` holding `cwd`'s (resolved) lock, parked while another job of
        that directory holds it (`FolderLock.submit`); `fn` works within `holding`."""
        with self._using(cwd) as lock:
            return lock.submit(pool, fn, *args)

    def now_or_parked(self, pool: Executor, cwd: str, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)` now, on this (pool) thread, holding `cwd`'s lock if it is free; else
        parked on the lock (`submit`) and None: a sweep never waits on a busy folder."""
        with self._using(cwd) as lock:
            if not lock.acquire(blocking=False):
                lock.submit(pool, fn, *args)
                return None
        try:
            return fn(*args)
        finally:
            lock.release()

    def try_acquire(self, real: str) -> FolderLock | None:
        """`real`'s lock acquired if it is free (the caller releases it), else None."""
        with self._using(real) as lock:
            return lock if lock.acquire(blocking=False) else None


class _Job:
    """One checkpoint job and its `Future`: run on a pool thread unless cancelled first."""

    __slots__ = ("args", "fn", "future")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.future: Future[Any] = Future()

    def __call__(self) -> None:
        future = self.future
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - the future carries it to its reader
            future.set_exception(exc)
        else:
            future.set_result(result)
        del self.fn, self.args


class CheckpointPool(Executor):
    """The threads every checkpoint job of a daemon runs on (`domain.wake_one.WakeOneThreads`:
    started on demand, each job waking ONE idle thread, the one idle last). The jobs' callers
    read `Future`s (the Turn waits on its captures' `result`, the janitor chains the next sweep
    with `add_done_callback`), so this is the smallest `Executor` that gives them: `submit` and
    `shutdown(wait, cancel_futures)`, no private attribute of `ThreadPoolExecutor` patched.
    On the executor's `SimpleQueue` every idle thread waited on the queue's one lock, which its
    `get` hands on as it returns: with both threads idle, each job woke both
    (`tests/actors/test_checkpoint_pool.py`)."""

    def __init__(self, threads: int = CAPTURE_THREADS) -> None:
        self._threads = WakeOneThreads(threads, "agenthost-checkpoint")

    @property
    def threads(self) -> list[threading.Thread]:
        return self._threads.threads

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run `fn(*args)` on a pool thread; `RuntimeError` once shut down."""
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        job = _Job(fn, args)
        self._threads.submit(job)
        return job.future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more jobs; the queued ones run first (cancelled instead with `cancel_futures`);
        `wait`: until every thread has ended."""
        for job in self._threads.shutdown(wait=wait, drop=cancel_futures):
            if isinstance(job, _Job):
                job.future.cancel()


def checkpoint_pool(threads: int = CAPTURE_THREADS) -> CheckpointPool:
    """The threads every checkpoint job of a daemon runs on (`CheckpointPool`)."""
    return CheckpointPool(threads)


@dataclass(eq=False)
class TurnCheckpoints:
    """The daemon's captures of Turns' working directories (one per daemon, on
    `HostContext.turn_checkpoints`); `shadow` is the one `ShadowStore` of the home."""

    shadow: ShadowStore
    pool: Executor = field(default_factory=checkpoint_pool)
    locks: DirectoryLocks = field(default_factory=DirectoryLocks)
    # `host.checkpoint.before|after`, hit on the checkpoint thread before each capture.
    failpoints: Failpoints | None = None
    # Per folder as the Session names it (its `cwd`, unresolved: a paused folder is refused
    # with no `lstat`): until when its `after` captures stay on the pool
    # (`capture_after_here`).
    _here_paused: dict[str, float] = field(default_factory=dict)
    # Per folder (as `_here_paused`): its captures here that overran the budget in a row.
    _here_slow: dict[str, int] = field(default_factory=dict)

    @property
    def bound_s(self) -> float:
        """How long a Turn waits for a capture before it is recorded `timed_out`."""
        return self.shadow.timeout_s

    @staticmethod
    def resolve(cwd: str) -> str:
        """`cwd`'s real path: the key of its folder's lock and shadow repository. A Turn's
        capture resolves it once (an `lstat` a path component) and passes it to
        `capture_*_here` and, if they refuse, to `capture`."""
        return os.path.realpath(cwd)

    def capture(
        self,
        cwd: str,
        session_id: str,
        turn_id: str,
        which: str,
        before: str | None = None,
        *,
        real: str | None = None,
    ) -> Future[Capture]:
        """Capture `cwd` on the pool and keep it under its Turn's ref; `before` (a tree):
        the answer lists the files changed since it; `real`: `resolve(cwd)` when the caller
        has it. The future never fails."""
        real = os.path.realpath(cwd) if real is None else real
        args = (real, session_id, turn_id, which, before)
        if self._point_armed(f"host.checkpoint.{which}"):
            fut = self._past_failpoint(args)
        else:
            fut = self.locks.submit(self.pool, real, self._run, *args)
        if fut.cancelled():  # the pool is shut down: the daemon is closing
            done: Future[Capture] = Future()
            done.set_result(
                Capture.missing(cwd, "shutting_down", "the daemon is stopping; no checkpoint")
            )
            return done
        return fut

    def capture_after_here(
        self, cwd: str, session_id: str, turn_id: str, before: str | None, real: str | None = None
    ) -> Capture | None:
        """A Turn's `after` capture taken on the caller's thread when it is cheap and certain:
        the directory is free (no other job of it runs), its stat snapshot is small
        (`HERE_MAX_ENTRIES`) and unchanged, so no process starts, the tree is `before`'s
        (no diff to run) and its ref is there already (`commit_ref`: no file written).
        None: take it on the pool (`capture`), as always when the `host.checkpoint.after`
        failpoint is armed or the directory's last captures here were slow (`HERE_BUDGET_S`,
        `HERE_SLOW_RUN`). The Session actor asks here first: on the pool the capture costs
        two thread hops on the settlement's path (actor → pool → actor)."""
        return self._here(cwd, session_id, turn_id, "after", before, real)

    def capture_before_here(
        self, cwd: str, session_id: str, turn_id: str, real: str | None = None
    ) -> Capture | None:
        """A Turn's `before` capture taken on the caller's thread when it is as cheap and
        certain as `capture_after_here`'s: the directory free, its small stat snapshot
        unchanged (no process), and the Session's ref of that tree known to be there (its
        previous Turn named it: no file written). None: take it on the pool (`capture`), as
        always when `host.checkpoint.before` is armed. The Session actor asks here before
        the claim: on the pool, beside the claim's COMMIT, it costs a thread's wake-up and
        the interpreter's hand-offs; here ~0.1 ms of `lstat`s."""
        return self._here(cwd, session_id, turn_id, "before", None, real)

    def _here(
        self,
        cwd: str,
        session_id: str,
        turn_id: str,
        which: str,
        before: str | None,
        real: str | None = None,
    ) -> Capture | None:
        if self._point_armed(f"host.checkpoint.{which}") or self._here_paused.get(cwd, 0.0) > (
            time.monotonic()
        ):
            return None  # a paused folder is refused before it is resolved (ckpt)
        real = os.path.realpath(cwd) if real is None else real
        if not self.locks.cleared(real):
            return None
        lock = self.locks.try_acquire(real)
        if lock is None:
            return None
        started = time.monotonic()
        try:
            path = Path(real)
            checkpoint = self.shadow.capture_unchanged(path, real, HERE_MAX_ENTRIES)
            if checkpoint is None or (before is not None and before != checkpoint.tree):
                return None
            if which == "before":
                # Only a ref already there: writing one here would lengthen the claim.
                name = commit_ref(session_id, checkpoint.commit)
                if not self.shadow.names_ref(real, name):
                    return None
                self.locks.pins.pin(real, name, session_id, turn_id, False)
            else:
                self._keep(path, real, session_id, turn_id, checkpoint)
            return Capture(real, checkpoint)
        except Exception as exc:  # noqa: BLE001 - the pool's capture answers instead
            log.info("checkpoint of %s (%s) left to the pool: %s", real, which, exc)
            return None
        finally:
            lock.release()
            if time.monotonic() - started <= HERE_BUDGET_S:
                if self._here_slow:
                    self._here_slow.pop(cwd, None)
            elif (slow := self._here_slow.get(cwd, 0) + 1) < HERE_SLOW_RUN:
                if len(self._here_slow) >= HERE_KEPT:
                    self._here_slow.clear()  # at worst, one folder's pause comes later
                self._here_slow[cwd] = slow
            else:
                self._here_slow.pop(cwd, None)
                now = time.monotonic()
                # Only folders paused now are kept: a removed tree's ended pause goes here.
                for ended in [k for k, until in list(self._here_paused.items()) if until <= now]:
                    self._here_paused.pop(ended, None)
                self._here_paused[cwd] = now + HERE_PAUSE_S

    def _past_failpoint(self, args: tuple[str, str, str, str, str | None]) -> Future[Capture]:
        """A capture whose `host.checkpoint.<which>` failpoint may act: hit on a pool thread
        before the folder's lock is asked for (a point that sleeps holds a thread, never the
        folder), then the capture as `capture` takes it."""
        real, which = args[0], args[3]
        outer: Future[Capture] = Future()

        def _copy(inner: Future[Capture]) -> None:
            if inner.cancelled():
                outer.set_result(Capture.missing(real, "shutting_down", "the daemon is stopping"))
            else:
                outer.set_result(inner.result())

        def _hit() -> None:
            if not outer.set_running_or_notify_cancel():
                return  # its Turn stopped waiting
            try:
                assert self.failpoints is not None
                self.failpoints.hit(f"host.checkpoint.{which}")
            except Exception as exc:  # noqa: BLE001 - a checkpoint never fails a Turn
                log.warning("checkpoint of %s (%s) failed: %s", real, which, exc)
                reason = str(getattr(exc, "reason", "git_failed"))
                outer.set_result(Capture.missing(real, reason, f"the checkpoint failed: {exc}"))
                return
            self.locks.submit(self.pool, real, self._run, *args).add_done_callback(_copy)

        try:
            self.pool.submit(_hit)
        except RuntimeError:
            outer.cancel()
        return outer

    def _point_armed(self, name: str) -> bool:
        """A failpoint may act at `name` (a registry that cannot say counts as armed)."""
        if self.failpoints is None:
            return False
        armed = getattr(self.failpoints, "armed", None)
        return armed is None or name in armed

    def settled(self, session_id: str, turn_id: str) -> None:
        """The Turn's settlement landed (its record names what it needs), or it never will:
        the refs its captures kept are no longer pinned for it (`RefPins`)."""
        self.locks.pins.settled(session_id, turn_id)

    def _keep(
        self, path: Path, real: str, session_id: str, turn_id: str, checkpoint: Checkpoint
    ) -> None:
        """Keep `checkpoint` by its Session's `commit_ref` (written only if not there yet)
        and pin it for the Turn; within the directory lock's hold."""
        name = commit_ref(session_id, checkpoint.commit)
        written = self.shadow.keep_commit(path, name, checkpoint.commit, real, checked=True)
        self.locks.pins.pin(real, name, session_id, turn_id, written)

    def discard(
        self, capture: Future[Capture], cwd: str, session_id: str, turn_id: str, which: str
    ) -> None:
        """`capture` was taken for a Turn that was never created (the claim it ran beside
        answered an earlier Turn, or failed): once it has kept its ref, drop that ref if this
        capture wrote it and no other Turn named it since (`RefPins.discardable`). Until then
        record)."""

        def _drop(_: Future[Capture]) -> None:
            # A pool shut down (the daemon is closing) leaves the ref, as space.
            real = os.path.realpath(cwd)
            self.locks.submit(self.pool, real, self._drop_refs, real, session_id, turn_id)

        capture.add_done_callback(_drop)

    def _drop_refs(self, real: str, session_id: str, turn_id: str) -> None:
        names: list[str] = []
        try:
            with self.locks.holding(self.shadow, real):
                keys = self.locks.pins.discardable(session_id, turn_id)
                names = [name for where, name in keys if where == real]
                if names:
                    self.shadow.drop_refs(Path(real), names)
        except Exception as exc:  # noqa: BLE001 - an unnamed ref costs space, nothing else
            log.warning("dropping the unused checkpoint refs %s of %s failed: %s", names, real, exc)

    def _run(
        self, real: str, session_id: str, turn_id: str, which: str, before: str | None
    ) -> Capture:
        """One capture on a pool thread, holding `real`'s lock (`DirectoryLocks.submit`)."""
        try:
            with self.locks.holding(self.shadow, real):
                path = Path(real)
                checkpoint = self.shadow.capture(path, real)
                if isinstance(checkpoint, Unavailable):
                    return Capture(real, checkpoint)
                # One ref a tree per Session: an unchanged folder's is there already.
                self._keep(path, real, session_id, turn_id, checkpoint)
                changed: tuple[dict[str, str], ...] = ()
                if before is not None and before != checkpoint.tree:  # equal: nothing changed
                    changed = tuple(
                        {"path": c.path, "kind": c.kind.value}
                        for c in self.shadow.changed_files(path, before, checkpoint.tree)
                    )
                return Capture(real, checkpoint, changed)
        except Exception as exc:  # noqa: BLE001 - a checkpoint never fails a Turn
            reason = getattr(exc, "reason", "git_failed")
            log.warning("checkpoint of %s (%s) failed: %s", real, which, exc)
            return Capture.missing(real, str(reason), f"the checkpoint failed: {exc}")


CAP_BATCH = 16
"""Turns whose checkpoints the size cap drops between two collections and measures."""
CAP_SCAN = 10_000
"""Turns one sweep considers dropping at most (the oldest; the next sweep goes on)."""
DROPPED_MESSAGE = (
    "this checkpoint was dropped to keep the checkpoint store under max_store_bytes"
    " ([workspace] in agenthost.toml); older Turns' checkpoints go first"
)


class DroppableCheckpoints(Protocol):
    """`store.turns`: the checkpoints the size cap may drop, and the drop."""

    def droppable_checkpoints(self, limit: int = 64) -> list[tuple[str, str, str, str]]: ...

    def mark_checkpoint_dropped(
        self, ws: str, sid: str, turn_id: str, seen_json: str, message: str
    ) -> bool: ...

    def session_checkpoint_trees(self, ws: str, sid: str) -> set[str]: ...


class CheckpointStore(Protocol):
    @property
    def sessions(self) -> DeletedSessions: ...

    @property
    def turns(self) -> DroppableCheckpoints: ...


@dataclass(eq=False)
class CheckpointJanitor:
    """The space checkpoints take: a deleted Session's refs are dropped (at its delete, and
    by every sweep, which also finishes a delete a crash interrupted), and what no ref keeps
    any more is collected (`git gc`) on a schedule of the daemon's timer service. Its git
    work runs on the checkpoint threads, never on the timer's."""

    shadow: ShadowStore
    store: CheckpointStore
    pool: Executor
    locks: DirectoryLocks
    interval_s: float
    # The store's size cap in bytes (0: none): over it, a sweep drops the oldest Turns'
    # checkpoints (never one a fork not yet finished goes through) until under it.
    max_bytes: int = 0
    call_later: Callable[[float, Callable[[], None]], Any] | None = None
    _dirty: set[str] = field(default_factory=set)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _size: tuple[float, int] | None = None
    _size_known: int | None = None
    """The last size a walk measured (kept past `SIZE_CACHE_S`: `size_bytes`'s late answer)."""
    _walk: threading.Event | None = None
    """The size walk running now (set when it ends), if one is, and when it started."""
    _walk_started: float = 0.0
    _closed: bool = False
    sweeps: int = 0
    capped: int = 0
    """Turns whose checkpoints the size cap dropped since the start."""

    def start(self, call_later: Callable[[float, Callable[[], None]], Any]) -> None:
        """The first sweep soon after the start (it finishes drops a killed daemon left),
        then one every `interval_s`."""
        self.call_later = call_later
        self._schedule(min(self.interval_s, FIRST_SWEEP_S))

    def _schedule(self, delay: float | None = None) -> None:
        if self.call_later is not None and not self._closed:
            self.call_later(self.interval_s if delay is None else delay, self._tick)

    def _tick(self) -> None:
        """On the timer thread: hand the sweep to a checkpoint thread, then come back."""
        try:
            fut = self.pool.submit(self.sweep)
        except RuntimeError:
            return  # the pool is shut down: the daemon is closing
        fut.add_done_callback(lambda _f: self._schedule())

    def drop_session(self, cwd: str, session_id: str) -> Future[int]:
        """A deleted Session's refs in `cwd`'s store go now (collected at the next sweep)."""
        real = os.path.realpath(cwd)
        fut = self.locks.submit(self.pool, real, self._drop, real, {session_ref_prefix(session_id)})
        if fut.cancelled():  # the daemon is closing: the next start's sweep drops them
            done: Future[int] = Future()
            done.set_result(0)
            return done
        return fut

    def _drop(self, cwd: str, prefixes: set[str]) -> int:
        """Holding `cwd`'s lock: drop the refs under `prefixes`."""
        try:
            with self.locks.holding(self.shadow, cwd):
                doomed = [r for r in self.shadow.refs(Path(cwd)) if r.split("/", 1)[0] in prefixes]
                dropped = self.shadow.drop_refs(Path(cwd), doomed)
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("dropping checkpoints in %s failed: %s", cwd, exc)
            return 0
        finally:
            self._retire_if_gone(cwd)
        if dropped:
            with self._guard:
                self._dirty.add(cwd)
        return dropped

    def sweep(self) -> dict[str, int]:
        """Drop every deleted Session's refs, then collect each store that lost some."""
        try:
            deleted = {
                session_ref_prefix(sid) for _ws, sid in self.store.sessions.deleted_sessions()
            }
        except Exception as exc:  # noqa: BLE001 - a busy store: the next sweep tries again
            log.warning("checkpoint sweep could not read deleted sessions: %s", exc)
            deleted = set()
        dropped = 0
        if deleted:
            for workdir in self.shadow.workdirs():
                # A busy folder's drop waits parked on it (not on this thread).
                where = str(workdir)
                dropped += (
                    self.locks.now_or_parked(self.pool, where, self._drop, where, deleted) or 0
                )
        # What a kill left half-made or half-removed goes; a folder gone (a removed worktree
        # fork's tree) whose refs are all dropped: its shadow repository goes (a collection
        # keeps what its shadow index names).
        self.shadow.clear_leftovers()
        gone = [str(w) for w in self.shadow.workdirs() if not os.path.lexists(w)]
        for where in gone:
            self.locks.now_or_parked(self.pool, where, self._discard, where)
        collected = self._collect()
        # Every other store is packed once git's own thresholds say so: one that lost no
        # refs (a long-lived Session's folder) kept each capture's objects loose for good.
        for workdir in self.shadow.workdirs():
            where = str(workdir)
            if os.path.lexists(where):
                self.locks.now_or_parked(self.pool, where, self._pack, where)
        capped = self._cap() if self.max_bytes > 0 else 0
        self._size = None
        self.sweeps += 1
        return {"dropped": dropped, "collected": collected, "capped": capped}

    def _collect(self) -> int:
        """`git gc` every store that lost refs since the last collection (a busy folder's
        waits parked on it, not on this thread); returns how many ran here."""
        with self._guard:
            dirty, self._dirty = self._dirty, set()
        collected = 0
        for cwd in sorted(dirty):
            collected += self.locks.now_or_parked(self.pool, cwd, self._gc, cwd) or 0
        return collected

    def _discard(self, cwd: str) -> int:
        """Holding `cwd`'s lock, its folder gone: remove its shadow repository if no ref is
        left in it (`ShadowStore.discard`); 1 when it went."""
        try:
            with self.locks.holding(self.shadow, cwd):
                if os.path.lexists(cwd) or not self.shadow.discard(Path(cwd)):
                    return 0
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("removing the checkpoints of gone %s failed: %s", cwd, exc)
            return 0
        finally:
            self._retire_if_gone(cwd)
        with self._guard:
            self._dirty.discard(cwd)
        return 1

    def _pack(self, cwd: str) -> None:
        """Holding `cwd`'s lock: `ShadowStore.pack` (the next sweep tries again on a failure)."""
        try:
            with self.locks.holding(self.shadow, cwd):
                self.shadow.pack(Path(cwd))
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("packing checkpoints of %s failed: %s", cwd, exc)
        finally:
            self._retire_if_gone(cwd)

    def _gc(self, cwd: str) -> int:
        """Holding `cwd`'s lock: `git gc` its store (kept dirty on a failure)."""
        try:
            with self.locks.holding(self.shadow, cwd):
                self.shadow.gc(Path(cwd))
        except Exception as exc:  # noqa: BLE001 - kept dirty: the next sweep tries again
            log.warning("collecting checkpoints of %s failed: %s", cwd, exc)
            with self._guard:
                self._dirty.add(cwd)
            return 0
        finally:
            self._retire_if_gone(cwd)
        return 1

    def _retire_if_gone(self, cwd: str) -> None:
        """Holding `cwd`'s lock: a folder gone (a removed worktree fork's tree, whose drop
        follows its Session's delete) keeps no lock or cache entry (`retire_held`); its
        shadow repository stays until a sweep finds no ref left in it (`_discard`)."""
        if not os.path.lexists(cwd):
            self.locks.retire_held(self.shadow, cwd)

    def _cap(self) -> int:
        """Over `max_bytes`: drop the oldest Turns' checkpoints a batch at a time, collecting
        and measuring after each, until under it. Each Turn is first recorded `unavailable:
        dropped` (refused while a fork not yet finished goes through it), then its refs go;
        returns how many Turns lost theirs."""
        if self.shadow.size_bytes() <= self.max_bytes:
            return 0
        try:
            candidates = self.store.turns.droppable_checkpoints(CAP_SCAN)
        except Exception as exc:  # noqa: BLE001 - a busy store: the next sweep tries again
            log.warning("checkpoint size cap could not read the Turns: %s", exc)
            return 0
        capped = 0
        for start in range(0, len(candidates), CAP_BATCH):
            for ws, sid, turn_id, seen in candidates[start : start + CAP_BATCH]:
                capped += self._drop_turn(ws, sid, turn_id, seen)
            self._collect()
            if self.shadow.size_bytes() <= self.max_bytes:
                break
        if capped:
            log.info("dropped %d Turns' checkpoints to keep under max_store_bytes", capped)
        return capped

    def _drop_turn(self, ws: str, sid: str, turn_id: str, seen: str) -> int:
        try:
            record = json.loads(seen)
            cwd = os.path.realpath(str(record["cwd"]))
            if not self.store.turns.mark_checkpoint_dropped(
                ws, sid, turn_id, seen, DROPPED_MESSAGE
            ):
                return 0  # a fork goes through it now, or its record changed
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("could not drop the checkpoint of turn %s: %s", turn_id, exc)
            return 0
        self.capped += 1  # sweeps run one at a time
        names = [checkpoint_ref(sid, turn_id, which) for which in ("before", "after")]
        trees = {str(record[w]) for w in ("before", "after") if record.get(w)}
        # A busy folder's drop waits parked on it (not on this thread).
        self.locks.now_or_parked(
            self.pool, cwd, self._drop_turn_refs, cwd, ws, sid, turn_id, names, trees
        )
        return 1

    def _drop_turn_refs(
        self, cwd: str, ws: str, sid: str, turn_id: str, names: list[str], trees: set[str]
    ) -> None:
        """Holding `cwd`'s lock: drop a capped Turn's refs (its Session's tree refs only
        when no other Turn needs them)."""
        shared = [commit_ref(sid, tree) for tree in sorted(trees)]
        try:
            with self.locks.holding(self.shadow, cwd):
                kept = set(self.shadow.refs(Path(cwd)))
                # A Session's tree ref goes only when no Turn of it needs it: pinned by a
                # Turn in flight (read first: a pin goes only once its record is durable,
                # so the read of the records after it sees that record), or named by a
                # record not dropped.
                pinned = self.locks.pins.pinned(cwd, shared)
                needed = self.store.turns.session_checkpoint_trees(ws, sid)
                names += [
                    commit_ref(sid, tree)
                    for tree in sorted(trees)
                    if tree not in needed and commit_ref(sid, tree) not in pinned
                ]
                self.shadow.drop_refs(Path(cwd), [n for n in names if n in kept])
        except Exception as exc:  # noqa: BLE001 - an unnamed ref: only space, never wrong
            log.warning("dropping the checkpoint refs of turn %s failed: %s", turn_id, exc)
            return
        with self._guard:
            self._dirty.add(cwd)

    def size_bytes(self, wait: float | None = None) -> int | None:
        """The checkpoint store's size on disk (walked at most every few seconds). With
        `wait`, the bounded form `host.status` uses: a walk runs on a thread of its own, one
        at a time (never two walks of one store at once, whoever asks), and is waited for
        until `wait` seconds after its start at most; past that the last size measured is
        answered (None: never measured yet) and `size_late` is True until a walk ends."""
        now = time.monotonic()
        cached = self._size
        if cached is not None and now - cached[0] < SIZE_CACHE_S:
            return cached[1]
        if wait is None:
            size = self.shadow.size_bytes()
            self._size = (now, size)
            self._size_known = size
            return size
        with self._guard:
            walk = self._walk
            if walk is None:
                walk = self._walk = threading.Event()
                self._walk_started = now
                threading.Thread(
                    target=self._walk_size, args=(walk,), name="agenthost-ck-size", daemon=True
                ).start()
            started = self._walk_started
        # Waited `wait` from the walk's start, not from this ask: once late, at once.
        walk.wait(max(0.0, started + wait - now))
        return self._size_known

    @property
    def size_late(self) -> bool:
        """Whether a walk of the store's size is running past `size_bytes`'s wait."""
        walk = self._walk
        return walk is not None and not walk.is_set()

    def _walk_size(self, walk: threading.Event) -> None:
        size: int | None = None
        try:
            size = self.shadow.size_bytes()
        except Exception as exc:  # noqa: BLE001 - the last size stands; the next ask walks again
            log.warning("measuring the checkpoint store failed: %s", exc)
        if size is not None:
            self._size = (time.monotonic(), size)
            self._size_known = size
        with self._guard:
            self._walk = None
        walk.set()

    def close(self) -> None:
        self._closed = True
