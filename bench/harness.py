"""The daemon under test and the client calls the benchmarks make: a real `agenthost serve`
subprocess in its own tmp home (private HOME too), its process tree's RSS and CPU from /proc,
and session/turn/fork helpers over the real socket.

Nothing here is faked: the daemon spawns its real workers and `tutti-agent app-server`s.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transport.client import ApiError, Client

PACKAGES = (
    "agenthost",
    "actors",
    "storage",
    "transport",
    "domain",
    "protocol",
    "drivers",
    "client",
    "workspace",
    "tutti_agent",
    "model_fakes",
)
"""What the daemon, its workers, the built-in provider and the fake models import from the
checkout."""
_compiled: set[Path] = set()


def byte_compile(root: Path) -> None:
    """`root`'s packages' bytecode and dataclass code, written as an install writes them
    (unchanged files skipped; once per process). Without it a checkout run under
    `PYTHONDONTWRITEBYTECODE=1` compiles every module at every daemon start, a cost no
    installed daemon pays."""
    if root in _compiled:
        return
    for package in PACKAGES:
        if (root / package).is_dir():
            compileall.compile_dir(str(root / package), quiet=1)
    # The code of the functions its dataclasses make, written beside it as an install writes
    # it (domain/dataclass_code.py): ~70 ms of each daemon start's CPU without it. Not checked:
    # a daemon without it compiles its dataclasses as before (and
    # tests/domain/test_dataclass_code.py fails).
    if (root / "domain" / "dataclass_code.py").is_file():
        subprocess.run(
            [sys.executable, "-m", "domain.dataclass_code"],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            check=False,
            stdout=subprocess.DEVNULL,
        )
    _compiled.add(root)


WS = "ws-bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class BenchDaemon:
    """One `agenthost serve` child; `stop()` always ends it (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        home: Path,
        *,
        idle_actor_seconds: float | None = None,
        providers: Mapping[str, Mapping[str, Any]] | None = None,
        daemon: Mapping[str, Any] | None = None,
        workspace: Mapping[str, Any] | None = None,
    ) -> None:
        self.home = home
        self.daemon = dict(daemon or {})
        self.workspace = dict(workspace or {})
        self.idle_actor_seconds = idle_actor_seconds
        self.providers = dict(providers or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self.ready_seconds = 0.0
        self._clients: list[Client] = []
        self.workdir = home.parent / f"{home.name}-work"

    def _write_config(self) -> None:
        lines: list[str] = []
        daemon = dict(self.daemon)
        if self.idle_actor_seconds is not None:
            daemon["idle_actor_seconds"] = self.idle_actor_seconds
        if daemon:
            lines.append("[daemon]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in daemon.items()]
        if self.workspace:
            lines.append("[workspace]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in self.workspace.items()]
        for name, table in self.providers.items():
            lines.append(f'[providers."{name}"]')
            lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
        if lines:
            (self.home / "agenthost.toml").write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 120.0) -> BenchDaemon:
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_config()
        user_home = self.home / "user-home"
        user_home.mkdir(exist_ok=True)
        env = dict(os.environ)
        self.workdir.mkdir(exist_ok=True)
        repo = str(Path(__file__).resolve().parent.parent)
        byte_compile(Path(repo))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
        # A private HOME: no provider ever sees the user's ~/.codex or ~/.claude.
        env.update({"AGENTHOST_HOME": str(self.home), "HOME": str(user_home)})
        # The accept shim compiled once (as a user's cache keeps it), not at every fresh HOME.
        env.setdefault("AGENTHOST_NATIVE_DIR", str(Path(repo) / "build" / "native"))
        env.pop("AGENTHOST_FAILPOINTS", None)
        env.pop("AGENTHOST_ENABLE_FAILPOINTS", None)
        log = open(self.home / "daemon.log", "ab")  # noqa: SIM115 - owned by the child
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agenthost", "--home", str(self.home), "serve"],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            # The default `cwd` of its Sessions, which every Turn checkpoints: a small folder
            # of its own, not the checkout (whose cold checkpoint alone takes seconds).
            cwd=str(self.workdir),
        )
        log.close()
        assert self.proc.stdout is not None
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log_tail()}")
            readable, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            if readable:
                line = self.proc.stdout.readline()
                self.ready_seconds = time.monotonic() - started
                self.ready = json.loads(line)
                return self
        self.kill()
        raise RuntimeError(f"daemon not ready in {timeout}s: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (self.home / "daemon.log").read_text(errors="replace")[-n:]
        return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def api(self) -> str:
        return str(self.ready["api"])

    @property
    def events(self) -> str:
        return str(self.ready["events"])

    def client(self, timeout: float = 60.0) -> Client:
        c = Client(self.api, timeout=timeout)
        self._clients.append(c)
        return c

    def stop(self, timeout: float = 30.0) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> BenchDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- /proc accounting -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcSample:
    pid: int
    kind: str
    rss_mb: float
    hwm_mb: float
    cpu_s: float
    """utime + stime of the process itself."""
    children_cpu_s: float
    """cutime + cstime: CPU of children it already reaped (short-lived app-servers)."""


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def process_kind(pid: int) -> str:
    argv = (_read(f"/proc/{pid}/cmdline") or "").split("\0")
    cmd = " ".join(argv)
    # `python -m agenthost … serve` (the accept shim's re-execution keeps that argv), or the
    # older `-m agenthost.cli`.
    if "agenthost.cli" in cmd or ("agenthost" in argv and "serve" in argv):
        return "daemon"
    if "drivers.worker" in cmd:
        return "worker"
    if "app-server" in cmd:
        return "app-server"
    return "other"


def sample(pid: int) -> ProcSample | None:
    stat = _read(f"/proc/{pid}/stat")
    status = _read(f"/proc/{pid}/status")
    if stat is None or status is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # Fields after the command: state is [0]; utime, stime, cutime, cstime are 14..17 (1-based).
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    rss = hwm = 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return ProcSample(
        pid, process_kind(pid), rss, hwm, (utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK
    )


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (by /proc/*/stat parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if stat is None:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def tree(pid: int) -> list[ProcSample]:
    return [s for p in descendants(pid) if (s := sample(p)) is not None]


def cpu_by_kind(samples: list[ProcSample]) -> dict[str, float]:
    """CPU seconds per process kind; a parent's reaped children count as its own children's
    kind (workers reap the short-lived verification app-servers they spawn)."""
    out: dict[str, float] = {}
    for s in samples:
        out[s.kind] = out.get(s.kind, 0.0) + s.cpu_s
        if s.children_cpu_s:
            reaped = "app-server" if s.kind == "worker" else f"{s.kind}-children"
            out[reaped] = out.get(reaped, 0.0) + s.children_cpu_s
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-kind CPU spent between two readings (a process that exited in between is lost from
    both sides unless its parent reaped it, so short-lived processes are counted by parents)."""
    return {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0)) for k in after}


# -- client calls ---------------------------------------------------------------------------


def create_session(
    c: Client, title: str = "bench", ws: str = WS, provider: str = "tutti-agent"
) -> str:
    session = c.call("session.create", {"workspaceId": ws, "provider": provider, "title": title})
    return str(session["session"]["agentSessionId"])


def submit(c: Client, sid: str, text: str, ws: str = WS) -> dict[str, Any]:
    return dict(
        c.call(
            "turn.submit",
            {
                "workspaceId": ws,
                "agentSessionId": sid,
                "requestId": str(uuid.uuid4()),
                "input": [{"type": "text", "text": text}],
            },
        )["turn"]
    )


def wait_idle(c: Client, sid: str, ws: str = WS, timeout: float = 120.0) -> None:
    """Until the Session has no active Turn (polled with `session.get`)."""
    deadline = time.monotonic() + timeout
    while True:
        s = c.call("session.get", {"workspaceId": ws, "agentSessionId": sid})["session"]
        if s["activeTurnId"] is None:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"session {sid} still has an active turn")
        time.sleep(0.01)


def run_turn(c: Client, sid: str, text: str, ws: str = WS) -> str:
    turn_id = str(submit(c, sid, text, ws)["turnId"])
    wait_idle(c, sid, ws)
    return turn_id


def last_settled_turn(c: Client, sid: str, ws: str = WS) -> str:
    turns = timeline(c, sid, ws)
    settled = [t for t in turns if t["phase"] == "settled"]
    return str(settled[-1]["turnId"])


def timeline(c: Client, sid: str, ws: str = WS) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        page = c.call(
            "session.timeline",
            {"workspaceId": ws, "agentSessionId": sid, "afterSequence": after, "limit": 1000},
        )
        out += page["turns"]
        if page.get("nextSequence") is None:
            return out
        after = int(page["nextSequence"])  # the last sequence returned: pass it as afterSequence


def fork_params(sid: str, turn_id: str, ws: str = WS) -> dict[str, Any]:
    return {
        "workspaceId": ws,
        "agentSessionId": sid,
        "requestId": str(uuid.uuid4()),
        "targetAgentSessionId": str(uuid.uuid4()),
        "point": {"type": "throughTurn", "turnId": turn_id},
    }


def fork_until_terminal(
    c: Client, sid: str, turn_id: str, ws: str = WS, poll_s: float = 0.01
) -> dict[str, Any]:
    """`fork.create` then `fork.get` until the operation is terminal; raises `ApiError` when
    the fork is refused before an operation exists."""
    status, body = c.call_raw("fork.create", fork_params(sid, turn_id, ws))
    if status >= 400:
        raise ApiError.from_reply(status, body)
    op = dict(body["operation"])
    while op["status"] == "accepted":
        time.sleep(poll_s)
        got = c.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})
        op = dict(got["operation"])
    return op


def acknowledge(c: Client, op_id: str, ws: str = WS) -> None:
    c.call("fork.acknowledge", {"workspaceId": ws, "operationId": op_id})
