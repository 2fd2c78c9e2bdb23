"""The store's SQLite layer under its owner: one connection as the store opens it, the canonical
JSON of its columns, a raw SQLite failure turned into its typed error, and the write path
`Database.write` (storage/base.py) drives — the writer baton, one open write transaction (`Tx`,
with the source fence checked inside it), group commit's bookkeeping and counters, and one
thread's write batch.

A connection: WAL, `synchronous=FULL`, foreign keys, a busy handler that counts its sleeps; the
transient failures are the retryable 503 `store_busy`."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw

from domain.errors import ForkInProgress, HostError, StoreBusy, StoreCorrupt, internal_error
from domain.fork_states import STAGE_ACTIVE_SQL
from storage.models import ChangeEvent

# -- Connections, JSON columns, typed failures -----------------------------------------------------

BUSY_TIMEOUT_MS = 10_000
# apsw's statement cache per connection, in executions: a ring that every finished execution
# re-enters at its next slot, evicting what was there, so a statement is compiled again unless
# it ran within the last this-many executions (apsw's default 100: a fork after three Turns
# compiled 31 of its statements again on the writer). 512 is apsw's most. It holds at most one
# entry per distinct statement run within the window (the writer ~50); a hit's linear search
# of the ring costs ~0.1 us more than at 100 (docs/design/store.md, "Statements compiled once").
STATEMENT_CACHE_SIZE = 512

Row = tuple[Any, ...]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, UTF-8 kept (hash input for snapshots)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# The transient store failures: the write lock held elsewhere past the busy timeout, a full
# disk, an I/O error, a file SQLite could not open (a statement's temp file or journal refused
# at the descriptor limit). Nothing was written; the caller may retry (503 `store_busy`).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    apsw.BusyError,
    apsw.LockedError,
    apsw.FullError,
    apsw.IOError,
    apsw.CantOpenError,
)


DISK_ERRORS: tuple[type[BaseException], ...] = (apsw.FullError, apsw.IOError)
"""The transient store failures that are the disk's, not another connection's: full
(SQLITE_FULL), or a write it failed (SQLITE_IOERR: a file past its size limit, a failing disk)."""


def disk_error(exc: BaseException) -> tuple[str, bool] | None:
    """The full-disk or I/O error `exc` is or was raised from (a typed `StoreBusy` keeps the
    raw error as its cause): its text and whether SQLite said the disk is full; else None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, DISK_ERRORS):
            return str(seen) or type(seen).__name__, isinstance(seen, apsw.FullError)
        seen = seen.__cause__
    return None


def typed_store_error(exc: BaseException) -> HostError | None:
    """The typed error for a store failure that escaped as a raw apsw exception, or None."""
    if isinstance(exc, StoreBusy):
        return exc
    if isinstance(exc, TRANSIENT_ERRORS):
        return StoreBusy(f"the store is busy or full, try again ({type(exc).__name__})")
    return None


_log = logging.getLogger(__name__)

CORRUPT_ERRORS: tuple[type[BaseException], ...] = (apsw.CorruptError, apsw.NotADBError)
"""SQLite's word that the store file itself is damaged: no retry mends it."""

STORE_CORRUPT_MESSAGE = (
    "the store file is damaged ({}): requests that touch its damaged part fail until it is "
    "repaired; stop the daemon, copy store.sqlite3* aside and recover them "
    "(`sqlite3 store.sqlite3 .recover`, docs/user-guide.md)"
)


def host_error_of(
    failure: object, what: str = "", *, logger: logging.Logger | None = None
) -> HostError:
    """The typed error for any failure on the daemon side: a `HostError` as it is, a raw store
    contention or full-disk error as the retryable 503 `store_busy`, a damaged store file as
    the 500 `store_corrupt` (logged, no traceback), anything else the one 500 of
    `domain.errors.internal_error` (logged with a reference id, its text never sent)."""
    if isinstance(failure, HostError):
        return failure
    if isinstance(failure, BaseException):
        typed = typed_store_error(failure)
        if typed is not None:
            return typed
        if isinstance(failure, CORRUPT_ERRORS):
            said = f"SQLite: {failure}"
            (logger or _log).error(
                "%s%s", f"{what}: " if what else "", STORE_CORRUPT_MESSAGE.format(said)
            )
            return StoreCorrupt(STORE_CORRUPT_MESSAGE.format(said))
    return internal_error(failure, what, logger=logger)


# SQLite's own busy-wait schedule (sqlite3_busy_timeout), in ms: the sleeps between retries.
_BUSY_DELAYS_MS = (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100)


class BusyWaits:
    """A busy handler with SQLite's schedule that also counts its sleeps.

    Inside one store every writer first takes the store's writer lock, so a sleep here means
    the lock is held by *another process* (a backup tool, a second reader gone wrong, a
    test's external writer) — what `host.status`-style tools and tests want to see.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._count = 0
        self._lock = threading.Lock()

    @property
    def sleeps(self) -> int:
        return self._count

    def __call__(self, prior_calls: int) -> bool:
        waited = sum(_BUSY_DELAYS_MS[:prior_calls]) + max(0, prior_calls - 12) * 100
        if waited >= self.timeout_ms:
            return False
        delay = _BUSY_DELAYS_MS[min(prior_calls, len(_BUSY_DELAYS_MS) - 1)]
        with self._lock:
            self._count += 1
        time.sleep(min(delay, self.timeout_ms - waited) / 1000)
        return True


def open_connection(
    path: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS, busy: BusyWaits | None = None
) -> apsw.Connection:
    conn = apsw.Connection(path, statementcachesize=STATEMENT_CACHE_SIZE)
    if busy is None:
        conn.set_busy_timeout(busy_timeout_ms)
    else:
        conn.set_busy_handler(busy)
    # WAL + synchronous=FULL: a COMMIT that returned survives power loss and SIGKILL.
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    # A WAL a long reader made long is cut back when the log restarts (whichever connection
    # restarts it), not kept at its peak size.
    conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}").fetchall()
    # The query planner's stability guarantee: a plan never reads a bound value. apsw's SQLite
    # is built with STAT4, under which a statement whose plan looked at a parameter (a MAX or
    # an ORDER BY ... LIMIT under an equality on it, ~46 of the store's statements) is compiled
    # again whenever that parameter is bound again — at every execution, although the
    # statement cache hits (a submit's claim read ~31 us against ~7). The store has no
    # `sqlite_stat*` tables and writes every partial index's condition as a literal, so no plan
    # changes (docs/design/store.md, "Statements compiled once").
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
    return conn


# -- One write transaction -------------------------------------------------------------------------


class Tx:
    """One open write transaction: the cursor, its clock reading and its pending events."""

    __slots__ = ("conn", "workspace_id", "now_ms", "events", "seq", "_seen")

    def __init__(
        self, conn: apsw.Connection, workspace_id: str | None, now_ms: int, seq: int = 0
    ) -> None:
        self.conn = conn
        self.workspace_id = workspace_id
        self.now_ms = now_ms
        self.events: list[ChangeEvent] = []
        self.seq = seq
        """This write's place in the order the store's writes were made (`Database.write_seq`,
        taken with the writer baton): the order of their commits."""
        self._seen: dict[ChangeEvent, int] = {}

    def execute(self, sql: str, params: Sequence[Any] = ()) -> apsw.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.conn.executemany(sql, rows)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()

    def changes(self) -> int:
        return int(self.conn.changes())

    def emit(self, event: ChangeEvent) -> None:
        # An index beside the list: one transaction may emit the same change many times. A
        # repeat keeps the first one's place and takes what the last one carries (a row it
        # wrote, or none: then a subscriber reads the row back), so a row carried from before
        # a later change of it in this transaction is never the one published. One lookup
        # (`setdefault`): an event's hash is a Python call (a dataclass's), made inside the
        # writer's baton for every change a write emits (and again as a batch takes it).
        events = self.events
        at = self._seen.setdefault(event, len(events))
        if at == len(events):
            events.append(event)
        else:
            events[at] = event

    def check_fence(self, session_id: str) -> None:
        """Fail with `ForkInProgress` if an active fork operation holds `session_id`'s fence.

        Runs inside the caller's write transaction, so no fork can be prepared between the
        check and the write it guards (law 3).
        """
        row = self.one(
            "SELECT operation_id FROM fork_operations WHERE workspace_id = ?"
            " AND source_session_id = ?"
            f" AND {STAGE_ACTIVE_SQL} LIMIT 1",
            (self.workspace_id, session_id),
        )
        if row is not None:
            raise ForkInProgress(
                f"session {session_id} is being forked (operation {row[0]})",
                params={"operationId": row[0], "forkBoundaryReason": "source_fork_active"},
            )


# -- The writer baton ------------------------------------------------------------------------------
# The writer baton: one writer at a time on the store's one writer connection, handed on
# first come, first served: one writer, no busy-handler sleeps.

BACKGROUND_MAX_WAIT_S = 0.1
"""How long a background writer may be overtaken by foreground ones before it goes next."""


class Submission:
    """One write handed to the store as a callable (`Database.submit_write`): the body, what
    it writes under, and what its run gave back. Run by whichever thread holds the baton
    when its turn comes (flat combining), or by its own caller if the baton is handed to it.

    `state`: `QUEUED` until the holder takes it from the queue; `OWNER` when the baton was
    handed to its caller (who runs it as any writer); `DONE` when its result or error is set
    and its group ended (or it failed alone)."""

    QUEUED = 0
    OWNER = 1
    DONE = 2

    __slots__ = (
        "body",
        "workspace_id",
        "fence",
        "durable",
        "state",
        "result",
        "error",
        "tx",
        "group",
        "wake",
    )

    def __init__(
        self,
        body: Callable[[Tx], Any],
        workspace_id: str | None,
        fence: str | None,
        durable: bool,
    ) -> None:
        self.body = body
        self.workspace_id = workspace_id
        self.fence = fence
        self.durable = durable
        self.state = Submission.QUEUED
        self.result: Any = None
        self.error: BaseException | None = None
        self.tx: Tx | None = None
        self.group: WriteGroup | None = None
        self.wake: threading.Lock | None = None
        """Its caller's lock in the baton's queue (None: it never queued)."""

    def done(self) -> None:
        """Wake the caller: its result, its error or its group's end is set."""
        self.state = Submission.DONE
        if self.wake is not None:
            self.wake.release()


class _Entry:
    """A place in the baton's queue: a writer's thread waiting for the baton, or a submitted
    body (`sub`) the holder may run itself. `wake` is released once, when its turn comes."""

    __slots__ = ("thread", "wake", "since", "sub")

    def __init__(self, thread: int, since: float, sub: Submission | None = None) -> None:
        self.thread = thread
        self.wake = threading.Lock()
        self.wake.acquire()
        self.since = since
        self.sub = sub


class Baton:
    """Each queued writer blocks on its own lock and the holder hands the baton to the first
    one only: no herd of waking threads fighting over the GIL and the lock, no writer
    overtaken again and again. `lock` guards the queue (and, for the store, its counters).

    Two queues, each first come, first served: a client's request waits on a *foreground*
    write, while a *background* one (a fork saga's steps after its prepare: `dispatching`,
    `provider_accepted`, the commit) has no request waiting on it, only its own pipeline. A
    foreground writer goes ahead of queued background ones, unless the first of those has
    waited `background_max_wait_s` already: then it goes next, so background writes are
    delayed by at most that, never starved.

    A queue place may be a submitted body (`offer`) instead of a waiting writer: when it is
    next, the holder runs it itself (`next_submission`) without handing the baton on, or, at
    a hand-off, gives the baton to the body's caller. `stats.handoffs` counts the hand-offs
    (each a thread woken to take the baton)."""

    def __init__(self, stats: WriteStats | None = None) -> None:
        self.lock = threading.Condition(threading.Lock())
        self.owner: int | None = None
        self._stats = stats
        self._queue: deque[_Entry] = deque()
        self._background: deque[_Entry] = deque()
        self.background_max_wait_s = BACKGROUND_MAX_WAIT_S
        self._local = threading.local()

    @property
    def waiting(self) -> int:
        return len(self._queue) + len(self._background)

    @contextmanager
    def background(self) -> Iterator[None]:
        """This thread's `take`s in the block queue as background writers: no client request
        waits on them, so a client's write queued meanwhile goes first."""
        held = getattr(self._local, "background", False)
        self._local.background = True
        try:
            yield
        finally:
            self._local.background = held

    def _enqueue(self, me: int, sub: Submission | None) -> _Entry:
        """Under `lock`: a place at the end of this thread's queue."""
        entry = _Entry(me, time.monotonic(), sub)
        if sub is not None:
            sub.wake = entry.wake
        background = getattr(self._local, "background", False)
        (self._background if background else self._queue).append(entry)
        return entry

    def _wait(self, entry: _Entry, timeout_s: float) -> None:
        """Block until `entry`'s turn; past `timeout_s` still queued, leave the queue and raise
        a retryable `StoreBusy` (as a wait on another process's lock ends)."""
        if entry.wake.acquire(timeout=timeout_s):
            return
        with self.lock:
            queue = self._background if entry in self._background else self._queue
            if entry in queue:
                queue.remove(entry)
                raise StoreBusy("the store is busy with other writes, try again")
        entry.wake.acquire()  # taken from the queue just as the wait timed out: it is coming

    def take(self, timeout_s: float) -> None:
        """Become the writer, waiting up to `timeout_s` behind the others (then a retryable
        `StoreBusy`, as a wait on another process's lock ends)."""
        me = threading.get_ident()
        with self.lock:
            if self.owner == me:
                # A write inside a write of the same thread: refused as SQLite refused it.
                raise apsw.SQLError("cannot start a transaction within a transaction")
            if self.owner is None and not self.waiting:
                self.owner = me
                return
            entry = self._enqueue(me, None)
        # `pass_on` makes this thread the owner, then releases its lock.
        self._wait(entry, timeout_s)

    def offer(self, sub: Submission, timeout_s: float) -> None:
        """Queue a submitted body, or take the baton at once if it is free. Returns when the
        caller owns the baton (`sub.state` is `OWNER`: the caller runs its body itself) or
        the body was run by a holder and its group ended (`DONE`)."""
        me = threading.get_ident()
        with self.lock:
            if self.owner == me:
                raise apsw.SQLError("cannot start a transaction within a transaction")
            if self.owner is None and not self.waiting:
                self.owner = me
                sub.state = Submission.OWNER
                return
            entry = self._enqueue(me, sub)
        self._wait(entry, timeout_s)

    def _next(self) -> deque[_Entry] | None:
        """Under `lock`: the queue whose first entry goes next, or None."""
        later = self._background
        if later and (
            not self._queue or time.monotonic() - later[0].since >= self.background_max_wait_s
        ):
            return later
        return self._queue or None

    def next_submission(self) -> Submission | None:
        """The submitted body whose turn is next, taken from the queue for the holder to run
        (the baton stays with it); None if the next in line is a waiting writer or nobody."""
        with self.lock:
            queue = self._next()
            if queue is None or queue[0].sub is None:
                return None
            return queue.popleft().sub

    def pass_on(self) -> None:
        with self.lock:
            queue = self._next()
            if queue is None:
                self.owner = None
                return
            entry = queue.popleft()
            self.owner = entry.thread
            if entry.sub is not None:
                entry.sub.state = Submission.OWNER
            if self._stats is not None:
                self._stats.handoffs += 1
            entry.wake.release()


# -- Group commit's bookkeeping --------------------------------------------------------------------
# Group commit's bookkeeping for `storage.base`: the open group, the write counters tests pin,
# and the optional per-write timings. No SQL here; `Database.write` drives them.

GROUP_MAX_MEMBERS = 32
"""Writes one group commit holds at most: a bound on how long its first member waits."""
GROUP_MAX_AGE_S = 0.020
"""A group open longer than this commits at its next member's end instead of taking more (a
long body, e.g. a 1,000-Turn fork commit, does not hold the writes before it much longer)."""
CHECKPOINT_PAGES = 1000
"""WAL pages after which the background checkpointer copies the WAL into the database (the
size SQLite's own auto-checkpoint uses; it would run inside the COMMIT that crossed it)."""
CHECKPOINT_RETRY_PAGES = 250
"""WAL pages the log grows by, past the mark, before the checkpointer is asked again: a
checkpoint that readers kept from finishing leaves the WAL long (it restarts only once every
frame is copied), and asking at every COMMIT past the mark, as SQLite's auto-checkpoint does,
ran a PASSIVE checkpoint — a few frames copied, the database fsync'd — for nearly every
COMMIT under a steady load of writers and readers."""
WAL_BOUND_PAGES = 16 * CHECKPOINT_PAGES
"""WAL pages past which the checkpointer, after a pass, also restarts the WAL. A PASSIVE
checkpoint copies the frames but never restarts the log: SQLite restarts it only when a write
transaction begins with every frame already copied, and under a steady load of writers the
next group's COMMIT always lands while the checkpoint runs, so the WAL (and its file, and the
index every reader searches) grew without end. Past this length the checkpointer takes the
writer baton once, runs a RESTART checkpoint (the few frames written since its pass copied,
then the log started again as soon as no reader is still on it) and hands the baton on. A bound
for a load without pauses, not a tuning knob: in the mutations benchmark the daemon's WAL
restarted by itself below 5,600 pages without fork load and mostly below 10,300 with it (once
18,864), so past 16 × the mark (64 MB) the writers wait on the checkpointer only when that has
not happened for a long stretch (at 8 × it took the baton once or twice in most fork-load
phases, for 1.9-23 ms on a loaded disk)."""
JOURNAL_SIZE_LIMIT_BYTES = WAL_BOUND_PAGES * (4096 + 24)
"""The size a WAL file is cut back to when the log restarts (`PRAGMA journal_size_limit`). A
read transaction of another process (a backup, a `sqlite3` shell left open) keeps every
checkpoint from finishing, and the WAL grows past its bound for as long as it lasts; SQLite
then starts the log again from the file's beginning but keeps the file at its peak size, for
the daemon's whole life. The bound's worth of 4 KB pages and their frame headers: a WAL that
only ever reaches its ordinary lengths is never cut (and never grown again)."""
RESTART_BUSY_MS = 5
"""How long a RESTART checkpoint waits for readers still on the WAL, with the baton held, before
it gives up (the log then restarts at a later pass)."""
TIMING_ENV = "AGENTHOST_STORE_TIMING"
"""When set to a file path, each write's wait / body / COMMIT / publish times are kept and a
summary per store method is written there as JSON at `close()` (docs/performance.md)."""


class WriteGroup:
    """One shared write transaction: its members' savepoints, committed by one COMMIT."""

    __slots__ = (
        "members",
        "opened",
        "ended",
        "_done",
        "error",
        "lazy",
        "held",
        "released",
        "combined",
    )

    def __init__(self, lazy: bool = False) -> None:
        self.members = 0
        self.lazy = lazy
        """Opened by a `durable=False` write: committed alone, without an fsync."""
        self.held: list[ChangeEvent] = []
        """A lazy group's events: published only after a later fsync'd COMMIT."""
        self.released: list[ChangeEvent] | None = None
        """Earlier lazy groups' events this group's fsync made durable (one member takes them)."""
        self.opened = time.monotonic()
        self.ended = False
        """Committed or lost (`error`); set by the baton's holder that ended it."""
        self._done: threading.Event | None = None
        """What a member left waiting on the open group blocks on (`keep_open`); none for a
        group its own member ended (a writer alone: nobody ever waits)."""
        self.error: BaseException | None = None
        self.combined: list[Submission] = []
        """Members a baton holder ran for their callers (`Database.submit_write`), woken at
        the group's end."""

    def keep_open(self) -> None:
        """By the baton's holder, before it hands the baton on with this group open: its
        members wait for another holder to end it (`wait`)."""
        if self._done is None:
            self._done = threading.Event()

    def wait(self) -> None:
        """Return once the group is committed or lost. A member that ended the group itself
        returns at once; one left waiting blocks on the event `keep_open` made before the
        baton was handed on (so the holder that ends the group sees it and sets it)."""
        if not self.ended:
            done = self._done
            assert done is not None, "a member waits on a group nobody kept open"
            done.wait()

    def end(self) -> None:
        """The group is committed or lost (`error`): wake every member."""
        self.ended = True
        if self._done is not None:
            self._done.set()
        for sub in self.combined:
            sub.done()
        self.combined = []


def passive_checkpoint(conn: apsw.Connection) -> tuple[int, int]:
    """One PASSIVE checkpoint on `conn` (no lock a writer or reader waits on; apsw lets the GIL
    go for its whole length): the WAL's frames and how many of them are now in the database."""
    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return (int(row[1]), int(row[2])) if row is not None else (0, 0)


def restart_checkpoint(conn: apsw.Connection) -> bool:
    """A RESTART checkpoint on `conn`, its writer lock free (the caller holds the writer baton
    with no group open): whether the WAL was restarted (False: a reader kept it, past the
    connection's busy timeout)."""
    row = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
    return row is not None and int(row[0]) == 0


class WriteStats:
    """Counts of the store's writes (what tests pin): `transactions` written (members that
    landed), `commits` (each one fsync'd `COMMIT`), `lazy_commits` (a `durable=False`
    write's COMMIT without an fsync of its own), `rolled_back` member
    savepoints, `group_failures` (a COMMIT or a transaction-aborting error that failed every
    member), `checkpoints` (PASSIVE passes of the checkpointer), `checkpoint_signals` (times the
    WAL hook asked the checkpointer to run), `wal_restarts` (the WAL started again by the
    checkpointer with the baton held, `WAL_BOUND_PAGES`) and `batched` writes (nested
    savepoints of a `write_batch`, inside one member) and `combined` writes (submitted bodies a
    baton holder ran for their callers, `Database.submit_write`) and `handoffs` (the baton
    handed to a queued thread: a wake-up each)."""

    __slots__ = (
        "transactions",
        "commits",
        "lazy_commits",
        "rolled_back",
        "group_failures",
        "largest_group",
        "checkpoints",
        "checkpoint_signals",
        "wal_restarts",
        "batched",
        "combined",
        "handoffs",
    )

    def __init__(self) -> None:
        self.transactions = 0
        self.commits = 0
        self.lazy_commits = 0
        self.rolled_back = 0
        self.group_failures = 0
        self.largest_group = 0
        self.checkpoints = 0
        self.checkpoint_signals = 0
        self.wal_restarts = 0
        self.batched = 0
        self.combined = 0
        self.handoffs = 0

    def snapshot(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in self.__slots__}


class WriteTimings:
    """Per-write durations by store method (only with `AGENTHOST_STORE_TIMING`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._rows: dict[str, list[tuple[float, float, float, float, int]]] = {}

    def add(self, method: str, row: tuple[float, float, float, float, int]) -> None:
        with self._lock:
            rows = self._rows.setdefault(method, [])
            if len(rows) < 100_000:
                rows.append(row)

    def write(self) -> None:
        def pct(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

        out: dict[str, Any] = {}
        with self._lock:
            for method, rows in self._rows.items():
                cols = list(zip(*rows, strict=True))
                out[method] = {"n": len(rows), "meanGroup": round(sum(cols[4]) / len(rows), 2)}
                for i, name in enumerate(("waitMs", "bodyMs", "commitMs", "publishMs")):
                    out[method][name] = {
                        "p50": pct(list(cols[i]), 0.5),
                        "p99": pct(list(cols[i]), 0.99),
                        "mean": round(sum(cols[i]) / len(rows), 2),
                    }
        with contextlib.suppress(OSError):
            Path(self.path).write_text(json.dumps(out, indent=1, sort_keys=True))


def caller_name() -> str:
    """The store method that wrote (the first frame outside storage.base and contextlib)."""
    frame = sys._getframe(1)
    skip = (__file__, _BASE_FILE, contextlib.__file__)
    while frame is not None and frame.f_code.co_filename in skip:
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_code.co_name if frame is not None else "?"


_BASE_FILE = str(Path(__file__).with_name("base.py"))


# -- One thread's batch of writes ------------------------------------------------------------------
# One thread's batch of writes (`Database.write_batch`): each write a nested savepoint of
# the batch's one group member, its events handed to the batch and published after the COMMIT
# that holds them all, so a Session actor's queued Turn writes land together.


class WriteBatch:
    """One thread's `Database.write_batch`: the member transaction its writes nest in (None
    until its first write opens it in `member`, the block's exit stack), and why the batch was
    lost (set when SQLite aborted the transaction under it)."""

    __slots__ = ("tx", "thread", "broken", "member")

    def __init__(self, member: contextlib.ExitStack) -> None:
        self.tx: Tx | None = None
        self.member = member
        self.thread = threading.get_ident()
        self.broken: str | None = None


@contextmanager
def batch_item(
    batch: WriteBatch,
    workspace_id: str | None,
    fence: str | None,
    now_ms: int,
    count: Callable[[bool], None],
) -> Iterator[Tx]:
    """One write inside a batch: a nested savepoint; a write that raises rolls back alone
    (`count(True)`), one that lands hands its events to the batch (`count(False)`). If SQLite
    aborted the whole transaction, the batch is marked lost and nothing of it will be written."""
    if batch.broken is not None:
        raise StoreBusy(f"the store lost this batch of writes, try again ({batch.broken})")
    member = batch.tx
    assert member is not None, "a batch's write before its member was opened"
    conn = member.conn
    tx = Tx(conn, workspace_id, now_ms, member.seq)
    try:
        conn.execute("SAVEPOINT agenthost_item")
        try:
            if fence is not None:
                tx.check_fence(fence)
            yield tx
        except BaseException as exc:
            count(True)
            try:
                if conn.getautocommit():
                    raise apsw.SQLError("the transaction was rolled back")
                conn.execute("ROLLBACK TO agenthost_item")
                conn.execute("RELEASE agenthost_item")
            except apsw.Error:
                # The whole transaction is gone: nothing of the batch will be written.
                batch.broken = type(exc).__name__
            raise
        # No `RELEASE` of a landed item's savepoint: the group's COMMIT ends it (and a later
        # item that fails rolls back to its own, the newest of the name), one SQLite call
        # fewer inside the baton per write of the batch.
    except BaseException as exc:
        if conn.getautocommit() and batch.broken is None:
            batch.broken = type(exc).__name__
        typed = typed_store_error(exc)
        if typed is not None and typed is not exc:
            raise typed from exc
        raise
    for event in tx.events:
        member.emit(event)
    count(False)
