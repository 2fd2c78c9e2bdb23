"""The providers benchmark 1 compares against, as a table: how to run each bare (the provider
calls the fork saga needs, on a warm server the benchmark spawns itself), how to configure the
daemon for it, and whether it can run here at all.

Adding a provider is one `ProviderEntry` in `PROVIDERS`: a bare harness and a daemon config.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from drivers.app_server.process import AppServerProcess, private_env
from drivers.app_server.runtimes import list_turns

REPO = Path(__file__).resolve().parent.parent
LIST_TIMEOUT_S = 300.0
"""A paged bare fork's wait for each `thread/turns/list` page."""


class BareProvider(Protocol):
    """A live provider with one source thread of N turns, ready to fork repeatedly."""

    def fork_once(self) -> float:
        """The bare fork calls, timed in milliseconds (cleanup after the timing excluded)."""
        ...

    def cold_read_once(self) -> float:
        """Read the source from its home alone, timed in ms: what the driver pays to prove a
        bound child readable (app-servers: spawn a fresh server on the home + `thread/read`;
        Claude Code: the SDK's in-process session read, no process)."""
        ...

    def close(self) -> None: ...


class BareAppServer:
    """A Codex-style app-server driven over stdio with the same client the driver uses: the
    timed part is `thread/read` (with turns) + `thread/fork {lastTurnId}`; the child is
    unsubscribed after the timing, as the driver does, so the server stays equally warm.

    `paged` (Codex): the reads the driver makes instead. The source's Turns listed with
    `thread/turns/list` pages (`drivers.app_server.runtimes.list_turns`) only when Turns ran
    since the last listing (the driver reuses a listing of an unchanged source), then
    `thread/fork {lastTurnId, excludeTurns}` and the child's Turns listed the same way."""

    def __init__(
        self,
        argv: list[str],
        home_var: str,
        home: Path,
        env: Mapping[str, str],
        *,
        resume: tuple[str, list[str]] | None = None,
        cwd: Path | None = None,
        paged: bool = False,
    ):
        self._argv, self._home_var, self._home, self._env = argv, home_var, home, dict(env)
        self._paged = paged
        self._listed: int | None = None  # how many Turns the source had at its last listing
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
        # `cwd`: the folder the benchmark's daemon Sessions work in (`BenchDaemon.workdir`, a
        # small folder of their own, for Codex: its `thread/fork` collects the child's git
        # info in its cwd, ~12 `git` processes a fork in a git work tree), else REPO (the
        # Tutti Agent runs no `git`).
        started = self.proc.request("thread/start", {"cwd": str(cwd or REPO)})
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
        if self._paged:
            return self._paged_fork_once()
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

    def _paged_fork_once(self) -> float:
        t0 = time.perf_counter()
        if self._listed != len(self.turn_ids):
            list_turns(self.proc, self.thread_id, LIST_TIMEOUT_S)
            self._listed = len(self.turn_ids)
        params = {"threadId": self.thread_id, "lastTurnId": self.turn_ids[-1]}
        forked = self.proc.request("thread/fork", {**params, "excludeTurns": True})
        child = str(forked["thread"]["id"])
        if not forked["thread"].get("turns"):
            list_turns(self.proc, child, LIST_TIMEOUT_S)
        elapsed = (time.perf_counter() - t0) * 1000.0
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
        from drivers.codex.command import default_command
    except ImportError:
        return "no Codex driver (drivers/codex/) in this tree"
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
    from model_fakes.responses import ResponsesServer

    with ResponsesServer() as server:
        yield {"model": "mock-model", "model_base_url": server.base_url}


def _codex_bare(home: Path, n: int, config: Mapping[str, str]) -> BareProvider:
    from drivers.codex.command import default_command
    from drivers.codex.config import ApprovalPolicy, SandboxMode, render_config_toml

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        render_config_toml(
            model=config.get("model"),
            model_base_url=config.get("model_base_url"),
            approval_policy=ApprovalPolicy.NEVER,
            sandbox_mode=SandboxMode.READ_ONLY,
        )
    )
    # The daemon's Sessions' cwd: a small folder of their own (`BenchDaemon.workdir`), not a
    # git work tree, where Codex's `thread/fork` runs ~12 `git` processes a fork.
    work = home.parent / f"{home.name}-work"
    work.mkdir(exist_ok=True)
    argv = [*default_command(), "app-server"]
    bare = BareAppServer(argv, "CODEX_HOME", home, {}, cwd=work, paged=True)
    bare.run_turns(n, lambda i: f"turn {i}")
    return bare


class BareClaude:
    """A Claude Code session driven with the pinned SDK as the driver drives it: turns through
    `query()` (the bundled CLI) in a private `CLAUDE_CONFIG_DIR` + `HOME`, forks in-process.

    The timed part of a fork is exactly the provider calls `drivers/claude/fork.py` makes per fork:
    `fork_session(source, directory=cwd, up_to_message_id=checkpoint, title=...)` and the
    in-process read of the child (`get_session_info` + `get_session_messages`), with
    `CLAUDE_CONFIG_DIR`/`HOME` pointed at the config dir as the driver's `_config_env` does.
    Not timed: the driver's move of the child into its own home (its binding step, which the
    app-server harness leaves out too) and the transcript checks. The child transcript is
    deleted after the timing, so the source's project dir does not grow.
    """

    def __init__(self, home: Path, config: Mapping[str, str]) -> None:
        from drivers.claude.env import PRIVATE_HOME_DIR, QUIET_ENV

        self.config_dir = home / "claude-config"
        self.private_home = self.config_dir / PRIVATE_HOME_DIR
        self.cwd = home / "workspace"
        for path in (self.private_home, self.cwd):
            path.mkdir(parents=True, exist_ok=True)
        self._model = config.get("model") or None
        self._cli_path = config.get("cli_path") or None
        # What the driver's `_session_env` gives the CLI (api_key: the driver's default).
        self._env = dict(QUIET_ENV)
        self._env.update(
            {
                "HOME": str(self.private_home),
                "CLAUDE_CONFIG_DIR": str(self.config_dir),
                "ANTHROPIC_API_KEY": "dummy",
            }
        )
        if config.get("model_base_url"):
            self._env["ANTHROPIC_BASE_URL"] = config["model_base_url"]
        self.session_id = str(uuid.uuid4())
        self.turn_ids: list[str] = []
        self.checkpoint: str | None = None
        """The last turn's checkpoint message uuid: where every fork cuts."""
        self.last_child: str | None = None
        """The child of the latest `fork_once` (its transcript is already deleted)..."""
        self.last_child_messages = 0
        """... and how many messages the in-process read of it returned."""

    @property
    def transcript(self) -> Path:
        from drivers.claude_transcript import transcript_path

        return transcript_path(self.config_dir, str(self.cwd), self.session_id)

    def _config_env(self) -> AbstractContextManager[None]:
        """The SDK's session helpers read `CLAUDE_CONFIG_DIR` from `os.environ`: point it (and
        `HOME`) at this session, as the driver does for each call."""
        from drivers.claude.env import claude_config_env

        return claude_config_env(str(self.config_dir), str(self.private_home))

    async def _turn(self, text: str) -> None:
        from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

        exists = self.transcript.exists()
        options = ClaudeAgentOptions(
            cwd=str(self.cwd),
            env=dict(self._env),
            # As the driver: the first turn claims the session id, later ones resume it.
            resume=self.session_id if exists else None,
            session_id=None if exists else self.session_id,
            setting_sources=[],
            model=self._model,
            cli_path=self._cli_path,
        )
        result: ResultMessage | None = None
        async for message in query(prompt=text, options=options):
            if isinstance(message, ResultMessage):
                result = message
        if result is None or result.is_error:
            raise RuntimeError(f"bare Claude turn {text!r} failed: {result}")

    def run_turns(self, n: int, text: Callable[[int], str]) -> None:
        from drivers.claude_transcript import parse_entries, split_turns

        for i in range(n):
            asyncio.run(self._turn(text(i)))
        # The checkpoint comes from the transcript, as the driver reconciles it at turn end.
        turns = split_turns(parse_entries(self.transcript.read_text(encoding="utf-8")))
        if len(turns) != n:
            raise RuntimeError(f"bare Claude source has {len(turns)} turns, expected {n}")
        self.turn_ids = [t.root_uuid for t in turns]
        self.checkpoint = turns[-1].checkpoint_uuid

    def fork_once(self) -> float:
        from claude_agent_sdk import fork_session, get_session_info, get_session_messages

        from drivers.claude_transcript import transcript_path

        assert self.checkpoint is not None, "run_turns first"
        cwd = str(self.cwd)
        t0 = time.perf_counter()
        with self._config_env():  # the driver's `ClaudeFork.call_fork_session`
            child = str(
                fork_session(
                    self.session_id,
                    directory=cwd,
                    up_to_message_id=self.checkpoint,
                    title="bench fork",
                ).session_id
            )
        # The driver's `_verify_child` reads the child in a second env switch (to the target
        # home, where it has moved it); here it is read where `fork_session` wrote it.
        with self._config_env():
            info = get_session_info(child, directory=cwd)
            messages = get_session_messages(child, directory=cwd)
        elapsed = (time.perf_counter() - t0) * 1000.0
        transcript_path(self.config_dir, cwd, child).unlink()
        if info is None or not messages:
            raise RuntimeError(f"bare Claude child {child} is not readable")
        self.last_child, self.last_child_messages = child, len(messages)
        return elapsed

    def cold_read_once(self) -> float:
        from claude_agent_sdk import get_session_info, get_session_messages

        cwd = str(self.cwd)
        t0 = time.perf_counter()
        with self._config_env():
            info = get_session_info(self.session_id, directory=cwd)
            messages = get_session_messages(self.session_id, directory=cwd)
        elapsed = (time.perf_counter() - t0) * 1000.0
        if info is None or not messages:
            raise RuntimeError(f"bare Claude source {self.session_id} is not readable")
        return elapsed

    def close(self) -> None:
        """Nothing runs between calls: each turn's CLI process ended with its turn."""


def _claude_unavailable() -> str | None:
    from drivers.claude.env import PINNED_SDK_VERSION

    try:
        import claude_agent_sdk
    except ImportError as exc:
        return f"claude-agent-sdk is not importable ({exc}); install .[claude] (`make test`)"
    version = str(getattr(claude_agent_sdk, "__version__", "?"))
    if version != PINNED_SDK_VERSION:
        return f"claude-agent-sdk {version} is not the pinned {PINNED_SDK_VERSION}"
    cli = Path(str(claude_agent_sdk.__file__)).parent / "_bundled" / "claude"
    if not os.access(cli, os.X_OK):
        return f"the SDK's bundled Claude Code CLI is not executable: {cli}"
    return None


@contextmanager
def _claude_environment() -> Iterator[dict[str, str]]:
    # The only faked part: the model, a Messages API on 127.0.0.1 (tests/support).
    from model_fakes.messages import MessagesServer

    with MessagesServer() as server:
        yield {"model_base_url": server.base_url}


def _claude_bare(home: Path, n: int, config: Mapping[str, str]) -> BareProvider:
    bare = BareClaude(home, config)
    bare.run_turns(n, lambda i: f"turn {i}")
    return bare


PROVIDERS: tuple[ProviderEntry, ...] = (
    ProviderEntry("tutti-agent", lambda: None, _tutti_bare),
    ProviderEntry("codex", _codex_unavailable, _codex_bare, _codex_environment),
    ProviderEntry("claude-code", _claude_unavailable, _claude_bare, _claude_environment),
)


def provider(name: str) -> ProviderEntry:
    for entry in PROVIDERS:
        if entry.name == name:
            return entry
    raise KeyError(name)
