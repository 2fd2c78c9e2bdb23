"""Loaded by every Python process of `bench.stall` (this folder leads its PYTHONPATH): the
suspects of the mutations' phase-A stall stamped on the wall clock the load clients' `t0`/`t1`
use (`time.time() * 1000`), one file per process.

Inert unless `AGENTHOST_STALL_DIR` is set. In every process (daemon, workers, app-servers, the
load clients, the bench itself): each cyclic-collector pause (`gc.callbacks`). In the daemon:
with `AGENTHOST_STALL_LAG_MS` set, a probe thread that sleeps that long and records each
wake-up more than 3 ms late (the daemon could not run Python: the GIL held, or no CPU; the row's
detail is the part of it the thread sat on a run queue, from `/proc/thread-self/schedstat`), and the
machine's pages dirty and under writeback (`/proc/vmstat`); after a GIL wait of 15 ms or more,
where every thread not parked in a wait stands (the holder has just let go); and,
once its modules are imported: each group COMMIT (`Database._end_group`: the COMMIT and
its fsync), each `submit_write` (its caller's wait and its body's run, by the body's
name), the WAL's length after each, each WAL checkpoint (with its answer), the checkpoint
janitor's sweeps, each workspace capture, each request's arrival on the transport loop (its
dispatch timed), each actor message handled, each Turn submit in its actor, every child
process started, every timer callback, every log record. A row is
`[kind, start_ms, duration_ms, detail]`; the file's first line is the process's argv.
`AGENTHOST_STALL_GC_TYPES=1`: the daemon's gen-2 garbage counted by type (a `gc_types` row).
`AGENTHOST_STALL_NICE_PROVIDERS=N` runs the app-servers and workers N nice levels down.
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("AGENTHOST_STALL_DIR")

if _DIR:
    import contextlib
    import gc
    import json
    import threading
    import time
    from typing import Any

    # Rows are tuples of atoms: the collector stops tracking them, so the probe's own rows do
    # not lengthen the daemon's collections it times (lists would be walked by every one).
    _rows: list[tuple[Any, ...]] = []
    _dump_lock = threading.Lock()
    _started: dict[int, float] = {}
    _SERVE = "serve" in sys.argv
    _LAG_MS = float(os.environ.get("AGENTHOST_STALL_LAG_MS") or 0) if _SERVE else 0.0

    def _now() -> float:
        return time.time() * 1000.0

    _GC_TYPES = _SERVE and bool(os.environ.get("AGENTHOST_STALL_GC_TYPES"))

    def _on_gc(phase: str, info: dict[str, Any]) -> None:
        me = threading.get_ident()
        gen2 = info.get("generation") == 2
        if phase == "start":
            if _GC_TYPES and gen2:
                gc.set_debug(gc.DEBUG_SAVEALL)  # this collection's garbage kept to be counted
            _started[me] = _now()
            return
        if _GC_TYPES and gen2:
            gc.set_debug(0)
            from collections import Counter

            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
            gc.garbage.clear()
            _rows.append(("gc_types", _now(), 0.0, json.dumps(kinds.most_common(12))))
        began = _started.pop(me, None)
        if began is not None:
            _rows.append(
                (
                    "gc",
                    began,
                    _now() - began,
                    f"gen{info.get('generation')} {info.get('collected')}",
                )
            )

    gc.callbacks.append(_on_gc)

    _NICE = int(os.environ.get("AGENTHOST_STALL_NICE_PROVIDERS") or 0)
    if _NICE and ("app-server" in sys.argv or any("drivers/worker" in a for a in sys.argv[:1])):
        # The experiment: providers below the daemon in the kernel's choice of whom to preempt.
        with contextlib.suppress(OSError):
            os.nice(_NICE)

    _written = [0]

    def _dump() -> None:
        """Append the rows since the last call (cheap: a daemon's probe must not hold the GIL
        long on its own account)."""
        with _dump_lock, contextlib.suppress(OSError):
            path = os.path.join(_DIR, f"{os.getpid()}.jsonl")  # type: ignore[arg-type]
            rows = _rows[_written[0] :]
            with open(path, "a") as f:
                if _written[0] == 0 and f.tell() == 0:
                    f.write(json.dumps(sys.argv[:4]) + "\n")
                f.write("".join(json.dumps(row) + "\n" for row in rows))
            _written[0] += len(rows)

    def _vmstat(tick: int) -> None:
        """The machine's pages under writeback (a row whenever any are) and dirty (a row
        every 20th probe), from /proc/vmstat: the kernel's flusher and the journal's commits
        share the disk with the store's fsyncs."""
        try:
            with open("/proc/vmstat") as f:
                got = dict(
                    line.split() for line in f if line.startswith(("nr_dirty ", "nr_writeback "))
                )
        except (OSError, ValueError):
            return
        if int(got.get("nr_writeback", 0)) > 0:
            _rows.append(("writeback", _now(), 0.0, int(got["nr_writeback"])))
        if tick % 20 == 0:
            _rows.append(("dirty", _now(), 0.0, int(got.get("nr_dirty", 0))))

    _IDLE = ("wait", "sleep", "poll", "select", "_recv", "recv", "get", "acquire", "join")

    def _frames() -> list[str]:
        """Where every other thread is at the moment a long GIL wait ends: the one that held
        it has just let go, so it is among those not parked in a wait."""
        names = {t.ident: t.name for t in threading.enumerate()}
        out = []
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue
            code = frame.f_code
            if code.co_name.startswith(_IDLE):
                continue
            where = []
            f: Any = frame
            while f is not None and len(where) < 3:
                where.append(
                    f"{f.f_code.co_name}@{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
                )
                f = f.f_back
            out.append(f"{names.get(ident, ident)}: {' < '.join(where)}")
        return out

    def _runq_ns() -> int:
        """This thread's time waiting on a run queue (no CPU), from the kernel's schedstat."""
        try:
            with open("/proc/thread-self/schedstat") as f:
                return int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def _timed(owner: Any, attr: str, kind: str, detail: Any = None) -> None:
        inner = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = _now()
            try:
                return inner(*args, **kwargs)
            finally:
                _rows.append((kind, t0, _now() - t0, detail(args) if detail else ""))

        setattr(owner, attr, timed)

    def _writes_timed(database: Any) -> None:
        """Each `submit_write` stamped twice: its caller's whole wait (`write`: baton, body,
        COMMIT) and its body's run on whichever thread ran it (`body`), both with the body's
        name, so a mutation's write can be lined up against the bodies it queued behind."""
        inner = database.submit_write

        def submit_write(self: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
            name = getattr(body, "__qualname__", type(body).__name__)

            def timed_body(tx: Any) -> Any:
                b0 = _now()
                try:
                    return body(tx)
                finally:
                    _rows.append(("body", b0, _now() - b0, name))

            t0 = _now()
            try:
                return inner(self, timed_body, *args, **kwargs)
            finally:
                _rows.append(("write", t0, _now() - t0, name))

        database.submit_write = submit_write

    def _checkpoint_timed(database: Any) -> None:
        """Each PASSIVE checkpoint pass of `storage.base`'s checkpointer timed with its answer
        (WAL frames, frames copied) and the WAL file's size after, and each pass that held
        the writer baton to let the WAL start again (`wal_restart`)."""
        if not hasattr(database, "_checkpoint_pass"):
            _checkpoint_loop_timed(database)  # a tree from before the pass was a method
        else:
            _checkpoint_pass_timed(database)
        pages = int(os.environ.get("AGENTHOST_STALL_CHECKPOINT_PAGES") or 0)
        if pages:
            # An A/B of the checkpoint's mark (`bench.stall_checkpoint`).
            init = database.__init__

            def init_with_pages(self: Any, *args: Any, **kwargs: Any) -> None:
                init(self, *args, **kwargs)
                _set_pages(self, pages)

            database.__init__ = init_with_pages
            import gc

            for obj in gc.get_objects():  # a store opened before this thread saw the module
                if isinstance(obj, database):
                    _set_pages(obj, pages)

    def _set_pages(db: Any, pages: int) -> None:
        db.checkpoint_pages = pages
        if hasattr(db, "wal_bound_pages"):
            db.wal_bound_pages = max(db.wal_bound_pages, 16 * pages)

    def _checkpoint_pass_timed(database: Any) -> None:
        inner = database._checkpoint_pass

        def checkpoint_pass(self: Any, conn: Any) -> Any:
            t0 = _now()
            got = inner(self, conn)
            size: list[int] = []
            with contextlib.suppress(OSError):
                size = [os.stat(self.path + "-wal").st_size // 4096]
            _rows.append(("wal_checkpoint", t0, _now() - t0, json.dumps([list(got), *size])))
            return got

        database._checkpoint_pass = checkpoint_pass
        _timed(database, "_restart_wal", "wal_restart")
        if hasattr(database, "_restart_pass"):
            _timed(database, "_restart_pass", "wal_restart_pass")

    def _checkpoint_loop_timed(database: Any) -> None:
        """The checkpointer's loop as `storage.base` ran it before its pass was a method."""
        import logging

        log = logging.getLogger("storage.base")

        def loop(self: Any) -> None:
            while True:
                self._checkpoint_due.wait()
                self._checkpoint_due.clear()
                if self._closed:
                    return
                try:
                    t0 = _now()
                    with self.lease() as conn:
                        got = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    size: list[int] = []
                    with contextlib.suppress(OSError):
                        size = [os.stat(self.path + "-wal").st_size // 4096]
                    detail = json.dumps([list(got[0][1:]), *size])
                    _rows.append(("wal_checkpoint", t0, _now() - t0, detail))
                    with self._baton:
                        self.write_stats.checkpoints += 1
                except Exception as exc:  # noqa: BLE001 - as storage.base
                    if not self._closed:
                        log.warning("store checkpoint failed: %s", exc)

        database._checkpoint_loop = loop

    def _wal_pages(database: Any) -> None:
        """The WAL's length in pages after each COMMIT (SQLite's WAL hook)."""
        inner = database._wal_grew

        def grew(self: Any, conn: Any, db: str, pages: int) -> int:
            _rows.append(("wal_pages", _now(), 0.0, pages))
            return int(inner(self, conn, db, pages))

        database._wal_grew = grew
        # The writer's connection binds the hook when it is first leased, which may be before
        # this poll found the module: bind it again, once, on the writer's thread.
        lease = database._writer_connection
        rebound: set[int] = set()

        def writer_connection(self: Any) -> Any:
            conn = lease(self)
            if id(conn) not in rebound:
                rebound.add(id(conn))
                conn.set_wal_hook(self._wal_grew)
            return conn

        database._writer_connection = writer_connection

    def _timer_fn(handle_cls: Any) -> None:
        inner = handle_cls._take

        def take(self: Any) -> Any:
            fn = inner(self)
            if fn is None:
                return None

            def run() -> None:
                t0 = _now()
                try:
                    fn()
                finally:
                    name = getattr(fn, "__qualname__", repr(fn))
                    _rows.append(("timer", t0, _now() - t0, name))

            return run

        handle_cls._take = take

    def _method(frames: list[bytes]) -> str:
        """The request's method and Session id, read off the MessagePack bytes (no decode)."""
        body = frames[-1] if frames else b""
        method = "other"
        for name in (b"turn.submit", b"session.updateTitle", b"session.timeline"):
            if name in body:
                method = name.decode()
                break
        at = body.find(b"agentSessionId")
        if at < 0:
            return method
        head = at + len(b"agentSessionId")
        if body[head : head + 1] == b"\xd9":  # str 8
            size, head = body[head + 1], head + 1
        elif body[head : head + 1] and body[head] >> 5 == 0b101:  # fixstr
            size = body[head] & 0x1F
        else:
            return method
        return f"{method} {body[head + 1 : head + 1 + size].decode(errors='replace')}"

    def _spawns() -> None:
        """Every child process the daemon starts (git, a worker): its start's duration."""
        import subprocess

        inner = subprocess.Popen.__init__

        def init(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
            t0 = _now()
            try:
                inner(self, args, *rest, **kwargs)
            finally:
                words = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
                _rows.append(("spawn", t0, _now() - t0, " ".join(words[:4])[:120]))

        subprocess.Popen.__init__ = init  # type: ignore[method-assign]

    def _log_handle() -> None:
        import logging

        inner = logging.Logger.handle

        def handle(self: logging.Logger, record: logging.LogRecord) -> None:
            t0 = _now()
            inner(self, record)
            _rows.append(("log", t0, _now() - t0, f"{record.name}: {record.getMessage()[:100]}"))

        logging.Logger.handle = handle  # type: ignore[method-assign]

    def _install() -> None:
        """Wrap the daemon's points once imported; write the rows every second (a worker or
        an app-server may end by a signal)."""
        pending = (
            {
                "storage.base",
                "actors.pool",
                "actors.checkpoints",
                "actors.session_turns",
                "transport.server",
            }
            if _SERVE
            else set()
        )
        if _SERVE:
            _log_handle()
            _spawns()
        last = time.monotonic()
        dumped = last
        ticks = 0
        runq = _runq_ns()
        step = _LAG_MS / 1000 if _LAG_MS > 0 else 0.1
        while True:
            for name in list(pending):
                module = sys.modules.get(name)
                if module is None:
                    continue
                if name == "storage.base" and hasattr(module, "Database"):
                    _timed(module.Database, "_end_group", "commit", lambda a: a[1].members)
                    _checkpoint_timed(module.Database)
                    _wal_pages(module.Database)
                    _writes_timed(module.Database)
                elif name == "actors.pool" and hasattr(module, "PooledActor"):
                    _timer_fn(module.TimerHandle)
                    _timed(
                        module.PooledActor,
                        "_handle_envelope",
                        "actor_message",
                        lambda a: f"{type(a[1].message).__name__} {getattr(a[0], 'sid', '')}",
                    )
                elif name == "actors.session_turns" and hasattr(module, "TurnRunner"):
                    _timed(module.TurnRunner, "on_submit", "on_submit", lambda a: a[0]._core.sid)
                elif name == "transport.server" and hasattr(module, "ApiServer"):
                    _timed(module.ApiServer, "_handle", "request", lambda a: _method(a[1]))
                elif name == "actors.checkpoints" and hasattr(module, "CheckpointJanitor"):
                    _timed(module.CheckpointJanitor, "sweep", "janitor_sweep")
                    _timed(module.TurnCheckpoints, "_run", "capture", lambda a: a[4])
                else:
                    continue
                pending.discard(name)
            time.sleep(step)
            now = time.monotonic()
            late = (now - last - step) * 1000
            if _LAG_MS > 0:
                queued = _runq_ns()
                if late > 3.0:
                    # detail: the ms of it this thread sat on a run queue (no CPU for it); the
                    # rest it waited for the GIL.
                    ran = round((queued - runq) / 1e6, 2)
                    _rows.append(("lag", _now() - late, late, ran))
                    if late - ran >= 15.0:
                        _rows.append(("gil_wait", _now() - late, late - ran, json.dumps(_frames())))
                runq = queued
            if _LAG_MS > 0:
                _vmstat(ticks)
                ticks += 1
            if now - dumped >= 1.0:
                _dump()
                dumped = time.monotonic()
                runq = _runq_ns()
            last = time.monotonic()

    threading.Thread(target=_install, name="stall-stamps", daemon=True).start()
    import atexit

    atexit.register(_dump)
