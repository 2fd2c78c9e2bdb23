"""Start-up recovery of fork operations left non-terminal by a previous process (seed 000 §10).

Runs before the daemon serves requests (together with `settle_orphaned_turns`):
`prepared` → failed (fence and reservation released), `dispatching` → unknown (no provider
call: the request may have left), both for the whole store in one transaction;
`provider_accepted` → commit, listed by key and committed many to a transaction. Terminal rows
are untouched; a committed-but-unACKed operation keeps its barrier. Past a bound, the
`provider_accepted` commits are left to `DeferredCommits`, which makes them after the ready line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from actors.store_ports import RestartRuleStore, StartupRecoveryStore
from domain.errors import StoreBusy
from domain.fork_states import ForkStatus, after_restart
from domain.interrupts import HOST_RESTART_ERROR
from storage.models import ForkOperation, LeftoverCommit
from storage.sqlite import disk_error, typed_store_error

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    failed: int = 0
    unknown: int = 0
    committed: int = 0
    errors: int = 0
    deferred: tuple[LeftoverCommit, ...] = ()
    """`provider_accepted` leftovers past `commit_before_ready`, left for `DeferredCommits`."""


COMMITS_BEFORE_READY = 16
"""How many `provider_accepted` leftovers a start commits before its ready line (each a whole
child; ~1-2 ms apiece on a 2-core host at 100 Messages): a few crashed forks are committed
before any request as always, a store with thousands of them is served first (`DeferredCommits`)."""

DEFERRED_BATCH_S = 0.02
"""The CPU one transaction of `DeferredCommits` aims to spend holding the writer: enough that
the COMMIT (an fsync) is paid once for ~15-20 leftovers of 100 Messages, not once per 8, and
about what a big fork's own commit holds it; a client's write queued meanwhile goes first at
the next transaction (the commits are background writes)."""
DEFERRED_BATCH_MAX = 256
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
"""The backoff of a `DeferredCommits` batch the store refused: doubling from the first, at most
the last (the fork saga's and `fork.resolve`'s deferred writes use the same)."""

PREPARED_ERROR = "not dispatched before the host restarted"
DISPATCHING_ERROR = "dispatch outcome lost with the previous host process"


def apply_restart_rule(
    store: RestartRuleStore,
    op: ForkOperation,
    *,
    prepared_error: str = PREPARED_ERROR,
    dispatching_error: str = DISPATCHING_ERROR,
) -> ForkOperation:
    """The restart rule (`domain.fork_states.after_restart`) applied to one operation that no
    live saga owns: `prepared` → failed, `dispatching` → unknown (never re-sent),
    `provider_accepted` → committed; a terminal operation is returned as it is. Used by
    `fork.get` on a leftover and by a saga's abort; start-up recovery applies the same rule
    to every leftover's status change at once (`Store.settle_leftover_fork_statuses`) and to
    the commits many to a transaction (`commit_fork_operations`)."""
    ws, op_id = op.workspace_id, op.operation_id
    to = after_restart(op.status)
    if to is ForkStatus.FAILED:
        return store.fork_transitions.mark_fork_failed(ws, op_id, prepared_error)[0]
    if to is ForkStatus.UNKNOWN:
        return store.fork_transitions.mark_fork_unknown(ws, op_id, dispatching_error)[0]
    if to is ForkStatus.COMMITTED:
        return store.fork_commit.commit_fork(ws, op_id)[0]
    return op


def recover_fork_operations(
    store: StartupRecoveryStore,
    *,
    page_size: int = 500,
    commit_before_ready: int | None = None,
    hit: Callable[[str], None] | None = None,
) -> RecoveryReport:
    """Every leftover settled; with `commit_before_ready`, only that many `provider_accepted`
    commits are made here and the rest are returned in `deferred` (each a whole child: the
    part of a start that grows with the store, see `DeferredCommits`). The commits made here
    go `page_size` to a transaction, each in its own savepoint (a bad one is rolled back alone).
    `hit`: the failpoint `host.recovery.before_commits` (the statuses settled, the
    `provider_accepted` leftovers listed, none committed yet)."""
    # The two pure status changes first, for every leftover at once (one transaction, one
    # fsync, no row decoded); what is left active then is only `provider_accepted`, listed by
    # key (the commit reads each row itself).
    # Each transaction the store refuses (busy, full) is tried again (`start_write`): it
    # rolled back whole, and each is idempotent.
    failed, unknown = start_write(
        lambda: store.fork_recovery.settle_leftover_fork_statuses(
            prepared_error=PREPARED_ERROR, dispatching_error=DISPATCHING_ERROR
        ),
        "settling leftover fork operations",
    )
    leftovers = store.fork_recovery.leftover_commits()
    bound = len(leftovers) if commit_before_ready is None else max(0, commit_before_ready)
    now, deferred = leftovers[:bound], leftovers[bound:]
    if hit is not None and now:
        hit("host.recovery.before_commits")
    committed = errors = 0
    step = max(1, page_size)
    for i in range(0, len(now), step):
        page_committed, page_errors = start_write(
            partial(store.fork_commit.commit_fork_operations, now[i : i + step]),
            "committing leftover fork operations",
        )
        committed += page_committed
        errors += page_errors
    return RecoveryReport(failed, unknown, committed, errors, tuple(deferred))


def recover_resolutions(store: StartupRecoveryStore) -> tuple[int, int]:
    """Start-up, after `recover_fork_operations`: each half-done `fork.resolve` finished (its
    operation moved on) or rolled back; (done, rolled). One transaction, which the store may
    refuse (busy, full): tried again by `start_write`, as start-up's other writes are."""
    return start_write(store.resolution.recover_fork_resolutions, "recovering fork resolutions")


class DeferredCommits:
    """The `provider_accepted` leftovers start-up recovery did not commit before the ready
    line, committed on a thread of their own after it. They are background writes (a client's
    write queued meanwhile goes first, `storage.sqlite.Baton`), each transaction sized to hold the
    writer about `DEFERRED_BATCH_S` (from `batch` at first, then from the last one's pace), so
    thousands of leftovers pay tens of COMMITs, not hundreds. Until its commit a leftover is
    what an operation between its provider's acceptance and its commit always is: its source
    fenced, `fork.get` answering `provider_accepted` — and that `fork.get` commits it at once
    itself (the restart rule, `fork_saga.advance_leftover`), the same idempotent commit as
    here (law 2). A transaction the store refuses (busy, full) is tried again with backoff
    until it lands or the daemon stops: a leftover is never left fencing its source until a
    restart (docs/design/fork-saga.md)."""

    def __init__(
        self,
        store: StartupRecoveryStore,
        ops: Sequence[LeftoverCommit],
        *,
        batch: int = 8,
        batch_s: float = DEFERRED_BATCH_S,
        batch_max: int = DEFERRED_BATCH_MAX,
    ) -> None:
        self._store = store
        self._ops = list(ops)
        self._batch = max(1, batch)
        self._batch_s = batch_s
        self._batch_max = max(self._batch, batch_max)
        self._stop = threading.Event()
        self._done = threading.Event()
        self.committed = 0
        self.errors = 0
        self.transactions = 0
        self.retries = 0
        """Batches the store refused (busy, full), each tried again after a backoff."""
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Leftovers not yet committed by this thread."""
        return len(self._ops)

    def start(self) -> None:
        if not self._ops:
            self._done.set()
            return
        self._thread = threading.Thread(
            target=self._run, name="agenthost-recovery-commits", daemon=True
        )
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Stop between two batches (what is left stays `provider_accepted`: the next start
        or a `fork.get` commits it) and wait for the one under way."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _next_size(self, size: int, cpu_s: float) -> int:
        """The next transaction's size: this one's scaled to `batch_s` of this thread's CPU
        (not wall time, which a loaded host stretches and would shrink the batches back to
        one fsync per few commits), at most doubling at a time, never below `batch`."""
        fit = self._batch_max if cpu_s <= 0 else int(size * self._batch_s / cpu_s)
        return max(self._batch, min(self._batch_max, size * 2, fit))

    def _run(self) -> None:
        started = time.monotonic()
        size = self._batch
        try:
            with self._store.db.background():
                delay = RETRY_FIRST_S
                while self._ops and not self._stop.is_set():
                    batch = self._ops[:size]
                    cpu = time.thread_time()
                    try:
                        committed, errors = self._store.fork_commit.commit_fork_operations(batch)
                    except Exception as exc:  # noqa: BLE001 - retried until it lands or a stop
                        # Each leftover fences its source until committed: a batch the store
                        # refused (busy, full) is tried again, never dropped until a restart.
                        log.warning(
                            "deferred recovery commits of %d leftover(s) failed (%r);"
                            " retrying in %.2f s",
                            len(batch),
                            exc,
                            delay,
                        )
                        self.retries += 1
                        self._stop.wait(delay)
                        delay = min(RETRY_MAX_S, delay * 2)
                        continue
                    delay = RETRY_FIRST_S
                    self._ops = self._ops[size:]
                    size = self._next_size(len(batch), time.thread_time() - cpu)
                    self.transactions += 1
                    self.committed += committed
                    self.errors += errors
            log.info(
                "recovery: %d leftover fork commit(s) made after ready in %.1f s,"
                " %d transaction(s) (%d error(s))",
                self.committed,
                time.monotonic() - started,
                self.transactions,
                self.errors,
            )
        finally:
            self._done.set()


ORPHANED_TURN_ERROR = HOST_RESTART_ERROR


ORPHANED_RETRY_LIMIT_S = 30.0
"""How long start-up retries an orphaned Turn's settlement the store refuses (busy, full)
before the start fails, as its other recovery writes do on a store that stays busy."""


class StartStopped(BaseException):  # noqa: N818 - an outcome the start reports, not a fault
    """A stop signal (SIGTERM, Ctrl-C) came while a start-up write waited for a store another
    process keeps busy: the start ends there instead of waiting out its retry limit. Not an
    `Exception`, as KeyboardInterrupt is not: a step that logs a failed write and goes on with
    the rest must not go on."""

    def __init__(self, what: str) -> None:
        super().__init__(f"stopped while {what} waited for a busy store")


_stop_asked: Callable[[], bool] = lambda: False  # noqa: E731 - the default: never asked


def stop_start_when(asked: Callable[[], bool]) -> None:
    """`asked()` true: a start-up write waiting for a busy store gives up (`StartStopped`).
    Set by `serve` before its start (its signal handlers only flip a flag it reads)."""
    global _stop_asked  # noqa: PLW0603 - the process's one start, told by its one `serve`
    _stop_asked = asked


_tell_waiting: Callable[[str | None], None] = lambda _what: None  # noqa: E731 - nobody told


def tell_store_wait(tell: Callable[[str | None], None]) -> None:
    """`tell(what)`: a start-up write (`what`) waits for a busy store; `tell(None)`: a write
    that waited has landed. Set by `serve` (it publishes the words for clients)."""
    global _tell_waiting  # noqa: PLW0603 - the process's one start, told by its one `serve`
    _tell_waiting = tell


def _sleep_unless_stopped(delay: float) -> bool:
    """Sleep `delay` seconds in short slices; True when a stop was asked meanwhile."""
    deadline = time.monotonic() + delay
    while not _stop_asked():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, 0.05))
    return True


class StoreDiskFull(Exception):
    """A start-up write the store's disk refused: full (SQLITE_FULL), or a write it failed
    (SQLITE_IOERR: past a file size limit, a failing disk). Not another process's lock, which
    a start waits for: nothing frees a disk while the start waits, so it fails at once, saying
    so (`at`: the message naming the store's path, which the daemon adds)."""

    def __init__(self, what: str, detail: str, *, full: bool, path: str | None = None) -> None:
        self.what, self.detail, self.full, self.path = what, detail, full, path
        where = f"the store {path}" if path is not None else "the store"
        if full:
            text = f"the disk holding {where} is full ({what} failed: {detail})"
        else:
            text = (
                f"could not write {where} ({what} failed: {detail}): its disk is full, or failing"
            )
        super().__init__(f"{text}; free some space on that disk and start again")

    def at(self, path: object) -> StoreDiskFull:
        return StoreDiskFull(self.what, self.detail, full=self.full, path=str(path))


def start_write(
    write: Callable[[], T], what: str, *, retry_limit_s: float = ORPHANED_RETRY_LIMIT_S
) -> T:
    """A start-up write the store refuses busy (another process holds its write lock) retried
    with backoff before the ready line; past `retry_limit_s` the start fails (`StoreBusy`, or
    the store's own typed error). One its disk refuses (full, a write error) fails the start
    at once (`StoreDiskFull`): waiting frees no space. Any other error is raised as it is (the
    caller logs it and goes on with the rest)."""
    delay, deadline = RETRY_FIRST_S, time.monotonic() + retry_limit_s
    waited = False
    while True:
        try:
            done = write()
            if waited:
                _tell_waiting(None)
            return done
        except Exception as exc:
            busy = typed_store_error(exc)
            if busy is None:
                raise
            disk = disk_error(exc)
            if disk is not None:
                detail, full = disk
                raise StoreDiskFull(what, detail, full=full) from exc
            if time.monotonic() + delay > deadline:
                raise busy from exc
            log.warning("%s deferred %.2f s: %s", what, delay, busy.message)
            if not waited:
                waited = True
                _tell_waiting(what)
            if _sleep_unless_stopped(delay):
                raise StartStopped(what) from exc
            delay = min(RETRY_MAX_S, delay * 2)


def remove_then_record(
    remove: Callable[[], object], record: Callable[[], object], what: str
) -> bool:
    """A tree removed at start-up, then its record written by `start_write`: True when both
    happened (`record` answered true). A removal or a record that fails for another reason is
    logged and False (one bad tree or row must not stop the rest); a store busy past the bound
    fails the start (`StoreBusy` raised)."""
    try:
        remove()
    except Exception:  # noqa: BLE001 - one bad tree must not stop the rest
        log.exception("could not remove %s", what)
        return False
    try:
        recorded = start_write(record, f"recording the removed {what}")
    except (StoreBusy, StoreDiskFull):
        raise  # the store stayed busy past the bound, or its disk is full: the start fails
    except Exception:  # noqa: BLE001 - one bad row must not stop the rest
        log.exception("could not record the removed %s", what)
        return False
    return bool(recorded)


def settle_orphaned_turns(
    store: StartupRecoveryStore, *, retry_limit_s: float = ORPHANED_RETRY_LIMIT_S
) -> int:
    """Turns left active by a previous process can never receive their provider's events
    (its runtimes died with it): settle them `interrupted`, which also finishes their submit
    claims and supersedes pending Interactions, so the Session takes turns (and forks) again.
    A settlement the store refuses (busy, full) is retried with backoff, never skipped: a
    skipped one left its Session refusing every submit in the live daemon until an interrupt
    or a restart. Past `retry_limit_s` the start fails (`StoreBusy`)."""
    settled = 0
    for ws, sid, turn_id in store.turns.all_active_turns():
        try:
            _, changed = start_write(
                partial(
                    store.turns.settle_turn,
                    ws,
                    sid,
                    turn_id,
                    outcome="interrupted",
                    error=ORPHANED_TURN_ERROR,
                    include_deleted=True,
                ),
                f"settling orphaned turn {sid}/{turn_id}",
                retry_limit_s=retry_limit_s,
            )
        except (StoreBusy, StoreDiskFull):
            raise  # the store stayed busy past the bound, or its disk is full: the start fails
        except Exception:  # noqa: BLE001 - one bad row must not stop the rest
            log.exception("could not settle orphaned turn %s/%s", sid, turn_id)
            continue
        settled += int(changed)
    return settled
