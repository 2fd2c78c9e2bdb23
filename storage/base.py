"""The store file's connections — the owner's pool with the single write-transaction helper (with
the source fence) and change events, and the read path's own query-only connection (`ReadView`).

`Database` is the one owner of a store file: every part of `storage.Store` (sessions, turns,
forks, ...) is handed this object and writes through it. Every write goes through
`Database.write`: one SAVEPOINT (none for a group's first write) inside a shared
`BEGIN IMMEDIATE` transaction on the store's one writer connection, the fence check inside it,
change events collected on the transaction and delivered to subscribers only after the
`COMMIT` that made the write durable (laws 2 and 3). Writers that queue while one writes join
its transaction and share its `COMMIT` (group commit: one fsync for several requests). A write
handed over as a callable (`Database.submit_write`) is run by whichever thread holds the baton
when its turn comes, in that group, and its caller is woken once with its result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import apsw

from domain.errors import StoreBusy, StoreSyncFailed
from storage.fork_child import ForkMemo
from storage.models import ChangeEvent, ForkOperation, Session
from storage.rows import PROJECTION_CACHE_SIZE, ProjectionCache, load_op, require_session
from storage.schema import migrate
from storage.sqlite import (
    BUSY_TIMEOUT_MS,
    CHECKPOINT_PAGES,
    CHECKPOINT_RETRY_PAGES,
    GROUP_MAX_AGE_S,
    GROUP_MAX_MEMBERS,
    RESTART_BUSY_MS,
    TIMING_ENV,
    TRANSIENT_ERRORS,
    WAL_BOUND_PAGES,
    Baton,
    BusyWaits,
    Row,
    Submission,
    Tx,
    WriteBatch,
    WriteGroup,
    WriteStats,
    WriteTimings,
    batch_item,
    caller_name,
    open_connection,
    passive_checkpoint,
    restart_checkpoint,
    typed_store_error,
    wall_clock_ms,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 16
"""Connections one store opens at most, however many threads or Sessions use it
(one connection per Session actor would exhaust a 1,024 file-descriptor limit at ~500 Sessions)."""
LEASE_TIMEOUT_S = 30.0
"""How long a caller waits for a free connection before a retryable 503 `store_busy`."""
WRITER_CACHE_KIB = 8192
"""The writer connection's page cache, KiB (SQLite's default is 2,048; readers keep it)."""

T = TypeVar("T")

Subscriber = Callable[[ChangeEvent], None]
BatchSubscriber = Callable[[list[ChangeEvent]], None]
Clock = Callable[[], int]

_OWN_FRAMES = (__file__, contextlib.__file__)


def _lease_site(depth: int = 4) -> str:
    """Where a connection was leased: the first `depth` callers outside this module and
    contextlib, innermost first (a frame walk, no stack formatting: ~1 µs a lease)."""
    frame: FrameType | None = sys._getframe(1)
    sites: list[str] = []
    while frame is not None and len(sites) < depth:
        code = frame.f_code
        if code.co_filename not in _OWN_FRAMES:
            sites.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(sites)


class SyncError(Exception):
    """An fsync of the store's log that failed (`error`): unlike a descriptor that could not be
    opened, the kernel may have dropped what it was to write (`Database._sync_failure`)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _synced(sync: Callable[[int], object], fd: int) -> None:
    try:
        sync(fd)
    except OSError as exc:
        raise SyncError(exc) from exc


def _raise_if_lost(group: WriteGroup) -> None:
    """A member's end when its group's COMMIT failed: nothing of its write was kept; a fresh
    retryable error per member (they share the cause)."""
    if isinstance(group.error, StoreSyncFailed):
        raise StoreSyncFailed(group.error.message) from group.error
    if group.error is not None:
        raise StoreBusy(
            f"the store could not commit this write, try again ({type(group.error).__name__})"
        ) from group.error


class Database:
    """Owns the file path, a bounded pool of apsw connections, subscribers and the write helper;
    the Store's parts share it (they hold it, never inherit it)."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> None:
        self.path = str(path)
        self.busy_timeout_ms = busy_timeout_ms
        # Values a fork's prepare computes for its commit, owned by this store (fork_child.py).
        self.fork_memo = ForkMemo()
        # Committed operations' child projections this store built (rows.py).
        self.projections = ProjectionCache(PROJECTION_CACHE_SIZE)
        self._clock: Clock = clock or wall_clock_ms
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[apsw.Connection] = []
        # Replaced whole under `_lock` (never changed in place): a delivery reads them without it.
        self._subscribers: tuple[Subscriber, ...] = ()
        self._batch_subscribers: tuple[BatchSubscriber, ...] = ()
        self._closed = False
        # A bounded pool: a thread leases a connection for one read or write (re-entrantly, so
        # a read inside a write sees the write's own rows) and returns it; file descriptors
        # are bounded by `max_connections`, not by the number of threads or Sessions.
        self._max_connections = max(1, int(max_connections))
        self._pool = threading.Condition(threading.Lock())
        self._idle: list[apsw.Connection] = []
        # Connections being opened (outside the pool lock: an open may wait out the busy
        # timeout): counted against `max_connections` with the open ones.
        self._opening = 0
        # Which thread leased each connection (by `id`): named, with its stack, when the pool
        # runs dry, so a holder that never gives one back can be found from the log.
        self._holders: dict[int, tuple[int, str]] = {}
        self._dry_logged_at = float("-inf")
        # One writer, no busy-handler sleeps: every write runs on one
        # connection, one caller at a time (the baton below), instead of several connections
        # polling SQLite's write lock with backoff sleeps of up to 100 ms; the busy handler is
        # left for other processes. Group commit: a writer that finds others queued behind it
        # hands the baton on with its savepoint released but the transaction open, and waits
        # for the member that ends the group to COMMIT; that one COMMIT (one fsync) makes
        # every member durable, and only then does any of them return.
        self.write_stats = WriteStats()
        self._fifo = Baton(self.write_stats)
        # Also guards what two threads may touch at once: the released lazy events a group's
        # members take, the checkpointer's counter. The other counters and the held events
        # are moved only by the baton's holder.
        self._baton = self._fifo.lock
        self._group: WriteGroup | None = None
        # Events of lazy COMMITs no fsync'd COMMIT has followed yet (moved by the baton's
        # holder only): a subscriber never hears of a write a power cut could still take back.
        self._held_events: list[ChangeEvent] = []
        self.write_seq = 0
        """The last `Tx.seq` given (under the baton): every write a reader can see has a seq
        at most this, read after its read (the events publisher's bound on what a read-back
        showed, docs/design/store.md "Change events that carry their row")."""
        self._writer_conn: apsw.Connection | None = None
        # The WAL file, for the durable groups' fdatasync (`_sync_wal`); None until the first.
        self._wal_fd: int | None = None
        self.sync_failed: OSError | None = None
        """The first failed fsync of the WAL: from then on no write commits (`_end_group`)
        and no checkpoint runs (docs/design/store.md "A failed sync stops the writes")."""
        self.before_sync: Callable[[], None] | None = None
        """Called before each durable group's fsync, with the baton held (the composition
        root's `host.store.wal_sync` failpoint); an `OSError` it raises is the sync's."""
        self._on_sync_failed: Callable[[OSError], None] | None = None
        self.group_max_members = GROUP_MAX_MEMBERS
        self.checkpoint_pages = CHECKPOINT_PAGES
        self.checkpoint_retry_pages = CHECKPOINT_RETRY_PAGES
        self.wal_bound_pages = WAL_BOUND_PAGES
        # The WAL's length when the checkpointer was last asked (0: not since it restarted).
        self._wal_asked_at = 0
        self._checkpoint_due = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self.group_max_age_s = GROUP_MAX_AGE_S
        timing = os.environ.get(TIMING_ENV)
        self._timings = WriteTimings(timing) if timing else None
        self.busy_waits = BusyWaits(busy_timeout_ms)

    # -- connections -------------------------------------------------------------------------

    @contextmanager
    def lease(self) -> Iterator[apsw.Connection]:
        """This thread's connection for the duration of the block (re-entrant)."""
        held: apsw.Connection | None = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        conn = self._checkout()
        self._local.conn = conn
        try:
            yield conn
        finally:
            self._local.conn = None
            self._checkin(conn)

    def _checkout(self) -> apsw.Connection:
        deadline = time.monotonic() + LEASE_TIMEOUT_S
        dry, report = False, None
        with self._pool:
            while True:
                if self._closed:
                    raise RuntimeError("store is closed")
                if self._idle:
                    conn = self._idle.pop()
                    self._holders[id(conn)] = (threading.get_ident(), _lease_site())
                    return conn
                if len(self._connections) + self._opening < self._max_connections:
                    self._opening += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    dry, report = True, self._holders_report()
                    break
                self._pool.wait(remaining)
        if dry:
            # Logged outside the pool lock: a handler that blocks (a stderr pipe nobody reads,
            # a slow disk) must not hold every other lease's checkout and checkin behind it.
            if report is not None:
                log.error(
                    "all %d store connections in use for %.0f s; held by:\n%s",
                    self._max_connections,
                    LEASE_TIMEOUT_S,
                    report,
                )
            raise StoreBusy(
                f"all {self._max_connections} store connections stayed in use for"
                f" {LEASE_TIMEOUT_S:.0f} s"
            )
        # Opened outside the pool lock (its slot reserved, so the bound holds): an open that
        # waits out the busy timeout (a store another process locks, a WAL being recovered)
        # must not hold every other lease's checkout and checkin — every read — nor
        # `open_connections` (`host.status`) behind it.
        try:
            conn = open_connection(self.path, self.busy_timeout_ms, self.busy_waits)
        except BaseException:
            with self._pool:
                self._opening -= 1
                self._pool.notify()
            raise
        with self._pool:
            self._opening -= 1
            if not self._closed:
                self._connections.append(conn)
                self._holders[id(conn)] = (threading.get_ident(), _lease_site())
                return conn
            self._pool.notify()
        conn.close()
        raise RuntimeError("store is closed")

    def _holders_report(self) -> str | None:
        """Under the pool lock, at most once a minute (else None): each thread holding a
        connection, by name, with where it is now (the writer's own connection is held for
        good), for the caller to log once it has let the lock go."""
        now = time.monotonic()
        if now - self._dry_logged_at < 60.0:
            return None
        self._dry_logged_at = now
        names = {t.ident: t.name for t in threading.enumerate()}
        frames = sys._current_frames()
        writer = id(self._writer_conn) if self._writer_conn is not None else None
        lines = []
        for key, (ident, site) in self._holders.items():
            frame = frames.get(ident)
            where = "".join(traceback.format_stack(frame)[-4:]) if frame is not None else ""
            role = "writer" if key == writer else "lease"
            lines.append(
                f"{role} held by {names.get(ident, ident)}, leased at {site}; now at:\n{where}"
            )
        return "\n".join(lines)

    def _checkin(self, conn: apsw.Connection) -> None:
        with contextlib.suppress(apsw.Error):
            if not conn.getautocommit():  # never hand a half-open transaction to another caller
                conn.execute("ROLLBACK")
        with self._pool:
            self._holders.pop(id(conn), None)
            if not self._closed:
                self._idle.append(conn)
                self._pool.notify()
                return
            if conn in self._connections:
                self._connections.remove(conn)
        with contextlib.suppress(apsw.Error):
            conn.close()

    def with_conn(self, fn: Callable[[apsw.Connection], T]) -> T:
        with self.lease() as conn:
            return fn(conn)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        with self.lease() as conn:
            return conn.execute(sql, params).fetchone()

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self.lease() as conn:
            return conn.execute(sql, params).fetchall()

    def connection(self) -> apsw.Connection:
        """Pin a connection to the calling thread until `release_thread_connection()` (tests
        and tools that inspect the store directly); the store's own calls lease per call."""
        held: apsw.Connection | None = getattr(self._local, "conn", None)
        if held is not None:
            return held
        conn = self._checkout()
        self._local.conn = conn
        self._local.pinned = True
        return conn

    def release_thread_connection(self) -> None:
        """Return a connection `connection()` pinned to this thread (no-op otherwise)."""
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is None or not getattr(self._local, "pinned", False):
            return
        self._local.conn = None
        self._local.pinned = False
        self._checkin(conn)

    def open_connections(self) -> int:
        with self._pool:
            return len(self._connections)

    def migrate(self) -> int:
        with self.lease() as conn:
            return migrate(conn)

    def close(self) -> None:
        """Close every connection this store opened (in any thread)."""
        if self._timings is not None:
            self._timings.write()
        # Closed first, so the checkpointer sees `_closed` and ends; its connection is taken
        # with the others once it has.
        with self._pool:
            self._writer_conn = None
            self._closed = True
        self._checkpoint_due.set()
        if self._checkpointer is not None and self._checkpointer is not threading.current_thread():
            self._checkpointer.join(5)
        with self._pool:
            conns, self._connections = self._connections, []
            self._idle = []
            self._pool.notify_all()
        for conn in conns:
            try:
                conn.close()
            except apsw.Error:  # pragma: no cover - close of a busy connection
                log.exception("closing store connection")
        self._close_wal_fd()
        self._local = threading.local()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- events ------------------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(event)` after each COMMIT that changed something; returns unsubscribe."""
        with self._lock:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)

        return unsubscribe

    def subscribe_batches(self, callback: BatchSubscriber) -> Callable[[], None]:
        """Call `callback(events)` once per delivery with all its events, in commit order (a
        COMMIT's, or an `events_after` block's together): a consumer on another thread gets
        a fork's burst as one hand-over instead of waking at its first event."""
        with self._lock:
            self._batch_subscribers = (*self._batch_subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                self._batch_subscribers = tuple(
                    s for s in self._batch_subscribers if s is not callback
                )

        return unsubscribe

    @contextmanager
    def events_after(self, into: list[ChangeEvent] | None = None) -> Iterator[None]:
        """This thread's durable writes inside the block tell their subscribers when the block
        ends, not after each COMMIT: a caller that answers a client from what it wrote (a
        fork's commit) sends that answer before the events thread is woken to read the same
        rows back. Each event still goes out after its COMMIT is durable and in this thread's
        commit order; an exception in the block delivers them all the same (the writes are
        kept). A block inside a block is the same block.

        `into`: the block's events are appended to this list instead, and the caller hands
        them on later with `notify` (every one of them, whatever happens: a fork saga holds
        its dispatch step's events until its commit's, design/fork-saga.md step 6)."""
        outer: list[ChangeEvent] | None = getattr(self._local, "after", None)
        if outer is not None and into is None:
            yield
            return
        held: list[ChangeEvent] = [] if into is None else into
        self._local.after = held
        try:
            yield
        finally:
            self._local.after = outer
            if into is None:
                self._notify(held)

    def notify(self, events: list[ChangeEvent]) -> None:
        """Hand `events` (durable writes' events an `events_after(into=...)` block kept) to
        the subscribers now, or to this thread's enclosing `events_after` block."""
        self._notify(events)

    def _notify(self, events: list[ChangeEvent]) -> None:
        if not events:
            return
        held: list[ChangeEvent] | None = getattr(self._local, "after", None)
        if held is not None:
            held.extend(events)
            return
        subscribers = self._subscribers
        batch_subscribers = self._batch_subscribers
        for each in batch_subscribers:
            try:
                each(list(events))
            except Exception:  # a listener must never undo or break a durable write
                log.exception("store subscriber failed on %d events", len(events))
        for callback in subscribers:
            for event in events:
                try:
                    callback(event)
                except Exception:  # a listener must never undo or break a durable write
                    log.exception("store subscriber failed on %r", event)

    # -- transactions ------------------------------------------------------------------------

    def _writer_connection(self) -> apsw.Connection:
        """The one connection every write of this store runs on (leased once, kept)."""
        if self._writer_conn is None:
            conn = self._checkout()
            # No checkpoint inside a COMMIT: SQLite's auto-checkpoint would copy ~1,000 WAL
            # pages into the database and fsync it in whichever write crossed the mark, with
            # every queued writer waiting (a tail of the mutation p99). The hook only signals;
            # a background thread checkpoints on its own connection (PASSIVE: no write lock).
            conn.set_wal_hook(self._wal_grew)
            # Big forks' commits fit in the writer's cache (docs/design/store.md).
            conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            # Its COMMITs do not fsync by themselves: a durable group's is followed by the
            # WAL's own fdatasync (`_sync_wal`), a lazy group's by none. So no setting changes
            # between groups (SQLite compiles a `PRAGMA synchronous` at every use).
            conn.execute("PRAGMA synchronous=NORMAL")
            # Its statement and savepoint journals in memory: SQLite keeps one in memory up
            # to 64 KiB, then moves it to a temporary file and writes each page it journals
            # there (two `pwrite`s a page). A recovery commit's savepoint journals ~20-100
            # pages (~10 % of its CPU in those writes). The journals only ever undo a
            # statement or a savepoint inside an open transaction; a crash never reads them
            # (the WAL's uncommitted frames are what it discards), so nothing durable moves.
            # Temporary B-trees of this connection's statements stay in memory too: its
            # statements are the store's writes, none of which sorts a large set.
            conn.execute("PRAGMA temp_store = MEMORY")
            self._writer_conn = conn
        return self._writer_conn

    def _sync_wal(self, conn: apsw.Connection) -> None:
        """Make everything the WAL holds durable, as `synchronous=FULL` does in its COMMIT:
        one fdatasync of the WAL file (which covers every lazy COMMIT before it: the file
        is written in order and its frames are checksummed in a chain). The descriptor is
        opened once, after a COMMIT (so the file exists); the writer keeps the WAL open,
        so it is the file SQLite writes for as long as the writer lives.

        The first sync also makes the WAL's directory entry durable: SQLite creates the file
        at the first write after an open and, at `synchronous=FULL`, fsyncs its directory at
        the WAL's first sync; at `NORMAL` that first sync of its own waits for a checkpoint,
        so a fresh WAL's name would not be durable before the first durable reply."""
        fd = self._wal_fd
        if fd is None:
            fd = os.open(conn.filename_wal, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _synced(os.fdatasync, fd)
                directory = os.open(
                    os.path.dirname(conn.filename_wal) or ".", os.O_RDONLY | os.O_CLOEXEC
                )
                try:
                    _synced(os.fsync, directory)
                finally:
                    os.close(directory)
            except BaseException:
                os.close(fd)
                raise
            self._wal_fd = fd
            return
        _synced(os.fdatasync, fd)

    def on_sync_failed(self, callback: Callable[[OSError], None]) -> None:
        """`callback(error)` once, at the first failed fsync of the WAL (the daemon stops)."""
        self._on_sync_failed = callback

    def _sync_failure(self, exc: OSError) -> None:
        first = self.sync_failed is None
        if first:
            self.sync_failed = exc
        self._close_wal_fd()
        log.error(
            "store: the WAL's fsync after a COMMIT failed (%s): no write commits from now on", exc
        )
        callback = self._on_sync_failed
        if first and callback is not None:
            try:
                callback(exc)
            except Exception:  # noqa: BLE001 - the refusal of every later write holds anyway
                log.exception("store: the sync failure's callback failed")

    def _sync_failed_error(self) -> StoreSyncFailed:
        return StoreSyncFailed(
            "the disk failed to sync the store's log "
            f"({self.sync_failed}); no write is taken from now on and the daemon stops: "
            "check the disk, then start the daemon again"
        )

    def _close_wal_fd(self) -> None:
        fd, self._wal_fd = self._wal_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wal_grew(self, _conn: apsw.Connection, _db: str, pages: int) -> int:
        # Runs on the writer's thread after each COMMIT, with the baton held.
        if pages < self._wal_asked_at:
            self._wal_asked_at = 0  # the WAL restarted from its beginning
        if pages >= self.checkpoint_pages and (
            self._wal_asked_at == 0 or pages - self._wal_asked_at >= self.checkpoint_retry_pages
        ):
            self._wal_asked_at = pages
            self.write_stats.checkpoint_signals += 1
            if self._checkpointer is None:
                self._checkpointer = threading.Thread(
                    target=self._checkpoint_loop, name="agenthost-store-checkpoint", daemon=True
                )
                self._checkpointer.start()
            self._checkpoint_due.set()
        return apsw.SQLITE_OK

    def _checkpoint_loop(self) -> None:
        # A connection of its own, opened on this thread: never one of the pool's (a pool
        # drained by readers does not hold a checkpoint back, nor a checkpoint a reader).
        try:
            conn = open_connection(self.path, RESTART_BUSY_MS)
        except apsw.Error as exc:
            log.warning("store checkpointer could not open its connection: %s", exc)
            self._checkpointer = None  # the next signal starts another
            return
        try:
            while True:
                self._checkpoint_due.wait()
                self._checkpoint_due.clear()
                if self._closed or self.sync_failed is not None:
                    return  # a checkpoint may copy a frame the disk lost: the next open judges
                try:
                    frames, _copied = self._checkpoint_pass(conn)
                    if frames >= self.wal_bound_pages and not self._closed:
                        self._restart_wal(conn)
                except Exception as exc:  # noqa: BLE001 - the next commit past the mark retries
                    if not self._closed:
                        log.warning("store checkpoint failed: %s", exc)
        finally:
            with contextlib.suppress(apsw.Error):
                conn.close()

    def _checkpoint_pass(self, conn: apsw.Connection) -> tuple[int, int]:
        """One PASSIVE checkpoint off the writers' path: (WAL frames, frames copied)."""
        got = passive_checkpoint(conn)
        with self._baton:
            self.write_stats.checkpoints += 1
        return got

    def _restart_wal(self, conn: apsw.Connection) -> None:
        """Start the WAL again (`storage.sqlite.WAL_BOUND_PAGES`): with the baton held no
        COMMIT can land and SQLite's write lock is free once the open group is committed, so a
        RESTART checkpoint copies the frames written since the last pass and starts the log
        again (waiting at most `RESTART_BUSY_MS` for readers still on it). Queued writers wait
        for that one short pass; queued as a background writer, it lets the clients' writes
        go first for up to 0.1 s."""
        with self._fifo.background():
            self._take_baton()
        try:
            group = self._group
            writer = self._writer_conn
            if group is not None and writer is not None:
                self._end_group(group, writer)
            if self._restart_pass(conn):
                with self._baton:
                    self.write_stats.wal_restarts += 1
        finally:
            self._pass_baton()

    def _restart_pass(self, conn: apsw.Connection) -> bool:
        """The RESTART checkpoint `_restart_wal` runs with the baton held: restarted or not."""
        return restart_checkpoint(conn)

    def _take_baton(self) -> None:
        self._fifo.take(max(0.0, self.busy_timeout_ms / 1000))

    def background(self) -> contextlib.AbstractContextManager[None]:
        """This thread's writes in the block are background ones (`storage.sqlite.Baton`)."""
        return self._fifo.background()

    def _pass_baton(self) -> None:
        self._fifo.pass_on()

    def _end_group(self, group: WriteGroup, conn: apsw.Connection) -> None:
        """COMMIT (or, with no member, roll back) the open group and wake its members."""
        self._group = None
        try:
            if group.members == 0:
                if not conn.getautocommit():
                    conn.execute("ROLLBACK")
                return
            if self.sync_failed is not None:
                raise self._sync_failed_error()
            conn.execute("COMMIT")
            stats = self.write_stats  # the baton's holder is their only writer
            if group.lazy:
                stats.lazy_commits += 1
                self._held_events.extend(group.held)
            else:
                try:
                    hook = self.before_sync
                    if hook is not None:  # its OSError is the sync's (a simulated EIO)
                        _synced(lambda _fd: hook(), -1)
                    self._sync_wal(conn)
                except OSError:
                    # The WAL could not be opened for its fsync (an fd limit): nothing was
                    # synced, nothing the kernel held was dropped; the COMMIT is not known
                    # durable (its members fail, retryable) and the next durable write syncs.
                    log.exception("store: the WAL could not be opened for its fsync")
                    self._close_wal_fd()
                    raise
                except SyncError as failed:
                    exc = failed.error
                    # The COMMIT is in the WAL but not known durable: nobody is told of it, as
                    # after a crash between a COMMIT and its reply. And no later write may
                    # commit: after a failed fsync the kernel may have dropped the WAL's dirty
                    # pages while a new descriptor's fsync succeeds, so a later write "made
                    # durable" could sit behind a hole in the WAL's checksum chain, which a
                    # recovery cuts at the hole (docs/design/store.md).
                    self._sync_failure(exc)
                    raise self._sync_failed_error() from exc
                stats.commits += 1
                # This fsync covers every earlier lazy COMMIT (the WAL's checksum chain):
                # their events may go out now, before this group's own.
                if self._held_events:
                    group.released, self._held_events = self._held_events, []
            if group.members > stats.largest_group:
                stats.largest_group = group.members
        except BaseException as exc:
            if not conn.getautocommit():
                try:
                    conn.execute("ROLLBACK")
                except apsw.Error:  # a failed COMMIT may already have rolled back
                    log.warning("rollback after %r failed", exc)
            group.error = exc
            self.write_stats.group_failures += 1
        finally:
            group.end()

    def _group_stays_open(self, group: WriteGroup) -> bool:
        """Whether the baton holder leaves the group open for the writer queued behind it."""
        if group.lazy:
            return False  # a durable write never joins a COMMIT that is not fsync'd
        return (
            self._fifo.waiting > 0
            and group.members < self.group_max_members
            and time.monotonic() - group.opened < self.group_max_age_s
        )

    def _finish_turn(self) -> None:
        """The end of a baton holder's turn: run the submitted bodies next in line in the open
        group (each a member, on this thread: no hand-off), end the group when it must end,
        then hand the baton to the writer next in line (the group left open for it)."""
        while True:
            group = self._group
            if group is None or not self._group_stays_open(group):
                if group is not None:
                    self._end_group(group, self._writer_connection())
                break
            sub = self._fifo.next_submission()
            if sub is None:
                group.keep_open()  # its members wait for the holder that ends it
                break  # a writer of its own is next: it takes the baton and the open group
            self._run_combined(group, sub)
        self._pass_baton()

    def _run_combined(self, group: WriteGroup, sub: Submission) -> None:
        """Run a submitted body as a member of `group` for its caller (with the baton held):
        its savepoint, its fence check, its body; a failing one rolls back alone and its
        caller is woken now with its error, a landed one is woken at the group's end."""
        conn = self._writer_connection()
        self.write_seq += 1
        tx = Tx(conn, sub.workspace_id, self._clock(), self.write_seq)
        held = getattr(self._local, "conn", None)
        self._local.conn = conn  # reads inside the body see its own rows
        own_savepoint = group.members > 0
        try:
            if own_savepoint:
                conn.execute("SAVEPOINT agenthost_write")
            if sub.fence is not None:
                tx.check_fence(sub.fence)
            sub.result = sub.body(tx)
            # No `RELEASE`: the group's COMMIT ends every savepoint (`_owned_write`).
        except BaseException as exc:  # noqa: BLE001 - delivered to the body's own caller
            sub.error = exc
            if self._group is group:
                self._undo_member(group, conn, exc, own_savepoint)
            sub.done()
            return
        finally:
            self._local.conn = held
        group.members += 1
        sub.tx = tx
        sub.group = group
        group.combined.append(sub)
        self.write_stats.transactions += 1
        self.write_stats.combined += 1

    def write(
        self, workspace_id: str | None, fence: str | None = None, *, durable: bool = True
    ) -> contextlib.AbstractContextManager[Tx]:
        """The only way to write: a savepoint in the shared BEGIN IMMEDIATE transaction,
        optional fence check, COMMIT (shared with the writes queued meanwhile), then events.

        `durable=False`, for a write whose caller makes it durable with its next write: one
        that opens a group commits it alone without the WAL's fsync that follows a durable
        group's COMMIT (`_sync_wal`) — in the WAL file, so it survives a killed
        process and is seen by every reader, and on the disk with the next fsync'd COMMIT
        (the WAL's frames are checksummed in a chain: a power loss keeps a prefix of the
        COMMITs, never a later one without an earlier). One that finds a group open joins
        it and is fsync'd with it. Inside a `write_batch` a write is the batch's, durable.
        A lazy COMMIT's events are held and published after the next fsync'd COMMIT (of any
        writer), ahead of that COMMIT's own: no subscriber hears of a write a power cut could
        still take back.

        An exception inside the block rolls back this write's savepoint alone (the group's
        other members are unaffected) and delivers no events. A caller returns only after the
        COMMIT that holds its write returned; a failed COMMIT fails every member of the group.
        One that waits for its turn past the busy timeout gets the same retryable `StoreBusy`
        as one that waited on another process's lock.
        """
        batch: WriteBatch | None = getattr(self._local, "batch", None)
        if batch is not None and batch.thread == threading.get_ident():
            return self._batched(batch, workspace_id, fence)
        return self._write_own(workspace_id, fence, durable)

    @contextmanager
    def _write_own(
        self, workspace_id: str | None, fence: str | None, durable: bool
    ) -> Iterator[Tx]:
        """`write` outside a batch: take the baton, then the member (`_owned_write`)."""
        t0 = time.perf_counter()
        self._take_baton()
        with self._owned_write(workspace_id, fence, durable, t0) as tx:
            yield tx

    def _batched(
        self, batch: WriteBatch, workspace_id: str | None, fence: str | None
    ) -> contextlib.AbstractContextManager[Tx]:
        """A write of this thread's batch: its nested savepoint (`batch_item`) in the batch's
        member, which the batch's first write opens — the baton is taken only then, so what
        the batch's caller does before its first write (a Turn's queued writes: the actor's
        and the store method's own preparation of the first) runs without it. One context
        manager per write, not `write`'s own around `batch_item`'s."""
        if batch.tx is None:
            batch.tx = batch.member.enter_context(self._write_own(None, None, True))
        return batch_item(batch, workspace_id, fence, self._clock(), self._count_batched)

    def submit_write(
        self,
        body: Callable[[Tx], T],
        workspace_id: str | None,
        fence: str | None = None,
        *,
        durable: bool = True,
    ) -> T:
        """`write` with its body handed over as a callable: `body(tx)` runs in a savepoint
        of the shared transaction, with the fence checked inside it first, and its result is
        returned (or its exception raised) here, once the COMMIT holding it returned and its
        events were published — the same laws as `write`.

        Flat combining: if the baton is held, the body queues in the baton's line and the
        holder runs it on its own thread when its turn comes, with no hand-off; the caller is
        woken once, with its result. So a body must use only its `tx` and values it was
        given: no thread-locals, no actor state (it may run on any writer's thread), and
        nothing that writes through the store itself. The caller's own post-processing comes
        after this returns. Inside a `write_batch` of this thread it is the batch's."""
        batch: WriteBatch | None = getattr(self._local, "batch", None)
        if batch is not None and batch.thread == threading.get_ident():
            with self._batched(batch, workspace_id, fence) as item:
                return body(item)
        t0 = time.perf_counter()
        sub = Submission(body, workspace_id, fence, durable)
        self._fifo.offer(sub, max(0.0, self.busy_timeout_ms / 1000))
        if sub.state == Submission.OWNER:
            with self._owned_write(workspace_id, fence, durable, t0) as tx:
                return body(tx)
        if sub.error is not None:
            typed = typed_store_error(sub.error)
            if typed is not None and typed is not sub.error:
                raise typed from sub.error
            raise sub.error
        group, tx_done = sub.group, sub.tx
        assert group is not None and tx_done is not None
        _raise_if_lost(group)
        self._notify(self._take_released(group) + tx_done.events)
        result: T = sub.result
        return result

    @contextmanager
    def _owned_write(
        self, workspace_id: str | None, fence: str | None, durable: bool, t0: float
    ) -> Iterator[Tx]:
        """`write`'s body once this thread holds the baton: its member of the group, then the
        turn's end (`_finish_turn`), then the wait for the COMMIT and the events."""
        t1 = time.perf_counter()
        group: WriteGroup | None = None
        tx: Tx | None = None
        failure: BaseException | None = None
        try:
            conn = self._writer_connection()
            if self._group is None:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except BaseException as exc:
                    if isinstance(exc, TRANSIENT_ERRORS):
                        raise StoreBusy(
                            f"the store is busy, try again ({type(exc).__name__})"
                        ) from exc
                    raise
                self._group = WriteGroup(lazy=not durable)
            group = self._group
            self.write_seq += 1
            tx = Tx(conn, workspace_id, self._clock(), self.write_seq)
            held = getattr(self._local, "conn", None)
            self._local.conn = conn  # reads inside the write see its own rows
            # The group's first member needs no savepoint: nothing else is in the transaction
            # yet, so undoing it is the ROLLBACK of the whole (`_undo_member`), and a later
            # member's savepoint nests inside it alike. Two SQLite calls fewer inside the baton
            # for every group's first write (every write of a writer alone), each a GIL
            # hand-off the queued writers wait behind.
            own_savepoint = group.members > 0
            try:
                if own_savepoint:
                    conn.execute("SAVEPOINT agenthost_write")
                try:
                    if fence is not None:
                        tx.check_fence(fence)
                    yield tx
                except BaseException as exc:
                    failure = exc
                    self._undo_member(group, conn, exc, own_savepoint)
                    raise
                # No `RELEASE` of a landed member's savepoint: the group's COMMIT ends every
                # savepoint still open, and a later member that fails rolls back to its own
                # (the newest of the name: `ROLLBACK TO` and `RELEASE` take the newest), so
                # the earlier ones stay. One SQLite call fewer inside the baton for every
                # member but a group's first (each call lets the interpreter go while the
                # queued writers wait on the baton).
                group.members += 1
                if group.lazy:
                    group.held.extend(tx.events)
                self.write_stats.transactions += 1
            finally:
                self._local.conn = held
        except BaseException as exc:
            if failure is None:  # BEGIN or SAVEPOINT failed: this member is undone
                failure = exc
                if group is not None and self._group is group:
                    self._undo_member(group, conn, exc, group.members > 0)
            typed = typed_store_error(exc)
            if typed is not None and typed is not exc:
                raise typed from exc
            raise
        finally:
            t2 = time.perf_counter()
            self._finish_turn()
        assert group is not None and tx is not None
        group.wait()
        t4 = time.perf_counter()
        _raise_if_lost(group)
        if not group.lazy:
            self._notify(self._take_released(group) + tx.events)
        if self._timings is not None:
            self._timings.add(
                caller_name(),
                (
                    (t1 - t0) * 1000,
                    (t2 - t1) * 1000,
                    (t4 - t2) * 1000,
                    (time.perf_counter() - t4) * 1000,
                    group.members,
                ),
            )

    @contextmanager
    def write_batch(self) -> Iterator[None]:
        """Several writes of this thread as one member of the group: one baton turn and one
        COMMIT for all of them, so a Turn's queued writes land together.

        Each `write` inside the block is a nested savepoint of the batch's own: one that
        raises rolls back alone (the caller sees its error and may go on with the next), the
        others stay. Nothing of the batch is durable, and no event is published, before the
        block ended and the COMMIT holding it returned; if that COMMIT fails, or SQLite aborts
        the transaction (a full disk, an I/O error), the block raises `StoreBusy` and none of
        its writes exists — after such an abort every later write inside raises `StoreBusy`.
        A batch inside a batch is the same batch.

        The baton is taken at the batch's first write, not at the block's start (its member
        opened then, `_batched`): what the block runs before it holds no writer waiting. A
        block that writes nothing takes no baton; a first write that cannot take it (the busy
        timeout) raises its `StoreBusy` there, and nothing of the batch exists."""
        if getattr(self._local, "batch", None) is not None:
            yield
            return
        with contextlib.ExitStack() as member:
            batch = WriteBatch(member)
            self._local.batch = batch
            try:
                yield
            finally:
                self._local.batch = None
            if batch.broken is not None:
                raise StoreBusy(f"the store lost this batch of writes, try again ({batch.broken})")

    def _take_released(self, group: WriteGroup) -> list[ChangeEvent]:
        """The lazy writes' events `group`'s fsync made durable, to the first member asking."""
        if group.released is None:  # set before the group ended, so before any member asks
            return []
        with self._baton:
            released, group.released = group.released, None
        return released or []

    def _count_batched(self, rolled_back: bool) -> None:
        if rolled_back:
            self.write_stats.rolled_back += 1
        else:
            self.write_stats.batched += 1

    def _undo_member(
        self, group: WriteGroup, conn: apsw.Connection, exc: BaseException, own_savepoint: bool
    ) -> None:
        """Roll back this member's savepoint only (the group's first member, which has none,
        rolls back the transaction it is alone in); if SQLite aborted the whole transaction
        (a full disk, an I/O error), the group is lost and every member fails."""
        self.write_stats.rolled_back += 1
        if not own_savepoint:
            with contextlib.suppress(apsw.Error):  # a failed COMMIT may already have rolled back
                if not conn.getautocommit():
                    conn.execute("ROLLBACK")
        elif not conn.getautocommit():
            try:
                conn.execute("ROLLBACK TO agenthost_write")
                conn.execute("RELEASE agenthost_write")
                return
            except apsw.Error:
                log.warning("rollback of a write after %r failed", exc)
                with contextlib.suppress(apsw.Error):
                    conn.execute("ROLLBACK")
        # The transaction is gone: the members before this one were not written.
        self._group = None
        if group.members:
            group.error = StoreBusy(
                f"the store failed the write group, try again ({type(exc).__name__})"
            )
            self.write_stats.group_failures += 1
        group.end()

    @contextmanager
    def read(self) -> Iterator[apsw.Connection]:
        """A consistent read snapshot across several statements (a deferred transaction);
        inside `read_snapshot` a read is part of that snapshot (no BEGIN of its own)."""
        held: apsw.Connection | None = getattr(self._local, "snapshot", None)
        if held is not None:
            yield held
            return
        with self.lease() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if not conn.getautocommit():
                    conn.execute("COMMIT")

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """Every read this thread makes inside the block in one read transaction, on one
        connection (the events publisher's batch). A read transaction that
        begins after any COMMIT of another connection starts with an empty page cache (WAL:
        the cache is dropped whenever the database changed), so reads done one by one each
        load their pages again; inside one snapshot they load them once. Not inside a write;
        a snapshot inside a snapshot is the same one."""
        if getattr(self._local, "snapshot", None) is not None:
            yield
            return
        with self.read() as conn:
            self._local.snapshot = conn
            try:
                yield
            finally:
                self._local.snapshot = None

    def now_ms(self) -> int:
        return self._clock()


# -- The read path's own connection ----------------------------------------------------------------

READ_BUSY_TIMEOUT_MS = 50
"""A WAL reader waits only in SQLite's rare recovery cases; past this the caller gets
`apsw.BusyError` and may retry elsewhere (the daemon falls back to its reader pool)."""


class ReadView:
    """Point reads of committed state on a connection of their own: the read path.

    The daemon answers `session.get` and `fork.get` on the transport thread with one of these
    instead of leasing a pooled connection on a reader thread: no thread hop, no pool lock, and
    SQLite's statement cache warm for the two queries. The connection is `query_only`: it can
    never write, so it never takes the write lock and never waits for the writer (WAL readers
    do not block the writer, nor it them).

    Read-your-writes: every read here starts its own read transaction and ends it before it
    returns, so it sees every transaction committed before it began — in particular any write
    the daemon acknowledged to a client before that client's read arrived. Nothing keeps a
    snapshot open between two reads.

    The generation (`generation()`, SQLite's `PRAGMA data_version`) lets a caller keep what it
    read: it changes whenever any other connection, in this process or another, commits to the
    database (and never because of this connection, which cannot write). A value taken *before*
    a read and found unchanged later proves that nothing was committed since, so what the read
    returned is still the committed state (the daemon's reply cache, `agenthost.reply_cache`).

    One `ReadView` belongs to one thread (its caller); it is not a pool.
    """

    def __init__(
        self,
        path: str,
        *,
        busy_timeout_ms: int = READ_BUSY_TIMEOUT_MS,
        projections: ProjectionCache | None = None,
    ) -> None:
        self.path = path
        # The store's cache of committed projections (`Database.projections`), shared with
        # it; None: each committed read rebuilds its projection.
        self._projections = projections
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: apsw.Connection | None = None
        self._closed = False

    def _connection(self) -> apsw.Connection:
        conn = self._conn
        if conn is None:
            if self._closed:
                raise RuntimeError("read view is closed")
            conn = open_connection(self.path, self._busy_timeout_ms)
            conn.execute("PRAGMA query_only=1")
            self._conn = conn
        return conn

    def generation(self) -> int:
        """The database's commit generation as this connection sees it now (a read
        transaction of its own, ended before it returns); see the class docstring. Take it
        before the reads it stamps: a commit between the two then only makes it stale."""
        value = self._connection().execute("PRAGMA data_version").get
        assert isinstance(value, int)
        return value

    def get_session(self, ws: str, sid: str) -> Session:
        """The live Session, or `SessionNotFound`; one statement, so one snapshot."""
        conn = self._connection()
        return require_session(conn, ws, sid)

    def session_exists(self, ws: str, sid: str) -> bool:
        """Whether the live (not deleted) Session exists — `get_session` without building
        the Session: what routing a request to its Session actor needs."""
        row = (
            self._connection()
            .execute(
                "SELECT 1 FROM sessions WHERE workspace_id = ? AND session_id = ? AND deleted = 0",
                (ws, sid),
            )
            .fetchone()
        )
        return row is not None

    def get_fork_operation(self, ws: str, op_id: str) -> ForkOperation:
        """The operation (a committed one with its child projection). Its row is one
        statement; a committed one's snapshot, read by a second, never changes once written."""
        return load_op(self._connection(), ws, op_id, projections=self._projections)

    @property
    def in_transaction(self) -> bool:
        """True while a read holds a snapshot (never between two reads)."""
        return self._conn is not None and self._conn.txn_state() != apsw.SQLITE_TXN_NONE

    def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(apsw.Error):
                conn.close()
