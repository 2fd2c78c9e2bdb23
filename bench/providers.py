"""The providers benchmark 1 compares against, as a table: how to run each bare (the provider
calls the fork saga needs, on a warm server the benchmark spawns itself), how to configure the
daemon for it, and whether it can run here at all.

Adding a provider is one `ProviderEntry` in `PROVIDERS`: a bare harness and a daemon config.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from drivers.app_server import AppServerProcess, private_env

REPO = Path(__file__).resolve().parent.parent


class BareProvider(Protocol):
    """A live provider with one source thread of N turns, ready to fork repeatedly."""

    def fork_once(self) -> float:
        """The bare fork calls, timed in milliseconds (cleanup after the timing excluded)."""
        ...

    def cold_read_once(self) -> float:
        """Spawn a fresh server on the same home and read the source thread, timed in ms:
        what the driver pays to prove a bound child readable from its home alone."""
        ...

    def close(self) -> None: ...


class BareAppServer:
    """A Codex-style app-server driven over stdio with the same client the driver uses: the
    timed part is `thread/read` (with turns) + `thread/fork {lastTurnId}`, exactly the two
    calls the driver makes on the source before binding; the child is unsubscribed after the
    timing, as the driver does, so the server stays equally warm."""

    def __init__(
        self,
        argv: list[str],
        home_var: str,
        home: Path,
        env: Mapping[str, str],
        *,
        resume: tuple[str, list[str]] | None = None,
    ):
        self._argv, self._home_var, self._home, self._env = argv, home_var, home, dict(env)
        self._done: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        home.mkdir(parents=True, exist_ok=True)
        self.proc = AppServerProcess(
            argv,
            env=private_env(None, home_var, home, env),
            cwd=str(home),
            on_notification=self._on_notification,
            stderr_path=home / ".bare-app-server.log",
        )
        self.proc.start()
        self.proc.initialize("agenthost-bench", "0.1.0")
        self.turn_ids: list[str] = []
        if resume is not None:
            # An existing thread (e.g. a copy of a big source's home), loaded warm.
            self.thread_id, self.turn_ids = resume[0], list(resume[1])
            self.proc.request("thread/resume", {"threadId": self.thread_id}, timeout=300)
            return
        started = self.proc.request("thread/start", {"cwd": str(home)})
        self.thread_id = str(started["thread"]["id"])

    def _on_notification(self, method: str, params: Mapping[str, Any]) -> None:
        if method == "turn/completed":
            turn_id = str((params.get("turn") or {}).get("id") or "")
            with self._lock:
                event = self._done.setdefault(turn_id, threading.Event())
            event.set()

    def run_turns(self, n: int, text: Callable[[int], str]) -> None:
        for i in range(n):
            result = self.proc.request(
                "turn/start",
                {
                    "threadId": self.thread_id,
                    "input": [{"type": "text", "text": text(i), "text_elements": []}],
                },
            )
            turn_id = str(result["turn"]["id"])
            with self._lock:
                event = self._done.setdefault(turn_id, threading.Event())
            if not event.wait(120):
                raise TimeoutError(f"bare turn {turn_id} did not complete")
            self.turn_ids.append(turn_id)

    def fork_once(self) -> float:
        t0 = time.perf_counter()
        read = self.proc.request("thread/read", {"threadId": self.thread_id, "includeTurns": True})
        if not (read.get("thread") or {}).get("turns"):
            # Paginated histories omit turns from thread/read: the driver lists them.
            params = {"threadId": self.thread_id, "sortDirection": "asc", "limit": 100}
            self.proc.request("thread/turns/list", params)
        forked = self.proc.request(
            "thread/fork", {"threadId": self.thread_id, "lastTurnId": self.turn_ids[-1]}
        )
        elapsed = (time.perf_counter() - t0) * 1000.0
        child = str(forked["thread"]["id"])
        self.proc.request("thread/unsubscribe", {"threadId": child})
        return elapsed

    def cold_read_once(self) -> float:
        t0 = time.perf_counter()
        proc = AppServerProcess(
            self._argv,
            env=private_env(None, self._home_var, self._home, self._env),
            cwd=str(self._home),
        )
        try:
            proc.start()
            proc.initialize("agenthost-bench", "0.1.0")
            proc.request("thread/read", {"threadId": self.thread_id, "includeTurns": True})
            return (time.perf_counter() - t0) * 1000.0
        finally:
            proc.close()

    def close(self) -> None:
        self.proc.close()


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    name: str
    """The provider kind on the wire (`session.create {provider}`)."""
    unavailable: Callable[[], str | None]
    """None when it can run here, else why not (reported, never counted as a pass)."""
    bare: Callable[[Path, int, Mapping[str, str]], BareProvider]
    """A warm bare provider in `home` with a source of `n` turns, given the provider config."""
    environment: Callable[[], AbstractContextManager[dict[str, str]]] = field(
        default=lambda: nullcontext({})
    )
    """Runs what the provider needs (a fake model server) and yields its `[providers.NAME]`
    config, shared by the daemon and the bare harness."""


def _tutti_argv() -> list[str]:
    return [str(Path(sys.executable).parent / "tutti-agent"), "app-server"]


def _tutti_bare(home: Path, n: int, config: Mapping[str, str]) -> BareProvider:
    bare = BareAppServer(_tutti_argv(), "TUTTI_AGENT_HOME", home, {})
    bare.run_turns(n, lambda i: f"turn {i}")
    return bare


def _codex_unavailable() -> str | None:
    try:
        from drivers.codex import default_command
    except ImportError:
        return "no Codex driver (drivers/codex.py) in this tree"
    try:
        argv = default_command()
    except Exception as exc:  # noqa: BLE001 - any failure to resolve means "not installed"
        return f"Codex is not installed ({exc}); run `make providers`"
    if not argv or not Path(argv[0]).exists():
        return "Codex 0.171.0 is not installed (run `make providers`)"
    return None


@contextmanager
def _codex_environment() -> Iterator[dict[str, str]]:
    # The only faked part: the model, a Responses API on 127.0.0.1 (tests/support).
    from tests.support.responses_server import ResponsesServer

    with ResponsesServer() as server:
        yield {"model": "mock-model", "model_base_url": server.base_url}


def _codex_bare(home: Path, n: int, config: Mapping[str, str]) -> BareProvider:
    from drivers.codex import ApprovalPolicy, SandboxMode, default_command, render_config_toml

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        render_config_toml(
            model=config.get("model"),
            model_base_url=config.get("model_base_url"),
            approval_policy=ApprovalPolicy.NEVER,
            sandbox_mode=SandboxMode.READ_ONLY,
        )
    )
    bare = BareAppServer([*default_command(), "app-server"], "CODEX_HOME", home, {})
    bare.run_turns(n, lambda i: f"turn {i}")
    return bare


def _claude_unavailable() -> str | None:
    return "bare `fork_session` harness not written yet (needs the turn's checkpoint uuid)"


def _unbuilt(home: Path, n: int, config: Mapping[str, str]) -> BareProvider:
    raise NotImplementedError("this provider's bare harness is not available here")


PROVIDERS: tuple[ProviderEntry, ...] = (
    ProviderEntry("tutti-agent", lambda: None, _tutti_bare),
    ProviderEntry("codex", _codex_unavailable, _codex_bare, _codex_environment),
    ProviderEntry("claude-code", _claude_unavailable, _unbuilt),
)


def provider(name: str) -> ProviderEntry:
    for entry in PROVIDERS:
        if entry.name == name:
            return entry
    raise KeyError(name)
