"""A JSON-RPC client for Codex-style app-servers over a subprocess's stdio: newline-delimited JSON
without a "jsonrpc" field, request/response matching, notifications, server→client requests
(approvals, questions), timeouts and process-death detection.

Shared by the tutti-agent driver and the Codex driver. It keeps the three failure kinds a fork
must tell apart: an explicit error answer (`JsonRpcError`), a request that provably never left
(`AppServerClosed(sent=False)`), and one whose fate is unknown (`sent=True`, `AppServerTimeout`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from domain.json_text import loads_bytes_as_stdlib
from domain.procfs import alive_in_stat, read_proc_stat
from drivers.liveness import PROVIDER_UNRESPONSIVE, TreeWatch, kill_tree, stopped_now
from drivers.runtime_marker import RUNTIME_VAR, RuntimeMarker

_PR_SET_PDEATHSIG = 1
# One encoder for every message (`json.dumps` with options builds a new one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

MAX_LINE_BYTES = 64 << 20
"""The longest line the reader takes from an app-server's stdout (64 MiB). The largest real one
measured is a 10,000-Turn thread's `thread/read` (~2.3 MB, docs/performance.md); a line past
this is a broken server (one endless line would grow the worker without bound): it is killed
and its Turns fail `provider_protocol_error`. Reading one costs up to twice this, transiently."""
EOF_EXIT_GRACE_S = 0.5
"""How long a server whose stdout reached its end may run on before it is killed (its Turns
failed `provider_protocol_error`): an exiting server closes its stdout as it exits and is
waitable a moment later; one that runs on can never answer again. Well under the shortest
liveness bound a daemon is given (`provider_stopped_seconds`, 2 s in the contention soak), so
the reader names the closed stdout before the liveness check calls the runtime unresponsive;
and the process is gone before its Turns are failed (the next Turn starts a new one on the
same home)."""
CLOSE_LOOK_S = 0.05
"""How often a close waiting for a server's exit looks whether it (or a process under it) was
stopped: a stopped server is killed then, not waited for (`AppServerProcess.close`)."""
CLOSE_TREE_AFTER_S = 0.5
"""How long a close waits for a server's exit before it also looks at the processes under it."""
PROVIDER_PROTOCOL_ERROR = "provider_protocol_error"
STDERR_LOG_BYTES = 4 << 20
"""The bound of an app-server's stderr log (`stderr_path`): past it a server's further stderr
is dropped, counted in one closing line; a log found at the bound when a server starts is moved
to `<name>.1` (replacing the one before), so a home holds at most twice this."""
STDERR_TAIL_BYTES = 2048
"""How much of the end of a server's stderr is kept in memory (`stderr_tail`): the words a
start that failed is reported with."""
"""The reason word a Turn fails with when its app-server broke the stdio protocol the reader
cannot go on from: a line longer than `MAX_LINE_BYTES`, or its stdout closed while it runs; or
the driver cannot follow its Turn (`break_protocol`: `turn/start` answered without a turn id)."""


def child_running(proc: subprocess.Popen[Any]) -> bool:
    """Whether the child has not exited: by `waitid(WNOWAIT)`, which sees a zombie without
    reaping it (`Popen.poll()` answers None, "running", while another thread is inside
    `wait()` — the reader waits for the exit it saw coming and may not run again for a while),
    then by `/proc` as the host asks it (a child exiting but not yet waitable). `poll()` — its
    lock and its `wait4` — only once the child has exited, to reap it."""
    if proc.returncode is not None:
        return False  # reaped already
    try:
        exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False  # reaped meanwhile (by the thread in `wait()`)
    if exited is not None:
        proc.poll()
        return False
    # Not waitable yet is not running yet: a killed multi-threaded child's leader is a zombie
    # (and exiting) until its last thread has gone, and only then waitable. The host calls it
    # dead from `/proc` at once (`actors.session_runtime.process_alive`); so does this, or a
    # `session.start` in that window would stamp the dying runtime's generation and the fork
    # after it be refused for nothing.
    try:
        return alive_in_stat(read_proc_stat(proc.pid))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable is not evidence of an exit


def decode_line(raw: bytes) -> Any:
    """One line of the server's stdout as JSON, or None when it is not JSON: read as the
    standard library reads it, by orjson where the two agree (the reader decodes every delta;
    `domain.json_text`: a line with an integer beyond 64 bits, or one orjson refuses, such as
    NaN, goes to the standard library)."""
    try:
        return loads_bytes_as_stdlib(raw)
    except ValueError:
        return None


def _libc_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: the app-server still exits on stdin EOF
    return prctl


# Resolved once, in the parent: the child runs between fork and exec, where a dlopen/dlsym
# could wait forever on a loader lock that another of the worker's threads held at fork time.
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the worker that spawned it dies, so a killed
    worker (or daemon) never leaves a provider process holding its thread's writer."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_WRAPPER_LOCK = threading.Lock()


def pdeathsig_wrapper() -> tuple[str, ...] | None:
    """The argv prefix that sets the parent-death signal (SIGKILL) and then execs the
    app-server in place — util-linux's `setpriv --pdeathsig`, one small exec — or None when
    this host has no `setpriv` that knows the option.

    Looked up once per process: the first caller runs `setpriv --help` and every other one
    waits for its answer. A worker's `warm_up` and its first runtime starts ask at the same
    moment, and an unlocked cache let each run its own (five in one worker's start, the last
    while four app-servers were already up: a child of the worker that is no runtime).
    """
    with _WRAPPER_LOCK:
        return _find_pdeathsig_wrapper()


@functools.cache
def _find_pdeathsig_wrapper() -> tuple[str, ...] | None:
    """`pdeathsig_wrapper`'s lookup (called under its lock).

    Why not `preexec_fn`: a `preexec_fn` makes CPython spawn with `fork()` instead of
    `vfork()`, and the worker then takes a copy-on-write fault for every page of its heap it
    writes next (tens of thousands after a big rollout's parse). The signal is the same one,
    set by the child before the provider's code runs, still tied to the worker's thread that
    spawned it (the kernel's parent of an exec'd process is unchanged), and kept across the
    exec; a worker killed in the moment before `setpriv` sets it leaves a child whose stdin is
    at EOF, which the app-servers exit on (as with the `fork()` path, whose window was the
    moment before its `prctl`)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or _PRCTL is None:
        return None
    try:
        shown = subprocess.run(
            [setpriv, "--help"], capture_output=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if b"--pdeathsig" not in shown:
        return None
    return (setpriv, "--pdeathsig", "KILL", "--")


def spawn_tied(argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **popen)` for a child that must die with the spawning thread
    (SIGKILL, Linux's parent-death signal): through `pdeathsig_wrapper` where the host has
    it (CPython's `vfork()` path), else with `_die_with_parent` as `preexec_fn`. A program
    that cannot be found or run takes the latter path too, so it fails as it always has (an
    `OSError` from `Popen`, not a wrapper that exits 127)."""
    wrapper = pdeathsig_wrapper()
    if wrapper is not None and _runnable(argv[0], popen.get("env"), popen.get("cwd")):
        return subprocess.Popen([*wrapper, *argv], **popen)
    return subprocess.Popen(argv, preexec_fn=_die_with_parent, **popen)


def _runnable(program: str, env: Mapping[str, str] | None, cwd: str | None) -> bool:
    """Whether `exec` of `program` would find a file it may run (its PATH lookup as the
    child's: the child's environment, relative paths from the child's directory)."""
    if os.sep in program:
        found: str | None = os.path.join(cwd or ".", program)
    else:
        found = shutil.which(program, path=os.pathsep.join(os.get_exec_path(env)))
    return found is not None and os.path.isfile(found) and os.access(found, os.X_OK)


class AppServerFailure(Exception):
    """Base of the client's failures."""


class JsonRpcError(AppServerFailure):
    """The server answered the request with an explicit error object."""

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: {message} (code {code})")
        self.method = method
        self.code = code
        self.rpc_message = message
        self.data = data


class AppServerClosed(AppServerFailure):
    """The process is gone or its pipe broke. `sent` says whether the request left first."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class AppServerTimeout(AppServerFailure):
    """The request was sent and no answer came in time (its fate is unknown)."""

    sent = True


@dataclass(frozen=True, slots=True)
class ServerRequest:
    """A server→client request (approval, question) that the client must answer once by id."""

    id: int | str
    method: str
    params: Mapping[str, Any]


NotificationHandler = Callable[[str, Mapping[str, Any]], None]
ServerRequestHandler = Callable[[ServerRequest], None]
ExitHandler = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class QuietLines:
    """Notifications the client turns into no event, told to `handle` as the raw line, never
    decoded: a line that starts with one of `prefixes` (its method, as app-servers write it
    first: `{"method":"…",`). A line that does not match is decoded and dispatched as any other,
    so a server that writes its keys in another order loses nothing, it only pays the decode."""

    prefixes: tuple[bytes, ...]
    handle: Callable[[bytes], None]


class AppServerProcess:
    """One app-server child process and the reader thread that demultiplexes its stdout.

    Handlers run on the reader thread: they must not block and must not wait on `request`.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None = None,
        on_notification: NotificationHandler | None = None,
        on_server_request: ServerRequestHandler | None = None,
        on_exit: ExitHandler | None = None,
        stderr_path: Path | None = None,
        quiet: QuietLines | None = None,
        write_limit: float | None = None,
        max_line: int = MAX_LINE_BYTES,
    ) -> None:
        self.argv = list(argv)
        self.max_line = max_line
        """The longest stdout line read (`MAX_LINE_BYTES`); past it the server is killed."""
        self.write_limit = write_limit
        """How long a write may wait with none of its bytes taken by the server (its stdin
        full: it stopped reading) before the server is killed, `provider_unresponsive`, and the
        write fails; None waits for good."""
        self._env = dict(env)
        self._cwd = cwd
        self._on_notification = on_notification
        self._on_server_request = on_server_request
        self._on_exit = on_exit
        self._stderr_path = stderr_path
        self._quiet = quiet
        self.quiet_lines = 0
        """Lines handed to `quiet.handle` undecoded (tests read it)."""
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, Future[dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stdin_poll: select.poll | None = None  # under the write lock
        self.writes_refused = 0
        """`try_request_async` calls refused because stdin would block (tests read it)."""
        self._closed_reason: str | None = None
        self.aborted: str | None = None
        """Why `abort` killed it (in words), None until then."""
        marker = self._env.get(RUNTIME_VAR) or ""
        self.marker = RuntimeMarker(marker, may_leave=bool(marker))
        """Its runtime's marker (`RUNTIME_VAR` of `env`: a Session's runtime; none, a
        transient's: nothing is ended by it)."""
        self.left_killed: list[int] = []
        """The processes `end_left` killed (tests read it)."""
        self._closing = False
        """`close` was called: a stdout that ends now is the exit it asked for, never a
        broken server (the reader leaves the exit to `close`'s own bounds)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._stderr_tail = b""
        self._stderr_reader: threading.Thread | None = None
        self.last_activity = time.monotonic()
        # The last line read from the server: what a liveness probe waits to see move.
        self.last_read = time.monotonic()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        stderr: int = subprocess.DEVNULL
        log: IO[bytes] | None = None
        if self._stderr_path is not None:
            # Read by a thread of its own (`_drain_stderr`): kept to a bound in the log, its
            # tail in memory for a failed start's words.
            log = _open_stderr_log(self._stderr_path)
            stderr = subprocess.PIPE
        try:
            self._proc = spawn_tied(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self._env,
                cwd=self._cwd,
                # A group of its own: what a launcher spawns stays in it after the launcher
                # is gone (`kill_tree`).
                process_group=0,
            )
        except OSError as exc:
            if log is not None:
                log.close()
            raise AppServerClosed(f"cannot start {self.argv[0]}: {exc}", sent=False) from exc
        if log is not None and self._proc.stderr is not None:
            self._stderr_reader = threading.Thread(
                target=self._drain_stderr,
                args=(self._proc.stderr, log),
                name="app-server-stderr",
                daemon=True,
            )
            self._stderr_reader.start()
        if self._proc.stdin is not None:
            # Written by `os.write` under the write lock, never through the buffer: a full pipe
            # answers EAGAIN, so a write waits in `poll` with a bound, not in `write` for good.
            os.set_blocking(self._proc.stdin.fileno(), False)
        self._reader = threading.Thread(
            target=self._read_loop, name="app-server-reader", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._closed_reason is None and self._proc is not None and child_running(self._proc)

    def initialize(
        self, client_name: str, client_version: str, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The handshake: `initialize` then the `initialized` notification."""
        result = self.request(
            "initialize",
            {
                "clientInfo": {
                    "name": client_name,
                    "title": client_name,
                    "version": client_version,
                },
                "capabilities": {"experimentalApi": True},
            },
            timeout=timeout,
        )
        self.notify("initialized", {})
        return result

    def close(self, timeout: float = 3.0, *, end_left: bool = True) -> None:
        """Close stdin (app-servers exit on EOF), then terminate, then kill. A writer stuck on
        the server's full stdin (it stopped reading) holds the write lock: waited for up to
        `timeout`, then the server is ended without the EOF (its exit lets the writer go).
        A server (or a process under it) seen stopped, before or during either wait, is
        SIGKILLed with its tree at once: it can run none of its own exit, and SIGKILL is the
        one signal that ends a stopped process. Then what its runtime left (`end_left`),
        unless the caller ends it with others'."""
        proc = self._proc
        if proc is None:
            return
        self._closing = True
        watch = TreeWatch(proc.pid)
        if proc.returncode is None and stopped_now(proc.pid):
            self._kill_tree(proc)  # before the EOF: a writer on its full stdin lets go
        eof = self._close_stdin(proc, timeout)
        if not (eof and self._exits(proc, timeout, watch)):
            proc.terminate()
            if not self._exits(proc, timeout, watch):
                proc.kill()
                proc.wait()
        if not eof:
            self._close_stdin(proc, timeout)  # the writer let go by the exit
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout)
        self._mark_closed("app-server closed by the client")
        if end_left:
            self.end_left()

    def _exits(self, proc: subprocess.Popen[bytes], timeout: float, watch: TreeWatch) -> bool:
        """Whether `proc` exits within `timeout`, looked at every `CLOSE_LOOK_S`: the server
        seen stopped meanwhile (or, past `CLOSE_TREE_AFTER_S`, a process under it: listing a
        tree walks the process table, which a server that exits at once is spared) is no exit
        to wait for; the tree is SIGKILLed and reaped (True)."""
        began = time.monotonic()
        deadline = began + timeout
        while True:
            left = deadline - time.monotonic()
            if _exited(proc, max(0.0, min(CLOSE_LOOK_S, left))):
                return True
            now = time.monotonic()
            if stopped_now(proc.pid) or (
                now - began >= CLOSE_TREE_AFTER_S and watch.stopped(now) is not None
            ):
                self._kill_tree(proc)
                proc.wait()
                return True
            if left <= CLOSE_LOOK_S:
                return False

    def abort(self, reason: str) -> None:
        """SIGKILL the server's tree (`kill_tree`), then fail every request still waiting for
        its answer with `reason` at once: the reader would only once the exit reached it, and
        a process frozen by its cgroup dies only when thawed. A thread blocked on a request to
        a server killed for staying stopped or silent (a `turn/start`, holding its Session)
        goes on now, not at its request's limit."""
        if self._proc is None:
            return
        self.aborted = reason
        self.kill_tree()
        self._mark_closed(reason)

    def end_left(self) -> list[int]:
        """Once the server has exited or is SIGKILLed (a process with a SIGKILL pending counts as
        ended: `alive_in_stat`): end every process still carrying its runtime's marker
        (`RUNTIME_VAR` in its environment; `RuntimeMarker.end_left`): a tool's process the
        provider did not take with it (`setsid sleep 1000 &`), a launcher's child. The next
        server on the same home has its own marker: untouched. The pids killed."""
        if self._proc is None:
            return []
        killed = self.marker.end_left()
        self.left_killed.extend(killed)
        return killed

    def _close_stdin(self, proc: subprocess.Popen[bytes], timeout: float) -> bool:
        """Close the server's stdin under the write lock, waited for up to `timeout`; False
        when a writer held it all that time."""
        if not self._write_lock.acquire(timeout=timeout):
            return False
        try:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        finally:
            self._write_lock.release()
        return True

    def kill_tree(self) -> None:
        """SIGKILL the server, everything below it and everything left in its process group.
        A launcher's child (npm's `node` wrapper runs the native `codex` as one) outlives a
        launcher killed alone: reparented, out of the launcher's tree, with no parent-death
        signal, it keeps the server's pipes and the home — it would answer a fork the worker
        gave up on, write its child after the `unknown`, and hold the thread's writer lock
        against the Session's next app-server. Its group is the server's still. Then what
        left both, carrying its runtime's marker (`end_left`): a kill of a stopped, silent or
        broken server is its runtime's stop too."""
        proc = self._proc
        if proc is None:
            return
        self._kill_tree(proc)
        self.end_left()

    def _kill_tree(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.returncode is None:  # not reaped: its pid (and its group's id) still ours
            kill_tree(proc.pid)
            with contextlib.suppress(OSError):  # none left: the group is gone
                os.killpg(proc.pid, signal.SIGKILL)
            return
        # Reaped: the id now names a group only while a member is left in it, or another
        # process's if it was freed and taken again; only the server's own are killed (the
        # private HOME of its environment, inherited by what it spawned).
        mark = self._env.get("HOME")
        if mark:
            for pid in _group_members(proc.pid, f"HOME={mark}".encode()):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the process (tests and wedged servers); the reader reports the exit."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()

    # ------------------------------------------------------------------ messages

    def request_async(self, method: str, params: Mapping[str, Any]) -> Future[dict[str, Any]]:
        fut: Future[dict[str, Any]] = Future()
        req_id = next(self._ids)
        with self._lock:
            if self._closed_reason is not None:
                fut.set_exception(AppServerClosed(self._closed_reason, sent=False))
                return fut
            self._pending[req_id] = (method, fut)
        try:
            self._write({"id": req_id, "method": method, "params": dict(params)})
        except AppServerClosed as exc:
            with self._lock:
                self._pending.pop(req_id, None)
            if not fut.done():
                fut.set_exception(exc)
        return fut

    def try_request_async(
        self, method: str, params: Mapping[str, Any]
    ) -> Future[dict[str, Any]] | None:
        """`request_async` for a thread that must never block (the worker's link thread): None,
        with nothing sent and nothing pending, unless the whole line leaves in one write that
        cannot wait — no other thread is writing (the write lock is free), the line fits in
        one pipe buffer (`PIPE_BUF`: a pipe that polls writable takes it whole, at once) and
        the server's stdin polls writable (a server that stopped reading fills its pipe).
        The answer completes the future on the reader thread, as `request_async`'s does."""
        req_id = next(self._ids)
        line = (_ENCODE({"id": req_id, "method": method, "params": dict(params)}) + "\n").encode()
        if len(line) > select.PIPE_BUF or not self._write_lock.acquire(blocking=False):
            return None
        try:
            proc = self._proc
            if proc is None or proc.stdin is None or self._closed_reason is not None:
                return None
            if self._stdin_poll is None:
                self._stdin_poll = select.poll()
                self._stdin_poll.register(proc.stdin.fileno(), select.POLLOUT)
            if not self._stdin_poll.poll(0):
                self.writes_refused += 1
                return None
            fut: Future[dict[str, Any]] = Future()
            with self._lock:
                if self._closed_reason is not None:
                    return None
                self._pending[req_id] = (method, fut)
            try:
                # Whole or not at all: at most `PIPE_BUF`, to a pipe that polls writable.
                os.write(proc.stdin.fileno(), line)
            except (BrokenPipeError, ValueError, OSError) as exc:
                with self._lock:
                    self._pending.pop(req_id, None)
                fut.set_exception(AppServerClosed(f"app-server pipe closed: {exc}", sent=False))
                return fut
        finally:
            self._write_lock.release()
        self.last_activity = time.monotonic()
        return fut

    def expire(self, fut: Future[dict[str, Any]], failure: AppServerFailure) -> bool:
        """Fail a request still waiting for its answer with `failure` (a caller's timeout that
        no thread waits out: `try_request_async`'s); False when its answer came first."""
        with self._lock:
            for req_id, (_method, pending) in self._pending.items():
                if pending is fut:
                    del self._pending[req_id]
                    break
            else:
                return False
        fut.set_exception(failure)
        return True

    def request(
        self, method: str, params: Mapping[str, Any], *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Send and wait. Raises `JsonRpcError`, `AppServerClosed` or `AppServerTimeout`."""
        return self.answer(method, self.request_async(method, params), timeout=timeout)

    def answer(
        self,
        method: str,
        fut: Future[dict[str, Any]],
        *,
        timeout: float = 30.0,
        limit: float | None = None,
    ) -> dict[str, Any]:
        """Wait for the answer to a `request_async(method, …)`: what `request` returns or
        raises, for a caller that did something else between sending and waiting. `timeout`
        is what is left to wait; `limit`, the call's whole budget the error names (default
        `timeout`), so the words do not depend on what the caller did meanwhile."""
        try:
            return fut.result(timeout)
        except FutureTimeout:
            budget = timeout if limit is None else limit
            raise AppServerTimeout(f"{method}: no answer in {budget:.1f} s") from None

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        self._write({"method": method, "params": dict(params)})

    def respond(self, req_id: int | str, result: Mapping[str, Any]) -> None:
        self._write({"id": req_id, "result": dict(result)})

    def respond_error(self, req_id: int | str, code: int, message: str) -> None:
        self._write({"id": req_id, "error": {"code": code, "message": message}})

    def stderr_tail(self, wait: float = 1.0) -> str:
        """The end of what the server wrote on its stderr (at most `STDERR_TAIL_BYTES`); of
        a server that exited, once its stderr was read to its end (waited up to `wait`)."""
        reader, proc = self._stderr_reader, self._proc
        exited = proc is not None and proc.poll() is not None
        if reader is not None and exited and reader is not threading.current_thread():
            reader.join(wait)
        return self._stderr_tail.decode(errors="replace").strip()

    def _drain_stderr(self, pipe: IO[bytes], log: IO[bytes]) -> None:
        """Read the server's stderr to its end: into the log up to `STDERR_LOG_BYTES` (the rest
        dropped, counted in a closing line), its last `STDERR_TAIL_BYTES` kept in memory."""
        dropped = 0
        try:
            room = STDERR_LOG_BYTES - os.fstat(log.fileno()).st_size
            fd = pipe.fileno()
            while chunk := os.read(fd, 1 << 16):
                self._stderr_tail = (self._stderr_tail + chunk)[-STDERR_TAIL_BYTES:]
                kept = chunk[: max(room, 0)]
                dropped += len(chunk) - len(kept)
                room -= len(chunk)
                if kept:
                    try:
                        log.write(kept)
                    except OSError:
                        room = 0  # a log we cannot write: the stderr is still read to its end
            if dropped:
                log.write(
                    f"\n[agenthost: {dropped} bytes of stderr dropped past the log's "
                    "bound]\n".encode()
                )
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                log.close()
            with contextlib.suppress(OSError):
                pipe.close()

    # ------------------------------------------------------------------ internals

    def _write(self, msg: Mapping[str, Any]) -> None:
        line = (_ENCODE(msg) + "\n").encode()
        # The lock's holder waits at most `write_limit` without progress (then the server is
        # killed and it lets go), so a writer behind it waits a bounded time too.
        with self._write_lock:
            proc = self._proc
            if proc is None or proc.stdin is None or self._closed_reason is not None:
                raise AppServerClosed(self._closed_reason or "app-server not started", sent=False)
            try:
                self._write_all(proc, proc.stdin.fileno(), line)
            except (BrokenPipeError, ValueError, OSError) as exc:
                # A broken pipe means the bytes never reached the server.
                raise AppServerClosed(f"app-server pipe closed: {exc}", sent=False) from exc
        self.last_activity = time.monotonic()

    def _write_all(self, proc: subprocess.Popen[bytes], fd: int, line: bytes) -> None:
        """Write `line` whole to the server's non-blocking stdin (under the write lock): one
        `write` when the pipe has room; else `poll` for room, each wait bounded by
        `write_limit` since the server last took a byte. Past it, the server is killed and
        `AppServerClosed` raised in words (`provider_unresponsive`): the line never arrived
        whole, so the server acted on none of it (`sent=False`)."""
        view = memoryview(line)
        waiting: select.poll | None = None
        while view:
            try:
                view = view[os.write(fd, view) :]
                continue
            except BlockingIOError:
                pass
            if waiting is None:
                waiting = select.poll()
                waiting.register(fd, select.POLLOUT)
            limit = self.write_limit
            if waiting.poll(None if limit is None else limit * 1000.0):
                continue  # room (or an error, which the next `write` raises)
            raise AppServerClosed(self._kill_stuck(proc, len(line), len(view)), sent=False)

    def _kill_stuck(self, proc: subprocess.Popen[bytes], size: int, left: int) -> str:
        """Kill a server that took no byte of a write for `write_limit` (a wedged one: stopped
        reading, with no Turn the liveness check would watch); the reason, in words."""
        reason = (
            f"{PROVIDER_UNRESPONSIVE}: the app-server (pid {proc.pid}) read nothing from its "
            f"stdin for {self.write_limit or 0:.0f} s ({left} of a {size}-byte write left); "
            "it was killed, and a new one starts at the next Turn"
        )
        self._mark_closed(reason)  # its users see it gone at once, in these words
        self.kill_tree()
        return reason

    def _read_loop(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        stdout = proc.stdout
        quiet = self._quiet
        prefixes = quiet.prefixes if quiet is not None else ()
        limit = self.max_line
        raw = b""
        # `readline` with a bound, not `for raw in stdout`: that reads a line however long.
        for raw in iter(functools.partial(stdout.readline, limit), b""):
            if len(raw) >= limit and not raw.endswith(b"\n"):
                break  # a line past the bound: the server is broken, never read on
            self.last_activity = self.last_read = time.monotonic()
            try:
                if prefixes and raw.startswith(prefixes):
                    assert quiet is not None
                    self.quiet_lines += 1
                    quiet.handle(raw)
                    continue
                msg = decode_line(raw)
                if not isinstance(msg, dict):
                    continue  # not a protocol line; app-servers log to stderr, but be tolerant
                self._dispatch(msg)
            except Exception:  # a handler bug must not kill the reader
                import traceback

                traceback.print_exc()
        else:
            try:
                # Asked to exit (`close`): as long as `close` gives it, never killed as broken
                # (an app-server that still writes its state on the way out loses nothing).
                code = proc.wait(None if self._closing else EOF_EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                if self._closing:
                    return  # `close` ended it meanwhile and reaps it
                self._kill_broken(proc, "closed its stdout but kept running")
            else:
                self._mark_closed(f"app-server exited with status {code}")
            return
        del raw
        self._kill_broken(proc, f"wrote a line longer than {limit} bytes")

    def break_protocol(self, what: str) -> str:
        """The server answered what no client can go on from (`turn/start` without a turn
        id): killed and its Turns failed as `_kill_broken` does. Returns the words (any
        thread but one holding this process's lock)."""
        proc = self._proc
        assert proc is not None, "not started"
        return self._kill_broken(proc, what)

    def end(self, reason: str, *, reap_s: float | None = None) -> None:
        """SIGKILL the server's process tree and reap it, its users told `reason`: a request
        it was sent and never answered can then act no more (a fork's child written after
        the host recorded the fork `unknown`, and perhaps resolved it, would be no one's).
        `reap_s`: how long to wait for the exit (None: until it comes). A process frozen by its
        cgroup (or stopped in the kernel) dies only once it runs again, but its SIGKILL is
        pending: it runs no more of its own code; its reader thread reaps it then."""
        proc = self._proc
        if proc is None:
            return
        self._mark_closed(reason)
        self.kill_tree()  # and what its runtime left (`end_left`)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(reap_s)

    def _kill_broken(self, proc: subprocess.Popen[bytes], what: str) -> str:
        """Kill a server the reader cannot go on reading, reap it, then fail its Turns in
        these words (killed first: the next Turn, started by the failure, finds it gone)."""
        self.kill_tree()
        proc.wait()
        reason = (
            f"{PROVIDER_PROTOCOL_ERROR}: the app-server (pid {proc.pid}) {what}; it was killed, "
            "and a new one starts at the next Turn"
        )
        self._mark_closed(reason)
        return reason

    def _dispatch(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        if "id" not in msg:
            # A notification (a Turn's every delta): looked at first.
            if isinstance(method, str) and self._on_notification is not None:
                params = msg.get("params")
                self._on_notification(method, params if isinstance(params, dict) else {})
        elif method is None:
            req_id = msg.get("id")
            with self._lock:
                # Ours are ints: `true` (a bool, equal to 1) answers none of them.
                entry = self._pending.pop(req_id, None) if type(req_id) is int else None
            if entry is None:
                return
            sent_method, fut = entry
            if "error" in msg and msg["error"] is not None:
                err = msg["error"] if isinstance(msg["error"], dict) else {}
                # A code that is no integer is read as the generic server error: raising on it
                # here would leave the request, taken off the table, to wait out its timeout.
                code = err.get("code")
                fut.set_exception(
                    JsonRpcError(
                        sent_method,
                        code if type(code) is int else -32000,
                        str(err.get("message", "")),
                        err.get("data"),
                    )
                )
            else:
                result = msg.get("result")
                fut.set_result(result if isinstance(result, dict) else {"value": result})
        elif isinstance(method, str):
            params = msg.get("params")
            request = ServerRequest(msg["id"], method, params if isinstance(params, dict) else {})
            if self._on_server_request is not None:
                self._on_server_request(request)
            else:
                with contextlib.suppress(AppServerClosed):
                    self.respond_error(request.id, -32601, f"client cannot handle {method}")

    def _mark_closed(self, reason: str) -> None:
        with self._lock:
            if self._closed_reason is not None:
                return
            self._closed_reason = reason
            pending = list(self._pending.values())
            self._pending.clear()
        for method, fut in pending:
            if not fut.done():
                # These were written to the pipe: the server may have acted on them.
                fut.set_exception(AppServerClosed(f"{method}: {reason}", sent=True))
        if self._on_exit is not None:
            self._on_exit(reason)


def _open_stderr_log(path: Path) -> IO[bytes]:
    """`path` opened to append (unbuffered), moved to `<name>.1` first when it reached the
    bound."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size >= STDERR_LOG_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    return open(path, "ab", buffering=0)  # noqa: SIM115 - closed by `_drain_stderr`


def private_env(
    base: Mapping[str, str] | None,
    home_var: str,
    home: Path,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The env of a provider process: its own provider home, a private HOME and TMPDIR under it,
    so it never reads or writes the user's real dot-directories."""
    env = dict(os.environ if base is None else base)
    private_home = home / ".home"
    tmp = home / ".tmp"
    private_home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env[home_var] = str(home)
    env["HOME"] = str(private_home)
    env["TMPDIR"] = str(tmp)
    env.update(extra or {})
    return env


def _group_members(pgid: int, mark: bytes) -> list[int]:
    """The processes in group `pgid` whose environment holds `mark` (`KEY=value`)."""
    found = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if mark in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether `proc` exits within `timeout` seconds."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True
