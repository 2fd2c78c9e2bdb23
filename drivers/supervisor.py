"""`WorkerSupervisor`: the host side of the driver workers — one isolated process per provider kind,
spawned on demand, heartbeated, declared dead on exit or 5 s of silence, and restarted with backoff.

One loop thread owns every socket and child process (so Linux's parent-death signal stays tied
to a thread that lives until `close()`); a second thread delivers results and events in arrival
order, so a slow callback can never starve heartbeats.

This module is the loop and the public API. Beside it, one concern each: `worker_state` (the
records the loop keeps), `worker_spawn` (a worker's socket, environment and command line),
`watchdog` (busy or hung) and `delivery` (the delivery thread and its sinks).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import zmq

from domain.errors import HostError
from drivers.delivery import Deliveries, EventSink, LifecycleSink
from drivers.errors import WorkerError, WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.failpoints import Failpoints as _Failpoints
from drivers.failpoints import format_points, parse_points
from drivers.watchdog import BUSY_SILENCE_LIMIT_S, judge
from drivers.worker_spawn import socket_dir, start_worker, worker_env
from drivers.worker_state import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    STABLE_AFTER_S,
    Pending,
    WorkerRecord,
    WorkerState,
)
from protocol.objects import WorkerStatus
from transport.worker_link import HB_MSG, HEARTBEAT_INTERVAL_S, HostEnd, Mailbox, MsgType, req_msg

TICK_EVERY_S = 0.01
"""The loop's housekeeping (deadlines, heartbeats, a dead or hung worker, a restart due) runs
at most this often while messages keep it awake (a streaming Turn's ~20 deltas each woke it),
and on every idle poll's timeout: each of those checks is late by at most this much."""

__all__ = [
    "BUSY_SILENCE_LIMIT_S",
    "EventSink",
    "LifecycleSink",
    "WorkerState",
    "WorkerSupervisor",
]

log = logging.getLogger(__name__)


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

        self._ctx: zmq.Context[Any] = zmq.Context()
        self._mailbox = Mailbox(self._ctx)
        self._workers: dict[str, WorkerRecord] = {}
        self._ids = 0
        self._ids_lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._status: dict[str, WorkerStatus] = {}
        self._closing = threading.Event()
        self._deliveries = Deliveries()
        self._ticked_at = 0.0  # the loop thread's last `_tick`
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
            self._sock_dir.mkdir(mode=0o700, exist_ok=True)

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

    def set_event_sink(self, fn: EventSink | None) -> None:
        self._deliveries.event_sink = fn

    def set_lifecycle_sink(self, fn: LifecycleSink | None) -> None:
        self._deliveries.lifecycle_sink = fn

    def set_failpoints(self, points: Mapping[str, str]) -> dict[str, str]:
        """Arm points in every live worker and in every worker spawned later; returns the map
        now in force. A bad action raises ValueError and changes nothing."""
        checked = parse_points(format_points({str(k): str(v) for k, v in points.items()}))
        # Re-arming clears fired `once:` markers so the next incarnation sees them armed.
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
        poller = zmq.Poller()
        poller.register(self._mailbox.wake_socket, zmq.POLLIN)
        registered: dict[zmq.Socket[Any], WorkerRecord] = {}
        try:
            while True:
                try:
                    if self._iterate(poller, registered):
                        return
                except Exception:  # noqa: BLE001 - this thread is every request's clock
                    log.exception("worker supervisor loop iteration failed; continuing")
                    time.sleep(0.05)  # an error that repeats at once must not spin a core
                # Re-sync the poller with the current incarnations' sockets.
                live = {w.end.socket: w for w in self._workers.values() if w.end is not None}
                for sock in set(registered) - set(live):
                    with contextlib.suppress(KeyError, zmq.ZMQError):
                        poller.unregister(sock)
                for sock in set(live) - set(registered):
                    poller.register(sock, zmq.POLLIN)
                registered = live
        finally:
            self._shutdown()

    def _iterate(self, poller: zmq.Poller, registered: dict[zmq.Socket[Any], WorkerRecord]) -> bool:
        """One pass of the loop; True when told to close."""
        ready = dict(poller.poll(100))
        if self._mailbox.wake_socket in ready:
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
        for sock, worker in list(registered.items()):
            if sock in ready:
                self._read(worker)
        now = time.monotonic()
        if now - self._ticked_at >= TICK_EVERY_S:
            self._ticked_at = now
            self._tick()
        return False

    def _submit(self, pending: Pending) -> None:
        worker = self._workers.get(pending.provider)
        if worker is None:
            worker = WorkerRecord(pending.provider)
            self._workers[pending.provider] = worker
            self._spawn(worker)
        if worker.state is WorkerState.READY:
            self._send(worker, pending)
        else:
            worker.queued.append(pending)

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
                worker.end.send(req_msg(req_id, "debug.failpoints", {"points": points}))

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
            worker.end.send(req_msg(req_id, "debug.failpoints", {"points": changed}))

    def _spawn(self, worker: WorkerRecord) -> None:
        """Start an incarnation; any failure (EMFILE, ENOMEM, a missing python) is a death
        with backoff, never an exception out of the loop thread (a raise here
        would kill the supervisor, and with it every later turn and request timeout)."""
        try:
            self._spawn_once(worker)
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any spawn failure
            if worker.end is not None:
                with contextlib.suppress(Exception):
                    worker.end.close()
                worker.end = None
            if worker.proc is not None and worker.proc.poll() is None:
                with contextlib.suppress(Exception):
                    worker.proc.kill()
            worker.proc = None
            self._on_death(worker, f"spawn failed: {type(exc).__name__}: {exc}")

    def _spawn_once(self, worker: WorkerRecord) -> None:
        worker.generation += 1
        endpoint = f"ipc://{self._sock_dir}/w-{worker.provider}-{worker.generation}.sock"
        worker.end = HostEnd(self._ctx, endpoint)
        worker.spawned_points = dict(self._points)
        env = worker_env(
            self._env_overrides,
            self._points,
            self._fp_state,
            self._provider_config.get(worker.provider, {}),
        )
        log_path = self._run_dir / f"worker-{worker.provider}.log"
        now = time.monotonic()
        worker.proc = None
        worker.proc = start_worker(self._python, worker.provider, endpoint, env, log_path)
        worker.state = WorkerState.STARTING
        worker.cpu_ticks, worker.cpu_sampled_at = None, now
        worker.spawned_at = now
        worker.last_seen = now
        worker.last_hb = now
        worker.restart_at = None
        self._publish_status(worker)

    def _read(self, worker: WorkerRecord) -> None:
        end = worker.end
        while end is not None and worker.end is end:
            msg = end.recv()
            if msg is None:
                return
            worker.last_seen = time.monotonic()
            kind = msg["t"]
            if kind == MsgType.HELLO:
                if worker.state is WorkerState.STARTING:
                    worker.state = WorkerState.READY
                    self._publish_status(worker)
                    pid = worker.proc.pid if worker.proc else None
                    self._lifecycle("worker.ready", worker, pid=pid)
                    self._send_points_armed_while_starting(worker)
                    while worker.queued and worker.state is WorkerState.READY:
                        self._send(worker, worker.queued.popleft())
            elif kind == MsgType.RES:
                pending = worker.inflight.pop(msg.get("id"), None)  # type: ignore[arg-type]
                if pending is None:
                    continue  # timed out already, or a fire-and-forget request
                if msg.get("ok") is True:
                    result = msg.get("result")
                    self._complete(pending, result if isinstance(result, dict) else {})
                else:
                    error = msg.get("error")
                    self._fail(pending, WorkerError(error if isinstance(error, dict) else {}))
            elif kind == MsgType.EVT:
                sid, event = msg.get("agentSessionId"), msg.get("event")
                if isinstance(sid, str) and isinstance(event, dict):
                    self._deliver_event(worker.provider, sid, event)

    def _tick(self) -> None:
        now = time.monotonic()
        for worker in self._workers.values():
            proc = worker.proc
            if worker.state in (WorkerState.STARTING, WorkerState.READY):
                if proc is not None and proc.poll() is not None:
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
                if (
                    worker.state is WorkerState.READY
                    and now - worker.last_hb >= HEARTBEAT_INTERVAL_S
                ):
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

    def _hung(self, worker: WorkerRecord, now: float) -> bool:
        """The watchdog (`drivers.watchdog`): declares the worker dead (and returns True) when
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
        if worker.end is not None:
            worker.end.close()
            worker.end = None
        worker.proc = None
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
        worker.backoff = min(worker.backoff * 2, BACKOFF_MAX_S)
        self._publish_status(worker)
        self._lifecycle("worker.lost", worker, pid=pid, reason=reason)

    def _shutdown(self) -> None:
        procs = [w.proc for w in self._workers.values() if w.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 3.0
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for worker in self._workers.values():
            for pending in worker.inflight.values():
                self._fail(pending, WorkerLost(f"{pending.method}: supervisor closed"))
            worker.inflight.clear()
            for pending in worker.queued:
                self._fail(pending, WorkerUnavailable(f"{pending.method}: supervisor closed"))
            worker.queued.clear()
            if worker.end is not None:
                worker.end.close()
                worker.end = None
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

    def _deliver_event(self, provider: str, sid: str, event: dict[str, Any]) -> None:
        self._deliveries.event(provider, sid, event)

    def _lifecycle(self, kind: str, worker: WorkerRecord, **info: Any) -> None:
        event = {"type": kind, "generation": worker.generation, **info}
        self._deliveries.lifecycle(worker.provider, event)
