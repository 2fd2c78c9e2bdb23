"""The app-server processes of one provider (`Runtimes`): started on a home with the provider's
command and private environment, handshaken, and asked for a thread's turns (loading the lineage
it reads through first). The driver's fork, resolution and Sessions all start and read through
this one part.

One app-server of a home at a time: Codex refuses a second writer of a thread ("thread … already
has an active writer"), so a transient app-server (a probe, a fork's source when the Session's
is not live, a resolve's or a proof's read) lives its whole life inside `home(...)`, and a
Session's runtime is spawned and opens its thread inside it too, and is closed (stopped, reaped
idle) inside it. A Session's live runtime is read without it (the warm paths take no lock).
A stop marks the home `closing` where it takes the Session out of the worker's table, so a
start of the same Session before the stop holds the home waits for the close.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from drivers.app_server.items import thread_of
from drivers.app_server.launch import launch_fingerprint
from drivers.app_server.process import (
    AppServerFailure,
    AppServerProcess,
    ExitHandler,
    NotificationHandler,
    QuietLines,
    ServerRequestHandler,
    private_env,
)
from drivers.app_server.provider import AppServerProvider
from drivers.app_server.state import Runtime
from drivers.errors import DriverError
from drivers.liveness import PROVIDER_STOPPED, TreeWatch, stopped_start_error
from drivers.runtime_marker import RUNTIME_VAR, WORKER_VAR, new_marker

CLIENT_NAME = "agenthost"
CLIENT_VERSION = "0.1.0"

TURN_PAGE_FIRST = 16
"""Turns asked for in a thread listing's first page: 16 of the 1 MiB prompts a Turn's request
may carry are a line well under `MAX_LINE_BYTES`, and a short thread is one page."""

TURN_PAGE_CHARS = 8 << 20
"""The characters of text (every string of its turns) a later page is sized to hold; a
character is at most 6 bytes of JSON (an escaped half of a surrogate pair): 48 MiB."""

TURN_PAGE_MOST = 1000
"""The most turns a page asks for."""

TURN_PAGES_MOST = 1_000_000
"""The most pages one listing reads: a server whose cursor never ends is a protocol break."""


def _text_chars(value: object) -> int:
    """The characters of every string in a listed turn (its ids, statuses, items' texts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_text_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    return 0


def first_turns_page(proc: AppServerProcess, thread_id: str) -> Future[dict[str, Any]]:
    """The first page of `list_turns`, sent now and not waited for: the caller does other work
    while the server lists, then hands the answer's future to `list_turns(first=...)`."""
    params = {"threadId": thread_id, "sortDirection": "asc", "limit": TURN_PAGE_FIRST}
    return proc.request_async("thread/turns/list", params)


def list_turns(
    proc: AppServerProcess,
    thread_id: str,
    timeout: float,
    first: Future[dict[str, Any]] | None = None,
) -> list[Mapping[str, Any]]:
    """`thread/turns/list` ascending, page after page: the first of `TURN_PAGE_FIRST`
    turns, each next sized from the largest turn seen so far to hold about
    `TURN_PAGE_CHARS` characters (at most `TURN_PAGE_MOST` turns), so no answer's line
    comes near the bound while a history of small turns takes a few requests. `first`: the
    first page already sent (`first_turns_page`), its answer waited for here."""
    turns: list[Mapping[str, Any]] = []
    cursor: str | None = None
    limit, largest = TURN_PAGE_FIRST, 1
    for _ in range(TURN_PAGES_MOST):
        params: dict[str, Any] = {"threadId": thread_id, "sortDirection": "asc"}
        params["limit"] = limit
        if cursor:
            params["cursor"] = cursor
        if first is not None:
            page = proc.answer("thread/turns/list", first, timeout=timeout)
            first = None
        else:
            page = proc.request("thread/turns/list", params, timeout=timeout)
        data = [t for t in page.get("data") or [] if isinstance(t, Mapping)]
        turns.extend(data)
        after = page.get("nextCursor")
        if not after or not data:
            return turns
        if after == cursor:
            raise AppServerFailure(f"thread/turns/list: the cursor {after!r} did not move")
        cursor = str(after)
        largest = max(largest, *(_text_chars(t) for t in data))
        limit = max(1, min(TURN_PAGE_MOST, TURN_PAGE_CHARS // largest))
    raise AppServerFailure(f"thread/turns/list: more than {TURN_PAGES_MOST} pages")


class _HomeClaim:
    """The lock of one home and how many threads hold or wait for it (the entry goes with the
    last: the map holds only homes in use)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        # Reentrant: a thread that already holds its home (none does today) must not deadlock.
        self.lock = threading.RLock()
        self.users = 0


class Runtimes:
    """Starts app-servers for `provider` and reads threads through them."""

    def __init__(
        self, provider: AppServerProvider, request_timeout: float, write_limit: float | None = None
    ) -> None:
        self.provider = provider
        self.request_timeout = request_timeout
        self.write_limit = write_limit
        """Each app-server's `AppServerProcess.write_limit`."""
        self._lock = threading.Lock()
        self.spawns = 0
        """App-servers started (tests pin that a projection or a fork spawns none)."""
        self._homes: dict[str, _HomeClaim] = {}
        self._closing: dict[str, list[object]] = {}
        """Homes whose Session is being stopped, by the stopped Session (`closing`)."""
        self._closed_one = threading.Condition(self._lock)

    @contextlib.contextmanager
    def home(self, home: Path | str, owner: object | None = None) -> Iterator[None]:
        """Hold `home`: no other app-server of this driver starts on it meanwhile (see the
        module's docstring). Lock order: a Session's `op_lock` before its home; a fork's
        source home before its target home (a fork's target is a new Session's home, never
        the source of a fork in flight); nothing else is taken while a home is held. A home
        marked `closing` is waited for first, unless `owner` is the Session being closed (its
        own operation in flight finishes, then the stop closes what it spawned)."""
        with self._claim(home, blocking=True, owner=owner):
            yield

    @contextlib.contextmanager
    def closing(self, home: Path | str, owner: object) -> Iterator[None]:
        """Mark `home` as closing `owner`'s runtime until the block ends: a stop marks it where
        it takes the Session out of the table, so a start of the same home in the window before
        the stop holds the home waits for the close (never a second writer beside it)."""
        key = str(Path(home))
        with self._lock:
            self._closing.setdefault(key, []).append(owner)
        try:
            yield
        finally:
            with self._lock:
                owners = self._closing[key]
                owners.remove(owner)
                if not owners:
                    del self._closing[key]
                self._closed_one.notify_all()

    @contextlib.contextmanager
    def home_if_free(self, home: Path | str) -> Iterator[bool]:
        """Hold `home` if no thread holds it now (True), else hold nothing (False)."""
        with self._claim(home, blocking=False) as held:
            yield held

    @contextlib.contextmanager
    def _claim(
        self, home: Path | str, *, blocking: bool, owner: object | None = None
    ) -> Iterator[bool]:
        key = str(Path(home))
        with self._lock:
            claim = self._homes.get(key)
            if claim is None:
                claim = self._homes[key] = _HomeClaim()
            claim.users += 1
            while blocking and any(o is not owner for o in self._closing.get(key, ())):
                self._closed_one.wait()
        held = claim.lock.acquire(blocking)
        try:
            yield held
        finally:
            if held:
                claim.lock.release()
            with self._lock:
                claim.users -= 1
                if not claim.users:
                    del self._homes[key]

    @property
    def homes_held(self) -> int:
        """Homes some thread holds or waits for (0 when idle: the map never grows)."""
        with self._lock:
            return len(self._homes)

    def holders(self, home: Path | str) -> int:
        """Threads holding or waiting for `home`."""
        with self._lock:
            claim = self._homes.get(str(Path(home)))
            return 0 if claim is None else claim.users

    @contextlib.contextmanager
    def transient(self, home: Path, cwd: str | None) -> Iterator[Runtime]:
        """A transient app-server on `home` (no handlers), the home held from before its
        spawn until it has exited."""
        with self.home(home):
            runtime = self.spawn(home, cwd)
            try:
                yield runtime
            finally:
                runtime.proc.close()

    def launch_cwd(self, home: Path, cwd: str | None) -> str:
        return cwd if cwd and Path(cwd).is_dir() else str(home)

    def launch_fingerprint(self, home: Path, cwd: str) -> str | None:
        """The fingerprint of the launch `spawn(home, cwd)` would make (None: not cacheable)."""
        env = private_env(None, self.provider.home_var, home, self.provider.extra_env(home))
        env.pop(WORKER_VAR, None)  # one incarnation's marker: not the launch's
        return launch_fingerprint(self.provider.command(), self.launch_cwd(home, cwd), env)

    def spawn(
        self,
        home: Path,
        cwd: str | None,
        *,
        on_notification: NotificationHandler | None = None,
        on_server_request: ServerRequestHandler | None = None,
        on_exit: ExitHandler | None = None,
        quiet: QuietLines | None = None,
        marked: bool = False,
        started: Callable[[AppServerProcess], None] | None = None,
    ) -> Runtime:
        """A started and initialized app-server on `home`; the handlers run on its reader
        thread (a transient one, for a probe or a proof, has none). `marked`: a Session's
        runtime, whose Turns' tools may start processes: it carries a marker of its own, and
        its stop ends what still carries it (`AppServerProcess.end_left`); a transient runs
        no Turn and is not marked (its close scans nothing). `started`: told the process as
        soon as it exists, before its `initialize` (a Session's stop and liveness check look
        at it from then on, and may `abort` it)."""
        provider = self.provider
        home.mkdir(parents=True, exist_ok=True)
        provider.prepare_home(home)
        env = private_env(None, provider.home_var, home, provider.extra_env(home))
        if marked:
            # Inherited by all it starts (a stop ends what is left: `end_left`); not in the
            # launch's fingerprint, which is of the launch, not of one spawn.
            env[RUNTIME_VAR] = new_marker()
        proc = AppServerProcess(
            provider.command(),
            env=env,
            cwd=self.launch_cwd(home, cwd),
            on_notification=on_notification,
            on_server_request=on_server_request,
            on_exit=on_exit,
            stderr_path=home / ".app-server.log",
            quiet=quiet,
            write_limit=self.write_limit,
        )
        try:
            proc.start()
            if started is not None:
                started(proc)
            init = proc.initialize(CLIENT_NAME, CLIENT_VERSION, timeout=self.request_timeout)
        except AppServerFailure as exc:
            if proc.aborted is not None:  # found stopped while it started, and killed
                proc.close(1.0)
                raise DriverError(proc.aborted, reason=PROVIDER_STOPPED) from exc
            pid = proc.pid
            # A start that met a stopped process (SIGSTOP, SIGTSTP, a debugger) says so, typed
            # as a Turn's stopped provider is: it did not fail, it could not answer.
            stopped = TreeWatch(pid).stopped(time.monotonic()) if pid is not None else None
            if pid is not None and stopped is not None:
                proc.kill_tree()  # a stopped process below it would outlive the close
            proc.close(1.0)
            if pid is not None and stopped is not None:
                raise DriverError(
                    stopped_start_error(provider.kind, pid, stopped, str(exc)),
                    reason=PROVIDER_STOPPED,
                ) from exc
            raise DriverError(
                f"{provider.kind} app-server failed to start: {exc} {proc.stderr_tail()}".strip(),
                reason="provider_start_failed",
            ) from exc
        with self._lock:
            self.spawns += 1
        user_agent = str(init.get("userAgent") or "")
        return Runtime(proc, home, user_agent, provider.gate.check(user_agent))

    def project(
        self,
        runtime: Runtime,
        thread_ids: Iterable[str],
        keep: str | None = None,
        loaded: Callable[[], None] | None = None,
    ) -> None:
        """Resume, then unsubscribe, each thread: Codex 0.171 indexes a rollout's Turns in its
        home's history DB only when it loads that thread, and a copied rollout was never
        loaded there. Unsubscribing keeps the server from accumulating them. `keep`: the
        thread a live Session runs on this server, never unsubscribed — its Turns' every
        notification would stop reaching the worker (the server still runs them). `loaded`:
        called after each resume, the thread still held (a failpoint's site)."""
        for thread_id in thread_ids:
            runtime.proc.request(
                "thread/resume",
                {"threadId": thread_id, "excludeTurns": True},
                timeout=self.request_timeout,
            )
            if loaded is not None:
                loaded()
            if thread_id == keep:
                continue
            runtime.proc.request(
                "thread/unsubscribe", {"threadId": thread_id}, timeout=self.request_timeout
            )

    def load_lineage(
        self,
        runtime: Runtime,
        home: Path,
        thread_id: str,
        keep: str | None = None,
        loaded: Callable[[], None] | None = None,
    ) -> None:
        """Before an app-server on `home` reads `thread_id`: load what it must have seen first
        (the provider's `lineage`; nothing for tutti-agent). `keep`, `loaded`: as for
        `project`."""
        self.project(runtime, self.provider.lineage(home, thread_id), keep, loaded)

    def thread_turns(self, runtime: Runtime, thread_id: str) -> list[Mapping[str, Any]]:
        """The thread's turns with their items as one `thread/read` answers them (a fork's
        reads: one request), listed (`list_turns`) where the answer holds none."""
        result = runtime.proc.request(
            "thread/read",
            {"threadId": thread_id, "includeTurns": True},
            timeout=self.request_timeout,
        )
        thread = thread_of(result)
        turns = [t for t in thread.get("turns") or [] if isinstance(t, Mapping)]
        # Paginated histories may omit turns from thread/read: list them instead.
        return turns or self.list_turns(runtime, thread_id)

    def history_turns(self, runtime: Runtime, thread_id: str) -> list[Mapping[str, Any]]:
        """The thread's turns with their items, in order, listed a page at a time
        (`list_turns`) for a history of any length: one `thread/read` answers them all as one
        line, and a long history's line passes the reader's bound (`MAX_LINE_BYTES`: the
        server is killed, the read fails)."""
        return self.list_turns(runtime, thread_id)

    def list_turns(
        self, runtime: Runtime, thread_id: str, first: Future[dict[str, Any]] | None = None
    ) -> list[Mapping[str, Any]]:
        """The thread's turns with their items, in order, a page at a time (`list_turns`;
        `first`: its first page already sent, `first_turns_page`)."""
        return list_turns(runtime.proc, thread_id, self.request_timeout, first)
