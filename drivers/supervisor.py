"""`WorkerSupervisor`: the host side of the driver workers — one isolated process per provider kind,
spawned on demand, heartbeated, declared dead on exit or 5 s of silence, and restarted with backoff.

One loop thread owns every socket and child process (so Linux's parent-death signal stays tied
to a thread that lives until `close()`); a second thread delivers results and events in arrival
order, so a slow callback can never starve heartbeats.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import zmq

from domain.errors import HostError
from drivers.errors import WorkerError, WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.failpoints import (
    ENV_POINTS,
    ENV_STATE_DIR,
    format_points,
    parse_points,
)
from drivers.failpoints import (
    Failpoints as _Failpoints,
)
from drivers.worker import ENV_PARENT_PID, ENV_PROVIDER_CONFIG
from transport.worker_link import (
    HB_MSG,
    HEARTBEAT_INTERVAL_S,
    SILENCE_LIMIT_S,
    HostEnd,
    Mailbox,
    MsgType,
    req_msg,
)

log = logging.getLogger(__name__)

EventSink = Callable[[str, str, dict[str, Any]], None]
"""`sink(provider, agent_session_id, event)`; called on the delivery thread, in arrival order."""

LifecycleSink = Callable[[str, dict[str, Any]], None]
"""`sink(provider, {"type": "worker.ready"|"worker.lost", "pid", ...})`: lets the host fail the
turns that were streaming on a worker that died."""

_IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep margin for the file name
_BACKOFF_INITIAL_S = 0.1
_BACKOFF_MAX_S = 5.0
_STABLE_AFTER_S = 10.0  # a worker alive this long resets the restart backoff
BUSY_SILENCE_LIMIT_S = 60.0
"""A silent worker whose process keeps using CPU is busy, not hung (its heartbeat thread is
starved: 200 app-servers starting at once, a C call holding the GIL). It is killed only after
this much silence, or sooner once its CPU time stops advancing (issue 14 §6)."""
_CPU_WINDOW_S = 2.0  # no CPU progress for this long while silent: hung


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of `pid` in clock ticks, read from the kernel (the worker cannot block
    this); None when it cannot be read (not Linux, process gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


class WorkerState(StrEnum):
    STARTING = "starting"
    """Spawned, no hello yet: requests queue (never sent)."""
    READY = "ready"
    """Said hello and heartbeats: requests are sent at once."""
    BACKOFF = "backoff"
    """Died; respawns when the backoff elapses."""
    STOPPED = "stopped"
    """Closed with the supervisor."""


@dataclass(slots=True)
class _Pending:
    req_id: int
    provider: str
    method: str
    params: dict[str, Any]
    future: Future[dict[str, Any]]
    deadline: float | None
    sent: bool = False


@dataclass(slots=True)
class _Worker:
    """Loop-thread-only mutable state of one provider's worker."""

    provider: str
    state: WorkerState = WorkerState.STARTING
    proc: subprocess.Popen[bytes] | None = None
    end: HostEnd | None = None
    generation: int = 0
    restarts: int = 0
    spawned_at: float = 0.0
    last_seen: float = 0.0
    last_hb: float = 0.0
    backoff: float = _BACKOFF_INITIAL_S
    restart_at: float | None = None
    last_error: str | None = None
    cpu_ticks: int | None = None
    cpu_sampled_at: float = 0.0
    busy_silences: int = 0
    queued: deque[_Pending] = field(default_factory=deque)
    inflight: dict[int, _Pending] = field(default_factory=dict)


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
        self._sock_dir, self._own_sock_dir = self._socket_dir()

        self._ctx: zmq.Context[Any] = zmq.Context()
        self._mailbox = Mailbox(self._ctx)
        self._workers: dict[str, _Worker] = {}
        self._ids = 0
        self._ids_lock = threading.Lock()
        self._status_lock = threading.Lock()
        self._status: dict[str, dict[str, Any]] = {}
        self._event_sink: EventSink | None = None
        self._lifecycle_sink: LifecycleSink | None = None
        self._closing = threading.Event()
        self._deliveries: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._delivery_thread = threading.Thread(
            target=self._deliver_loop, name="worker-delivery", daemon=True
        )
        self._loop_thread = threading.Thread(
            target=self._loop, name="worker-supervisor", daemon=True
        )
        self._delivery_thread.start()
        self._loop_thread.start()

    # ----------------------------------------------------------------- public API

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
            ("req", _Pending(req_id, provider, method, dict(params or {}), fut, deadline))
        )
        return fut

    def set_event_sink(self, fn: EventSink | None) -> None:
        self._event_sink = fn

    def set_lifecycle_sink(self, fn: LifecycleSink | None) -> None:
        self._lifecycle_sink = fn

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

    def status(self) -> list[dict[str, Any]]:
        with self._status_lock:
            return [dict(v) for _, v in sorted(self._status.items())]

    def close(self, timeout: float = 5.0) -> None:
        """Terminate every worker (SIGTERM, then SIGKILL) and fail what is pending."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._mailbox.put(("close", None))
        self._loop_thread.join(timeout + 5.0)
        self._deliveries.put(None)
        self._delivery_thread.join(5.0)
        self._mailbox.close()
        self._ctx.term()
        if self._own_sock_dir:
            shutil.rmtree(self._sock_dir, ignore_errors=True)

    def __enter__(self) -> WorkerSupervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- loop thread

    def _socket_dir(self) -> tuple[Path, bool]:
        """ipc paths are limited to ~107 bytes; fall back to a private short temp dir."""
        probe = self._run_dir / "w-claude-code-99999.sock"
        if len(str(probe)) <= _IPC_PATH_MAX:
            return self._run_dir, False
        return Path(tempfile.mkdtemp(prefix="ahw-")), True

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._mailbox.wake_socket, zmq.POLLIN)
        registered: dict[zmq.Socket[Any], _Worker] = {}
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

    def _iterate(self, poller: zmq.Poller, registered: dict[zmq.Socket[Any], _Worker]) -> bool:
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
        self._tick()
        return False

    def _submit(self, pending: _Pending) -> None:
        worker = self._workers.get(pending.provider)
        if worker is None:
            worker = _Worker(pending.provider)
            self._workers[pending.provider] = worker
            self._spawn(worker)
        if worker.state is WorkerState.READY:
            self._send(worker, pending)
        else:
            worker.queued.append(pending)

    def _send(self, worker: _Worker, pending: _Pending) -> None:
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

    def _spawn(self, worker: _Worker) -> None:
        """Start an incarnation; any failure (EMFILE, ENOMEM, a missing python) is a death
        with backoff, never an exception out of the loop thread (issue 15 #5: a raise here
        once killed the supervisor, and with it every later turn and request timeout)."""
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

    def _spawn_once(self, worker: _Worker) -> None:
        worker.generation += 1
        endpoint = f"ipc://{self._sock_dir}/w-{worker.provider}-{worker.generation}.sock"
        worker.end = HostEnd(self._ctx, endpoint)
        env = dict(os.environ)
        env.update(self._env_overrides)
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        env[ENV_POINTS] = format_points(self._points)
        env[ENV_STATE_DIR] = str(self._fp_state)
        env[ENV_PROVIDER_CONFIG] = json.dumps(self._provider_config.get(worker.provider, {}))
        env[ENV_PARENT_PID] = str(os.getpid())
        log_path = self._run_dir / f"worker-{worker.provider}.log"
        now = time.monotonic()
        try:
            with open(log_path, "ab") as log:
                worker.proc = subprocess.Popen(
                    [
                        self._python,
                        "-m",
                        "drivers.worker",
                        "--provider",
                        worker.provider,
                        "--connect",
                        endpoint,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    # Own process group: a terminal's Ctrl-C reaches the daemon, which closes us.
                    start_new_session=True,
                )
        except OSError:
            worker.proc = None
            raise
        worker.state = WorkerState.STARTING
        worker.cpu_ticks, worker.cpu_sampled_at = None, now
        worker.spawned_at = now
        worker.last_seen = now
        worker.last_hb = now
        worker.restart_at = None
        self._publish_status(worker)

    def _read(self, worker: _Worker) -> None:
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
                if worker.state is WorkerState.READY and self._hung(worker, proc, now):
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

    def _hung(self, worker: _Worker, proc: subprocess.Popen[bytes] | None, now: float) -> bool:
        """The watchdog: declares the worker dead (and returns True) when it is silent and
        its process makes no CPU progress, or silent past `BUSY_SILENCE_LIMIT_S`."""
        silent = now - worker.last_seen
        pid = proc.pid if proc is not None else None
        if silent <= SILENCE_LIMIT_S:
            if pid is not None and now - worker.cpu_sampled_at >= 1.0:
                worker.cpu_ticks, worker.cpu_sampled_at = _cpu_ticks(pid), now
            return False
        if silent > BUSY_SILENCE_LIMIT_S:
            self._on_death(worker, f"worker silent for {silent:.0f} s (busy limit)")
            return True
        if now - worker.cpu_sampled_at < _CPU_WINDOW_S:
            return False  # judge over a whole window: a starved process runs in bursts
        ticks = _cpu_ticks(pid) if pid is not None else None
        progressed = ticks is not None and worker.cpu_ticks is not None and ticks > worker.cpu_ticks
        worker.cpu_ticks, worker.cpu_sampled_at = ticks, now
        if progressed:
            worker.busy_silences += 1
            self._publish_status(worker)
            return False
        self._on_death(worker, f"worker silent for {silent:.0f} s and not running (hung)")
        return True

    def _expire(self, worker: _Worker, now: float) -> None:
        for req_id, pending in list(worker.inflight.items()):
            if pending.deadline is not None and now >= pending.deadline:
                del worker.inflight[req_id]
                self._fail(
                    pending,
                    WorkerTimeout(f"{pending.method} sent to {worker.provider}, no answer in time"),
                )
        if worker.queued:
            keep: deque[_Pending] = deque()
            for pending in worker.queued:
                if pending.deadline is not None and now >= pending.deadline:
                    self._fail(
                        pending,
                        WorkerUnavailable(f"{worker.provider} worker not ready; request not sent"),
                    )
                else:
                    keep.append(pending)
            worker.queued = keep

    def _on_death(self, worker: _Worker, reason: str) -> None:
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
        if worker.spawned_at and now - worker.spawned_at >= _STABLE_AFTER_S:
            worker.backoff = _BACKOFF_INITIAL_S
        worker.state = WorkerState.BACKOFF
        worker.last_error = reason
        worker.restart_at = now + worker.backoff
        worker.backoff = min(worker.backoff * 2, _BACKOFF_MAX_S)
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

    def _publish_status(self, worker: _Worker) -> None:
        with self._status_lock:
            self._status[worker.provider] = {
                "provider": worker.provider,
                "pid": worker.proc.pid if worker.proc is not None else None,
                "state": worker.state.value,
                "restarts": worker.restarts,
                # Why the last incarnation died or could not start (e.g. "spawn failed:
                # OSError: [Errno 24] Too many open files"); null until one did.
                "lastError": worker.last_error,
                # Watchdog windows in which the worker was silent but running (busy, kept).
                "busySilences": worker.busy_silences,
            }

    # ----------------------------------------------------------------- delivery thread

    def _complete(self, pending: _Pending, result: dict[str, Any]) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_result(result)

        self._deliveries.put(run)

    def _fail(self, pending: _Pending, exc: HostError) -> None:
        def run() -> None:
            with contextlib.suppress(InvalidStateError):
                pending.future.set_exception(exc)

        self._deliveries.put(run)

    def _deliver_event(self, provider: str, sid: str, event: dict[str, Any]) -> None:
        def run() -> None:
            sink = self._event_sink
            if sink is not None:
                sink(provider, sid, event)

        self._deliveries.put(run)

    def _lifecycle(self, kind: str, worker: _Worker, **info: Any) -> None:
        event = {"type": kind, "generation": worker.generation, **info}

        def run() -> None:
            sink = self._lifecycle_sink
            if sink is not None:
                sink(worker.provider, event)

        self._deliveries.put(run)

    def _deliver_loop(self) -> None:
        while True:
            job = self._deliveries.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a sink bug must not stop later deliveries
                import traceback

                traceback.print_exc()
