"""`WorkerSupervisor`: the host side of the driver workers — one isolated process per provider kind,
spawned on demand (or ahead of it, `start_ahead`), heartbeated, declared dead on exit or 5 s
of silence, and restarted with backoff.

One loop thread owns every socket and child process (so Linux's parent-death signal stays tied
to a thread that lives until `close()`); a second thread delivers results and events in arrival
order, so a slow callback can never starve heartbeats.

The loop sleeps in `epoll` until a descriptor fires or its housekeeping (`_tick`) is due. A
worker's exit is a descriptor too (its pidfd, readable once the process has exited), so a death
is seen at once; the tick runs only when its earliest deadline comes (a heartbeat, a start
timeout, a watchdog look, a restart, a request's expiry: `_next_due`), never on each message.
Where the kernel gives no pidfd, that worker's exit is polled by the tick, as often as
`TICK_EVERY_S` while messages keep the loop awake and every `IDLE_POLL_S` while idle.

This module is the loop, its public API, its hung-worker judgement (`judge`: busy or hung) and
its delivery thread (`Deliveries`, with its sinks). Beside it, one concern each:
`worker_state` (the records the loop keeps), `worker_spawn` (a worker's socket, environment and
command line).

The delivery thread: results, failures, turn events and lifecycle events are handed to their
waiters and sinks in arrival order on a thread of their own, so a slow callback can never
starve the loop thread (heartbeats, deadlines) and a sink bug never stops later deliveries.
One exception, for fewer thread hand-offs on a fork's path and a Turn's stream: the result of
a method whose every waiter only hands it on — `INLINE_METHODS`, answered to a Session actor
by a `tell` — and a streamed delta or a Turn's end (`INLINE_EVENTS`) are delivered on the
loop thread itself when nothing is queued or running there, so arrival order still holds; a
fork then reaches its actor in one hop (loop → actor) instead of two (loop → delivery thread →
actor), each a thread wake-up and a GIL hand-off, and a delta with nothing ahead of it goes from
here straight to its subscribers (the daemon's sink sends it on the events XPUB).

The hung-worker judgement: a worker silent past the link's limit is dead only when its process
makes no CPU progress over a whole window, or once it has been silent past
`BUSY_SILENCE_LIMIT_S`; a silent worker that keeps running is busy (its heartbeat thread
starved: 200 app-servers starting at once, a C call holding the GIL) and is kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any, NamedTuple

import zmq

from domain.errors import HostError
from domain.procfs import read_proc_stat, stat_after_command
from drivers.errors import WorkerError, WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.failpoints import Failpoints as _Failpoints
from drivers.failpoints import format_points, parse_points
from drivers.runtime_marker import WORKER_VAR, end_worker_left, new_marker
from drivers.worker_spawn import reclaim_socket_dir, socket_dir, start_worker, worker_env
from drivers.worker_state import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    STABLE_AFTER_S,
    Pending,
    WorkerRecord,
    WorkerState,
)
from protocol.objects import WorkerStatus
from transport import accept_shim
from transport.worker_link import (
    HB_MSG,
    HEARTBEAT_INTERVAL_S,
    SILENCE_LIMIT_S,
    HostEnd,
    Mailbox,
    MsgType,
    req_msg,
)

_EVT = MsgType.EVT.value  # a plain str: compared per message

TICK_EVERY_S = 0.01
"""The least gap between two runs of the loop's housekeeping (`_tick`), which otherwise runs
when its earliest deadline is due (`_next_due`); and how often a worker without a pidfd is
polled for its exit while messages keep the loop awake."""
IDLE_POLL_S = 0.1
"""The loop's longest sleep while a worker without a pidfd (an old kernel) must be polled."""
EARLY_S = 0.25
"""A tick does the periodic work (a heartbeat, a CPU sample) due within this much (at most half
its period), so the workers' periods fall in step: an idle loop wakes once a heartbeat period,
not once per worker and per kind of work."""
LONGEST_SLEEP_S = 5.0
"""The loop's longest sleep with nothing due (a bound, not a clock anything waits on)."""

__all__ = [
    "BUSY_SILENCE_LIMIT_S",
    "EventSink",
    "LifecycleSink",
    "WorkerState",
    "WorkerSupervisor",
]


EventSink = Callable[[str, str, dict[str, Any]], None]
"""`sink(provider, agent_session_id, event)`; called on the delivery thread, in arrival order."""

LifecycleSink = Callable[[str, dict[str, Any]], None]
"""`sink(provider, {"type": "worker.ready"|"worker.lost", "pid", ...})`: lets the host fail the
turns that were streaming on a worker that died."""


INLINE_METHODS = frozenset({"fork", "runtime.attest", "session.start"})
"""Methods whose results may be delivered on the loop thread: their futures' callbacks only
parse the answer and `tell` the Session actor that waits (actors' `later`,
`actors.ports.request_fork`, `agenthost.workers.SupervisorPort`), never block."""


INLINE_EVENTS = frozenset({"message.delta", "turn.completed"})
"""Events the sink may take on the loop thread (when nothing is queued or running here, as
for `INLINE_METHODS`): a streamed delta's sink sends it on the events XPUB, or puts it on the
daemon's events queue behind what is there (and, at most once a second, tells the Session actor
its reply streams), a Turn's end only `tell`s its Session actor; neither blocks on work. A
Turn's ~20 deltas each skip a thread hand-off, and so does its end, on the way to its
settlement."""


class Deliveries:
    """One FIFO of callbacks and the thread that runs them. The sinks are read when a job runs
    (a sink set later still hears what was queued before)."""

    def __init__(self) -> None:
        self.event_sink: EventSink | None = None
        self.lifecycle_sink: LifecycleSink | None = None
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # Jobs put and not yet finished: raised only by the one producer (the loop thread:
        # every method but `close` is called there), lowered by the delivery thread under
        # `_count_lock` once a job has returned. So the producer reading 0 knows nothing is
        # queued or running, and it stays 0 until the producer puts again: an inline job
        # (taken when the backlog is empty) never overtakes nor overlaps a queued one, and
        # needs no lock to know it.
        self._backlog = 0
        self._count_lock = threading.Lock()
        self.inlined = 0  # results delivered on the caller's thread (tests read it)
        self._thread = threading.Thread(target=self._loop, name="worker-delivery", daemon=True)
        self._thread.start()

    def complete(self, pending: Pending, result: dict[str, Any]) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_result(result)

        if pending.method in INLINE_METHODS and self._run_inline(run):
            return
        self._put(run)

    def _put(self, job: Callable[[], None]) -> None:
        with self._count_lock:
            self._backlog += 1
        self._jobs.put(job)

    def _run_inline(self, job: Callable[[], None]) -> bool:
        """Run `job` on this thread if nothing is queued or running (else False: queue it).
        The producer's own read of the backlog decides it (see `__init__`): no lock."""
        if self._backlog:
            return False
        try:
            job()
        except Exception:  # a callback bug must not reach the supervisor's loop
            traceback.print_exc()
        self.inlined += 1
        return True

    def fail(self, pending: Pending, exc: HostError) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_exception(exc)

        self._put(run)

    def event(self, provider: str, sid: str, event: dict[str, Any]) -> None:
        if not self._backlog and event.get("type") in INLINE_EVENTS:
            # `_run_inline` without its closure and call: a Turn's ~20 deltas take this.
            sink = self.event_sink
            if sink is not None:
                try:
                    sink(provider, sid, event)
                except Exception:  # a sink bug must not reach the supervisor's loop
                    traceback.print_exc()
            self.inlined += 1
            return

        def run() -> None:
            sink = self.event_sink
            if sink is not None:
                sink(provider, sid, event)

        self._put(run)

    def lifecycle(self, provider: str, event: dict[str, Any]) -> None:
        def run() -> None:
            sink = self.lifecycle_sink
            if sink is not None:
                sink(provider, event)

        self._put(run)

    def close(self, timeout: float) -> None:
        """Runs what is queued, then stops."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a sink bug must not stop later deliveries
                traceback.print_exc()
            finally:
                with self._count_lock:
                    self._backlog -= 1


BUSY_SILENCE_LIMIT_S = 60.0
"""A silent worker whose process keeps using CPU is busy, not hung (its heartbeat thread is
starved: 200 app-servers starting at once, a C call holding the GIL). It is killed only after
this much silence, or sooner once its CPU time stops advancing."""
CPU_WINDOW_S = 2.0  # no CPU progress for this long while silent: hung
SAMPLE_EVERY_S = 1.0  # a talking worker's CPU time is sampled this often (a silence's baseline)


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of `pid` in clock ticks, read from the kernel (the worker cannot block
    this); None when it cannot be read (not Linux, process gone)."""
    try:
        fields = stat_after_command(read_proc_stat(pid))
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


class Verdict(NamedTuple):
    dead: str | None
    """Why the worker is to be declared dead; None while it is kept."""
    busy: bool = False
    """A silent window in which it kept running was counted (`busy_silences` changed)."""


def judge(worker: WorkerRecord, now: float) -> Verdict:
    """One look at a ready worker: samples its CPU time while it talks (so a silence is judged
    against a recent sample) and judges it once it is silent. Updates the record's samples."""
    silent = now - worker.last_seen
    pid = worker.proc.pid if worker.proc is not None else None
    if silent <= SILENCE_LIMIT_S:
        early = min(EARLY_S, SAMPLE_EVERY_S / 2)
        if pid is not None and now - worker.cpu_sampled_at >= SAMPLE_EVERY_S - early:
            worker.cpu_ticks, worker.cpu_sampled_at = cpu_ticks(pid), now
        return Verdict(None)
    if silent > BUSY_SILENCE_LIMIT_S:
        return Verdict(f"worker silent for {silent:.0f} s (busy limit)")
    if now - worker.cpu_sampled_at < CPU_WINDOW_S:
        return Verdict(None)  # judge over a whole window: a starved process runs in bursts
    ticks = cpu_ticks(pid) if pid is not None else None
    progressed = ticks is not None and worker.cpu_ticks is not None and ticks > worker.cpu_ticks
    worker.cpu_ticks, worker.cpu_sampled_at = ticks, now
    if progressed:
        worker.busy_silences += 1
        return Verdict(None, busy=True)
    return Verdict(f"worker silent for {silent:.0f} s and not running (hung)")


def next_look(worker: WorkerRecord, now: float) -> float:
    """When `judge` next has something to do for this ready worker: while it talks, its next
    CPU sample or the moment its silence passes the link's limit; once silent, the end of the
    sampling window or the busy limit."""
    if now - worker.last_seen <= SILENCE_LIMIT_S:
        silent_at = worker.last_seen + SILENCE_LIMIT_S
        if worker.proc is None:
            return silent_at
        return min(worker.cpu_sampled_at + SAMPLE_EVERY_S, silent_at)
    return min(worker.cpu_sampled_at + CPU_WINDOW_S, worker.last_seen + BUSY_SILENCE_LIMIT_S)


log = logging.getLogger(__name__)


def _arm_msg(req_id: int, points: Mapping[str, str]) -> dict[str, Any]:
    """A worker's `debug.failpoints` from its supervisor: the points, never clearing a fired
    `once:` marker (`set_failpoints` cleared them as it armed; a worker reading this after a
    sibling claimed the point would otherwise let it fire again)."""
    return req_msg(req_id, "debug.failpoints", {"points": dict(points), "clearMarkers": False})


class WorkerSupervisor:
    """Owns the worker processes of one daemon. Thread-safe public methods."""

    def __init__(
        self,
        run_dir: Path,
        *,
        python: str = sys.executable,
        env_overrides: dict[str, str] | None = None,
        provider_config: dict[str, dict[str, Any]] | None = None,
        failpoints: str = "",
        start_timeout: float = 20.0,
    ) -> None:
        self._run_dir = Path(run_dir)
        self._run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._python = python
        self._env_overrides = dict(env_overrides or {})
        self._provider_config = {k: dict(v) for k, v in (provider_config or {}).items()}
        self._points = parse_points(failpoints)
        self._start_timeout = start_timeout
        # A fresh run forgets which `once:` points fired in a previous one.
        self._fp_state = self._run_dir / "failpoints-state"
        shutil.rmtree(self._fp_state, ignore_errors=True)
        self._fp_state.mkdir(mode=0o700)
        self._sock_dir, self._own_sock_dir = socket_dir(self._run_dir)
        # The worker links (`_spawn_once`) may take the descriptor reserve the accept shim
        # keeps free of connections: it is theirs.
        accept_shim.keep_accepts_on(f"{self._sock_dir}/w-")

        self._ctx: zmq.Context[Any] = zmq.Context()
        self._mailbox = Mailbox()
        # The loop's poll set: the mailbox's eventfd and each live link's `zmq.FD`, by number.
        self._epoll = select.epoll()
        self._by_fd: dict[int, WorkerRecord] = {}
        self._by_pidfd: dict[int, WorkerRecord] = {}  # each live worker's pidfd, by number
        self._workers: dict[str, WorkerRecord] = {}
        self._ids = 0
        self._ids_lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._status: dict[str, WorkerStatus] = {}
        self._closing = threading.Event()
        self._deliveries = Deliveries()
        self._ticked_at = 0.0  # the loop thread's last `_tick`
        self._due_at = 0.0  # when `_tick` is next due (never later; it may come early)
        self._polled = False  # a live worker has no pidfd: its exit is polled by the tick
        self.ticks = 0  # `_tick` runs (tests read it)
        self.wakeups = 0  # the loop's returns from its sleep in `epoll` (tests read it)
        self._loop_thread = threading.Thread(
            target=self._loop, name="worker-supervisor", daemon=True
        )
        self._loop_thread.start()

    # ----------------------------------------------------------------- public API

    def restore_dirs(self) -> None:
        """Make the run dir and the failpoint state dir again after they were removed under
        the live daemon (its parent must exist: never made here with a looser mode). Running
        workers are unaffected (a connected ipc socket needs no file); the next spawn binds
        its socket and opens its log here."""
        self._run_dir.mkdir(mode=0o700, exist_ok=True)
        self._fp_state.mkdir(mode=0o700, exist_ok=True)
        if self._own_sock_dir:
            # A cleaner of the temp dir may have removed it, and its name is predictable: it is
            # checked again (not ours: a fresh one) before the next socket is bound in it.
            sock_dir = reclaim_socket_dir(self._sock_dir, self._run_dir)
            if sock_dir != self._sock_dir:
                self._sock_dir = sock_dir
                accept_shim.keep_accepts_on(f"{sock_dir}/w-")

    def request(
        self,
        provider: str,
        method: str,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = 30.0,
    ) -> Future[dict[str, Any]]:
        """Send one request to `provider`'s worker (spawning it on demand).

        The future fails with `WorkerUnavailable` (never sent), `WorkerLost` (sent; the worker
        died), `WorkerTimeout` (sent; no answer in `timeout` s) or `WorkerError` (`ok: false`).
        Cancelling it only works while it has not been sent.
        """
        fut: Future[dict[str, Any]] = Future()
        if self._closing.is_set():
            fut.set_exception(WorkerUnavailable("worker supervisor is closed"))
            return fut
        with self._ids_lock:
            self._ids += 1
            req_id = self._ids
        deadline = None if timeout is None else time.monotonic() + timeout
        self._mailbox.put(
            ("req", Pending(req_id, provider, method, dict(params or {}), fut, deadline))
        )
        return fut

    def start_ahead(self, provider: str) -> None:
        """Spawn `provider`'s worker now, before any request needs it, if it has none yet (a
        worker once spawned is this supervisor's for good: restarted on death, closed by
        `close`, exactly as one spawned by a request). Nothing is sent to it; a request made
        meanwhile queues until its hello as usual. A no-op once closing."""
        if not self._closing.is_set():
            self._mailbox.put(("ahead", provider))

    def set_event_sink(self, fn: EventSink | None) -> None:
        self._deliveries.event_sink = fn

    def set_lifecycle_sink(self, fn: LifecycleSink | None) -> None:
        self._deliveries.lifecycle_sink = fn

    def set_failpoints(self, points: Mapping[str, str]) -> dict[str, str]:
        """Arm points in every live worker and in every worker spawned later; returns the map
        now in force. A bad action raises ValueError and changes nothing."""
        checked = parse_points(format_points({str(k): str(v) for k, v in points.items()}))
        # Re-arming clears fired `once:` markers so the next incarnation sees them armed: here,
        # once, before any worker has the arming; the workers are sent it with
        # `clearMarkers: false` (`_arm_msg`), since one reading it late must not undo a claim.
        _Failpoints(state_dir=self._fp_state).set(checked)
        self._mailbox.put(("failpoints", checked))
        merged = dict(self._points)
        for name, action in checked.items():
            if action == "off":
                merged.pop(name, None)
            else:
                merged[name] = action
        return merged

    def status(self) -> list[WorkerStatus]:
        with self._status_lock:
            return [v.copy() for _, v in sorted(self._status.items())]

    def close(self, timeout: float = 5.0) -> None:
        """Terminate every worker (SIGTERM, then SIGKILL) and fail what is pending."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._mailbox.put(("close", None))
        self._loop_thread.join(timeout + 5.0)
        self._deliveries.close(5.0)
        if self._loop_thread.is_alive():
            # Its worker links are still open (a socket is its thread's to close), and `term()`
            # blocks until every socket of the context is closed: the stop would hang. The
            # context and the mailbox (whose descriptor the loop still reads: closed, its number
            # could name another file) are left to the process's exit instead.
            log.warning("worker supervisor: its loop did not stop in %.1f s", timeout + 5.0)
        else:
            self._mailbox.close()
            self._ctx.term()
        if self._own_sock_dir:
            shutil.rmtree(self._sock_dir, ignore_errors=True)

    def __enter__(self) -> WorkerSupervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- loop thread

    def _loop(self) -> None:
        self._epoll.register(self._mailbox.fd, select.EPOLLIN)
        try:
            while True:
                try:
                    if self._iterate():
                        return
                except Exception:  # noqa: BLE001 - this thread is every request's clock
                    log.exception("worker supervisor loop iteration failed; continuing")
                    time.sleep(0.05)  # an error that repeats at once must not spin a core
        finally:
            self._shutdown()
            self._epoll.close()

    def _iterate(self) -> bool:
        """One pass of the loop; True when told to close.

        The loop sleeps in `epoll` on descriptors only: the mailbox's eventfd and each link's
        `zmq.FD`, which signals a change of the socket's state once, and which any operation on
        the socket may take. So a link whose descriptor fired is drained until `zmq.EVENTS` says
        no frame waits (`_read`), and one the loop sent on since its last look is looked at
        before the next sleep (`_look_after_sends`): no frame is left unread without a signal
        still to come."""
        mailbox_fd = self._mailbox.fd
        sleep = self._due_at - time.monotonic()
        sleep = max(0.0, min(sleep, IDLE_POLL_S if self._polled else LONGEST_SLEEP_S))
        for fd, _ in self._epoll.poll(sleep):
            if fd == mailbox_fd:
                if self._take_mail():
                    return True
            else:
                worker = self._by_fd.get(fd)
                if worker is not None:
                    self._read(worker)
                else:
                    exited = self._by_pidfd.get(fd)
                    if exited is not None:
                        self._exited(exited)
        self.wakeups += 1
        now = time.monotonic()
        if now >= self._due_at or (self._polled and now - self._ticked_at >= TICK_EVERY_S):
            self._ticked_at = now
            self._tick()
        self._look_after_sends()
        return False

    def _due(self, at: float) -> None:
        """Something is due at `at`: the loop's sleep ends by then."""
        if at < self._due_at:
            self._due_at = at

    def _take_mail(self) -> bool:
        """Everything the other threads put in the mailbox; True when told to close."""
        for kind, item in self._mailbox.drain():
            if kind == "close":
                return True
            if kind == "req":
                try:
                    self._submit(item)
                except Exception as exc:  # noqa: BLE001 - the waiter gets a typed error
                    self._fail(item, WorkerUnavailable(f"{item.method} not sent: {exc}"))
            elif kind == "failpoints":
                self._forward_failpoints(item)
            elif kind == "ahead":
                self._worker_of(item)
        return False

    def _look_after_sends(self) -> None:
        """A link the loop sent on (a request, a heartbeat) since it last looked may hold a
        frame whose descriptor signal the send took: read it now, not after the next one."""
        again = True
        while again:
            again = False
            for worker in self._workers.values():
                end = worker.end
                if end is not None and end.unlooked and end.more():
                    self._read(worker)
                    again = True  # reading may have sent (a hello's queued requests)

    def _attach(self, worker: WorkerRecord, end: HostEnd) -> None:
        worker.end = end
        self._by_fd[end.fd] = worker
        self._epoll.register(end.fd, select.EPOLLIN)

    def _detach(self, worker: WorkerRecord) -> None:
        """Close the worker's link (its descriptor leaves the poll set first)."""
        end = worker.end
        if end is None:
            return
        worker.end = None
        if self._by_fd.get(end.fd) is worker:
            del self._by_fd[end.fd]
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(end.fd)
        with contextlib.suppress(Exception):
            end.close()

    def _watch(self, worker: WorkerRecord) -> None:
        """Put the new incarnation's pidfd in the poll set: its exit wakes the loop. Without
        one (no `os.pidfd_open`, or the kernel refuses it) the tick polls the process."""
        assert worker.proc is not None
        try:
            pidfd = os.pidfd_open(worker.proc.pid)
        except (AttributeError, OSError):
            self._polled = True
            return
        worker.pidfd = pidfd
        self._by_pidfd[pidfd] = worker
        self._epoll.register(pidfd, select.EPOLLIN)

    def _unwatch(self, worker: WorkerRecord) -> None:
        """Close the incarnation's pidfd (it leaves the poll set first)."""
        pidfd = worker.pidfd
        if pidfd is None:
            return
        worker.pidfd = None
        if self._by_pidfd.get(pidfd) is worker:
            del self._by_pidfd[pidfd]
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(pidfd)
        os.close(pidfd)

    def _exited(self, worker: WorkerRecord) -> None:
        """The worker's pidfd fired. What it sent before it exited is read first; then it is
        dead (its requests in flight fail now, not at a tick)."""
        proc = worker.proc
        if proc is None or proc.poll() is None:
            return  # not this incarnation's exit (a number reused within one poll's batch)
        self._read(worker)
        if worker.proc is proc:
            self._on_death(worker, f"worker exited with status {proc.returncode}")

    def _worker_of(self, provider: str) -> WorkerRecord:
        """`provider`'s worker record, its first incarnation spawned if it had none."""
        worker = self._workers.get(provider)
        if worker is None:
            worker = WorkerRecord(provider)
            self._workers[provider] = worker
            self._spawn(worker)
        return worker

    def _submit(self, pending: Pending) -> None:
        worker = self._worker_of(pending.provider)
        if worker.state is WorkerState.READY:
            self._send(worker, pending)
        else:
            worker.queued.append(pending)
        if pending.deadline is not None:
            self._due(pending.deadline)

    def _send(self, worker: WorkerRecord, pending: Pending) -> None:
        if not pending.future.set_running_or_notify_cancel():
            return  # cancelled by the caller before it left the host
        assert worker.end is not None
        if worker.end.send(req_msg(pending.req_id, pending.method, pending.params)):
            pending.sent = True
            worker.inflight[pending.req_id] = pending
        else:
            self._fail(pending, WorkerUnavailable(f"{worker.provider} worker is not reachable"))

    def _forward_failpoints(self, points: dict[str, str]) -> None:
        for name, action in points.items():
            if action == "off":
                self._points.pop(name, None)
            else:
                self._points[name] = action
        for worker in self._workers.values():
            if worker.state is WorkerState.READY and worker.end is not None:
                with self._ids_lock:
                    self._ids += 1
                    req_id = self._ids
                # Fire-and-forget: its answer arrives with an id nobody waits for.
                worker.end.send(_arm_msg(req_id, points))

    def _send_points_armed_while_starting(self, worker: WorkerRecord) -> None:
        """Points armed (or turned off) after this incarnation was spawned never reached it
        (only READY workers are sent them): send the difference before any queued request, so
        a request made after `debug.failpoints` answered sees the point armed."""
        changed = {
            name: action
            for name, action in self._points.items()
            if worker.spawned_points.get(name) != action
        }
        changed.update({name: "off" for name in worker.spawned_points if name not in self._points})
        if changed and worker.end is not None:
            with self._ids_lock:
                self._ids += 1
                req_id = self._ids
            worker.end.send(_arm_msg(req_id, changed))

    def _spawn(self, worker: WorkerRecord) -> None:
        """Start an incarnation; any failure (EMFILE, ENOMEM, a missing python) is a death
        with backoff, never an exception out of the loop thread (a raise here
        would kill the supervisor, and with it every later turn and request timeout)."""
        try:
            self._spawn_once(worker)
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any spawn failure
            self._detach(worker)
            if worker.proc is not None and worker.proc.poll() is None:
                with contextlib.suppress(Exception):
                    worker.proc.kill()
            worker.proc = None
            self._on_death(worker, f"spawn failed: {type(exc).__name__}: {exc}")

    def _spawn_once(self, worker: WorkerRecord) -> None:
        worker.generation += 1
        endpoint = f"ipc://{self._sock_dir}/w-{worker.provider}-{worker.generation}.sock"
        self._attach(worker, HostEnd(self._ctx, endpoint))
        worker.spawned_points = dict(self._points)
        env = worker_env(
            self._env_overrides,
            self._points,
            self._fp_state,
            self._provider_config.get(worker.provider, {}),
        )
        worker.incarnation = env[WORKER_VAR] = new_marker()
        log_path = self._run_dir / f"worker-{worker.provider}.log"
        now = time.monotonic()
        worker.proc = None
        worker.proc = start_worker(self._python, worker.provider, endpoint, env, log_path)
        self._watch(worker)
        worker.state = WorkerState.STARTING
        worker.cpu_ticks, worker.cpu_sampled_at = None, now
        worker.spawned_at = now
        worker.last_seen = now
        worker.last_hb = now
        worker.restart_at = None
        self._due(now + self._start_timeout)
        self._publish_status(worker)

    def _read(self, worker: WorkerRecord) -> None:
        end = worker.end
        while end is not None and worker.end is end:
            msg = end.recv()
            if msg is None:
                if end.more():
                    continue  # a frame dropped (not the worker's, not a link map)
                return
            self._handle(worker, msg)
            # Poll said one was there; `zmq.EVENTS` says whether another is.
            if worker.end is not end or not end.more():
                return

    def _handle(self, worker: WorkerRecord, msg: dict[str, Any]) -> None:
        """One message read from `worker`'s link."""
        worker.last_seen = time.monotonic()
        kind = msg["t"]
        if kind == _EVT:  # a Turn's stream: most of what arrives
            sid, event = msg.get("agentSessionId"), msg.get("event")
            if isinstance(sid, str) and isinstance(event, dict):
                self._deliveries.event(worker.provider, sid, event)
        elif kind == MsgType.HELLO:
            if worker.state is WorkerState.STARTING:
                worker.state = WorkerState.READY
                self._due(0.0)  # its heartbeats and the watchdog's looks begin
                self._publish_status(worker)
                pid = worker.proc.pid if worker.proc else None
                self._lifecycle("worker.ready", worker, pid=pid)
                self._send_points_armed_while_starting(worker)
                while worker.queued and worker.state is WorkerState.READY:
                    self._send(worker, worker.queued.popleft())
        elif kind == MsgType.RES:
            pending = worker.inflight.pop(msg.get("id"), None)  # type: ignore[arg-type]
            if pending is None:
                return  # timed out already, or a fire-and-forget request
            if msg.get("ok") is True:
                result = msg.get("result")
                self._complete(pending, result if isinstance(result, dict) else {})
            else:
                error = msg.get("error")
                self._fail(pending, WorkerError(error if isinstance(error, dict) else {}))

    def _tick(self) -> None:
        self.ticks += 1
        now = time.monotonic()
        beat_after = HEARTBEAT_INTERVAL_S - min(EARLY_S, HEARTBEAT_INTERVAL_S / 2)
        for worker in self._workers.values():
            proc = worker.proc
            if worker.state in (WorkerState.STARTING, WorkerState.READY):
                # A worker with a pidfd is seen dead by it (`_exited`), not polled here.
                if worker.pidfd is None and proc is not None and proc.poll() is not None:
                    self._on_death(worker, f"worker exited with status {proc.returncode}")
                    continue
                if worker.state is WorkerState.READY and self._hung(worker, now):
                    continue
                if (
                    worker.state is WorkerState.STARTING
                    and now - worker.spawned_at > self._start_timeout
                ):
                    self._on_death(worker, "worker did not say hello in time")
                    continue
                if worker.state is WorkerState.READY and now - worker.last_hb >= beat_after:
                    assert worker.end is not None
                    worker.end.send(HB_MSG)
                    worker.last_hb = now
            elif (
                worker.state is WorkerState.BACKOFF
                and worker.restart_at is not None
                and now >= worker.restart_at
            ):
                worker.restarts += 1
                self._spawn(worker)
            self._expire(worker, now)
        self._due_at = max(self._next_due(now), now + TICK_EVERY_S)

    def _next_due(self, now: float) -> float:
        """When the tick next has something to do (inf: nothing): a start timeout, a
        heartbeat, a watchdog look (`next_look`), a restart, a request's expiry. Also notes
        whether a live worker's exit must be polled (it has no pidfd)."""
        due = float("inf")
        polled = False
        for worker in self._workers.values():
            state = worker.state
            if state is WorkerState.STARTING:
                due = min(due, worker.spawned_at + self._start_timeout)
            elif state is WorkerState.READY:
                due = min(due, worker.last_hb + HEARTBEAT_INTERVAL_S, next_look(worker, now))
            elif state is WorkerState.BACKOFF and worker.restart_at is not None:
                due = min(due, worker.restart_at)
            polled = polled or (worker.proc is not None and worker.pidfd is None)
            for pending in worker.inflight.values():
                if pending.deadline is not None:
                    due = min(due, pending.deadline)
            for pending in worker.queued:
                if pending.deadline is not None:
                    due = min(due, pending.deadline)
        self._polled = polled
        return due

    def _hung(self, worker: WorkerRecord, now: float) -> bool:
        """The watchdog (`judge`, above): declares the worker dead (and returns True) when
        it is silent and its process makes no CPU progress, or silent past
        `BUSY_SILENCE_LIMIT_S`."""
        verdict = judge(worker, now)
        if verdict.busy:
            self._publish_status(worker)
        if verdict.dead is not None:
            self._on_death(worker, verdict.dead)
            return True
        return False

    def _expire(self, worker: WorkerRecord, now: float) -> None:
        for req_id, pending in list(worker.inflight.items()):
            if pending.deadline is not None and now >= pending.deadline:
                del worker.inflight[req_id]
                self._fail(
                    pending,
                    WorkerTimeout(f"{pending.method} sent to {worker.provider}, no answer in time"),
                )
        if worker.queued:
            keep: deque[Pending] = deque()
            for pending in worker.queued:
                if pending.deadline is not None and now >= pending.deadline:
                    self._fail(
                        pending,
                        WorkerUnavailable(f"{worker.provider} worker not ready; request not sent"),
                    )
                else:
                    keep.append(pending)
            worker.queued = keep

    def _on_death(self, worker: WorkerRecord, reason: str) -> None:
        proc = worker.proc
        pid = proc.pid if proc is not None else None
        if proc is not None and proc.poll() is None:
            proc.kill()  # a silent worker may be wedged; its answers can no longer be trusted
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2.0)
        self._detach(worker)
        self._unwatch(worker)
        worker.proc = None
        if pid is not None:
            # Its runtimes were never stopped: what their tools left is ended here, before a
            # successor starts on their homes (one `/proc` scan, at a death only).
            end_worker_left(worker.incarnation)
        # Sent requests have unknown fate; queued ones provably never left the host.
        for pending in worker.inflight.values():
            self._fail(pending, WorkerLost(f"{pending.method}: {reason}"))
        worker.inflight.clear()
        while worker.queued:
            pending = worker.queued.popleft()
            self._fail(pending, WorkerUnavailable(f"{pending.method} not sent: {reason}"))
        now = time.monotonic()
        if worker.spawned_at and now - worker.spawned_at >= STABLE_AFTER_S:
            worker.backoff = BACKOFF_INITIAL_S
        worker.state = WorkerState.BACKOFF
        worker.last_error = reason
        worker.restart_at = now + worker.backoff
        self._due(worker.restart_at)
        worker.backoff = min(worker.backoff * 2, BACKOFF_MAX_S)
        self._publish_status(worker)
        self._lifecycle("worker.lost", worker, pid=pid, reason=reason)

    def _shutdown(self) -> None:
        procs = [w.proc for w in self._workers.values() if w.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 3.0
        for worker in self._workers.values():
            if worker.proc is None:
                continue
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
                end_worker_left(worker.incarnation)  # killed: it stopped none of its runtimes
        for worker in self._workers.values():
            for pending in worker.inflight.values():
                self._fail(pending, WorkerLost(f"{pending.method}: supervisor closed"))
            worker.inflight.clear()
            for pending in worker.queued:
                self._fail(pending, WorkerUnavailable(f"{pending.method}: supervisor closed"))
            worker.queued.clear()
            self._detach(worker)
            self._unwatch(worker)
            worker.proc = None
            worker.state = WorkerState.STOPPED
            self._publish_status(worker)
        # Requests that raced with close never reached a worker.
        for kind, item in self._mailbox.drain():
            if kind == "req":
                self._fail(item, WorkerUnavailable("worker supervisor is closed"))

    def _publish_status(self, worker: WorkerRecord) -> None:
        with self._status_lock:
            self._status[worker.provider] = worker.status_row()

    # ----------------------------------------------------------------- to the delivery thread

    def _complete(self, pending: Pending, result: dict[str, Any]) -> None:
        self._deliveries.complete(pending, result)

    def _fail(self, pending: Pending, exc: HostError) -> None:
        self._deliveries.fail(pending, exc)

    def _lifecycle(self, kind: str, worker: WorkerRecord, **info: Any) -> None:
        event = {"type": kind, "generation": worker.generation, **info}
        self._deliveries.lifecycle(worker.provider, event)
