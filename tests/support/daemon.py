"""Runs a real `agenthost serve` subprocess for tests: its own AGENTHOST_HOME, the ready line,
clients on its ipc socket, and SIGTERM/SIGKILL for crash tests."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import apsw

from transport import accept_shim
from transport.client import Client

WS = "ws-test"
REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _shim_library() -> Path | None:
    try:
        return accept_shim.build()
    except (OSError, RuntimeError):
        return None


def preloaded(env: dict[str, str]) -> dict[str, str]:
    """`env` with the accept shim preloaded, as `serve`'s re-execution hands it on
    (transport/accept_shim.py): the daemon finds the shim loaded and skips the re-execution,
    a second interpreter's start (~45 ms of CPU) for every test daemon. Left as it is where the
    shim is turned off or already given, or cannot be built (the daemon then says why)."""
    if env.get(accept_shim.OPT_OUT) == "1" or accept_shim.MARKER in env:
        return env
    if not sys.platform.startswith("linux"):
        return env
    library = _shim_library()
    return env if library is None else accept_shim.preload_env(env, library)


class DaemonProcess:
    def __init__(
        self,
        home: Path,
        *,
        env: Mapping[str, str] | None = None,
        args: tuple[str, ...] = (),
        failpoints: str | None = None,
        preexec_fn: Callable[[], None] | None = None,
        shim_reexec: bool = False,
    ) -> None:
        self.home = home
        # False: the accept shim is preloaded here (`preloaded`), the daemon starts in one
        # interpreter; True: it re-executes itself with the shim, as a user's `serve` does.
        self.shim_reexec = shim_reexec
        self.preexec_fn = preexec_fn  # e.g. lower RLIMIT_NOFILE in the daemon only
        self.extra_env = dict(env or {})
        self.args = args
        self.failpoints = failpoints
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self._clients: list[Client] = []
        self.log_path = home / "daemon.log"
        # The daemon runs in a small directory of its own: it is the `cwd` of every Session
        # created without one, and each Turn checkpoints that directory (the repository would
        # make every test's first Turn wait for a cold checkpoint of all its files).
        self.workdir = home.parent / f"{home.name}-work"

    def start(self, timeout: float = 30.0) -> DaemonProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.extra_env)
        env["AGENTHOST_HOME"] = str(self.home)
        self.workdir.mkdir(parents=True, exist_ok=True)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        )
        # `debug.failpoints` on unless the test passes AGENTHOST_ENABLE_FAILPOINTS itself.
        env["AGENTHOST_ENABLE_FAILPOINTS"] = self.extra_env.get("AGENTHOST_ENABLE_FAILPOINTS", "1")
        if self.failpoints is not None:
            env["AGENTHOST_FAILPOINTS"] = self.failpoints
        if not self.shim_reexec:
            env = preloaded(env)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agenthost", "--home", str(self.home), "serve", *self.args],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            cwd=self.workdir,
            preexec_fn=self.preexec_fn,
        )
        log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.tail_log()}")
                ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
                if ready:
                    line = self.proc.stdout.readline()
                    break
        except BaseException:
            # A wait cut short (the test's timeout, ^C): the caller never gets this daemon to
            # stop, and it would serve on, a process of the home outside the next run's.
            self.kill()
            raise
        if not line:
            self.kill()
            raise RuntimeError(f"daemon not ready in {timeout}s: {self.tail_log()}")
        self.ready = json.loads(line)
        return self

    def tail_log(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    @property
    def api(self) -> str:
        return str(self.ready["api"])

    @property
    def events(self) -> str:
        return str(self.ready["events"])

    @property
    def events_exact(self) -> str:
        """The terminated-topic events endpoint (`eventsExact`)."""
        return str(self.ready["eventsExact"])

    def client(self, timeout: float = 30.0) -> Client:
        c = Client(self.api, timeout=timeout)
        self._clients.append(c)
        return c

    def _close_clients(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, and its exit code. A daemon that has not exited `timeout` s later is
        SIGKILLed and the test fails: a clean stop that hangs is a defect, never hidden."""
        self._close_clients()
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"the daemon did not stop {timeout:g} s after SIGTERM: {self.tail_log()}"
            ) from None

    def kill(self) -> None:
        self._close_clients()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)


def status_of_last_fork(store_path: Path, sid: str) -> str | None:
    """The status of the newest fork operation of source `sid`, read-only. Through apsw, the
    daemon's own SQLite library: the stdlib's `sqlite3` is a second copy, and inside the
    process of an in-process daemon its fcntl locks cannot see the daemon's (one process),
    so it took itself for the first connection, re-initialised the `-shm` the daemon had
    mapped, and the daemon died of SIGBUS (a full-suite run, 2026-11-30)."""
    conn = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.set_busy_timeout(5000)
        row = conn.execute(
            "SELECT status FROM fork_operations WHERE source_session_id = ?"
            " ORDER BY op_seq DESC LIMIT 1",
            (sid,),
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else str(row[0])


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def create_session(
    client: Client, ws: str = WS, provider: str = "tutti-agent", **extra: Any
) -> dict[str, Any]:
    return dict(
        client.call("session.create", {"workspaceId": ws, "provider": provider, **extra})["session"]
    )


def fork_params(
    ws: str, sid: str, turn_id: str, *, request_id: str | None = None
) -> dict[str, Any]:
    """`fork.create`'s params for a fork of `sid` through `turn_id`: a fresh request id (unless
    given) and a fresh target Session id."""
    return {
        "workspaceId": ws,
        "agentSessionId": sid,
        "requestId": request_id or str(uuid.uuid4()),
        "targetAgentSessionId": str(uuid.uuid4()),
        "point": {"type": "throughTurn", "turnId": turn_id},
    }


def respond(
    client: Client, sid: str, turn_id: str, request_id: str, response: dict[str, Any], ws: str = WS
) -> dict[str, Any]:
    """`interaction.respond`: the Interaction as the daemon recorded it."""
    return dict(
        client.call(
            "interaction.respond",
            {
                "workspaceId": ws,
                "agentSessionId": sid,
                "turnId": turn_id,
                "requestId": request_id,
                "response": response,
            },
        )["interaction"]
    )


def submit(
    client: Client, sid: str, text: str, ws: str = WS, request_id: str | None = None
) -> dict[str, Any]:
    return dict(
        client.call(
            "turn.submit",
            {
                "workspaceId": ws,
                "agentSessionId": sid,
                "requestId": request_id or str(uuid.uuid4()),
                "input": [{"type": "text", "text": text}],
            },
        )["turn"]
    )


def timeline(client: Client, sid: str, ws: str = WS) -> list[dict[str, Any]]:
    """Every Turn of the Session, paged with `afterSequence` = the last `nextSequence` (a page
    may end before `limit` at its byte bound)."""
    turns: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.call(
            "session.timeline",
            {"workspaceId": ws, "agentSessionId": sid, "limit": 1000, "afterSequence": after},
        )
        turns += page["turns"]
        if page["nextSequence"] is None:
            return turns
        after = int(page["nextSequence"])


def turn_of(client: Client, sid: str, turn_id: str, ws: str = WS) -> dict[str, Any]:
    for turn in timeline(client, sid, ws):
        if turn["turnId"] == turn_id:
            return turn
    raise AssertionError(f"turn {turn_id} not found")


def settle(
    client: Client, sid: str, turn_id: str, ws: str = WS, timeout: float = 60.0
) -> dict[str, Any]:
    return dict(
        wait_for(
            lambda: (t := turn_of(client, sid, turn_id, ws))["phase"] == "settled" and t,
            timeout,
        )
    )


def run_turn(client: Client, sid: str, text: str, ws: str = WS) -> dict[str, Any]:
    return settle(client, sid, submit(client, sid, text, ws)["turnId"], ws)
