"""Fixtures for the Claude driver tests: a real ClaudeDriver (real SDK + bundled CLI) against
the local MessagesServer, with per-session homes under a tmp dir and a recording `emit`."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from domain.turn_events import TurnEvent
from drivers.claude.driver import ClaudeDriver
from drivers.claude.env import ClaudeDriverConfig
from drivers.failpoints import Failpoints
from model_fakes.messages import MessagesServer, last_user_text
from tests.support.daemon import DaemonProcess

SLOW_PREFIX = "/hold "


class Recorder:
    """Thread-safe sink for `emit(agent_session_id, event)` with waiting helpers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, agent_session_id: str, event: TurnEvent) -> None:
        wire = event.to_wire()  # what the worker sends
        with self._cond:
            self.events.append((agent_session_id, wire))
            self._cond.notify_all()

    def for_turn(self, turn_id: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for _, e in self.events if e.get("turnId") == turn_id]

    def wait_completed(self, turn_id: str, timeout: float = 60) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            for _, e in self.events:
                if e.get("turnId") == turn_id and e["type"] == "turn.completed":
                    return e
            return None

        with self._cond:
            assert self._cond.wait_for(lambda: done() is not None, timeout=timeout), turn_id
            result = done()
            assert result is not None
            return result


@dataclass
class ClaudeSession:
    agent_session_id: str
    provider_session_id: str
    home: Path
    cwd: Path
    turns: list[tuple[str, str]] = field(default_factory=list)  # (providerTurnId, bindingJson)
    start_result: dict[str, Any] = field(default_factory=dict)


class Harness:
    def __init__(self, root: Path, server: MessagesServer, failpoints: Failpoints | None = None):
        self.root = root
        self.server = server
        self.cwd = root / "workspace"
        self.cwd.mkdir(exist_ok=True)
        self.recorder = Recorder()
        self.driver = self.new_driver(failpoints)

    def new_driver(self, failpoints: Failpoints | None = None) -> ClaudeDriver:
        config = ClaudeDriverConfig(model_base_url=self.server.base_url)
        return ClaudeDriver(config, failpoints or Failpoints())

    def home(self, name: str) -> Path:
        return self.root / "runtimes" / name / "claude-config"

    def start(
        self,
        name: str,
        *,
        driver: ClaudeDriver | None = None,
        provider_session_id: str | None = None,
        runtime_context: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> ClaudeSession:
        home = self.home(name)
        home.mkdir(parents=True, exist_ok=True)
        params: dict[str, Any] = {
            "agentSessionId": f"agent-{name}",
            "home": str(home),
            "cwd": str(self.cwd),
            "settings": settings or {},
            "model": None,
        }
        if provider_session_id:
            params["providerSessionId"] = provider_session_id
        if runtime_context is not None:
            params["runtimeContext"] = runtime_context
        result = (driver or self.driver).start_session(params)
        return ClaudeSession(
            f"agent-{name}", result["providerSessionId"], home, self.cwd, start_result=result
        )

    def turn(
        self, session: ClaudeSession, text: str, *, driver: ClaudeDriver | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Runs one turn to completion; returns (providerTurnId, turn.completed event)."""
        turn_id = f"turn-{uuid.uuid4()}"
        result = (driver or self.driver).start_turn(
            {"agentSessionId": session.agent_session_id, "turnId": turn_id, "text": text},
            self.recorder,
        )
        completed = self.recorder.wait_completed(turn_id)
        bindings = [e for e in self.recorder.for_turn(turn_id) if "bindingJson" in e]
        session.turns.append((result["providerTurnId"], bindings[-1]["bindingJson"]))
        return result["providerTurnId"], completed | {"turnId": turn_id}

    def transcript(self, session: ClaudeSession, provider_session_id: str | None = None) -> Path:
        from drivers.claude_transcript import transcript_path

        return transcript_path(
            session.home, str(session.cwd), provider_session_id or session.provider_session_id
        )

    def fork_params(
        self,
        source: ClaudeSession,
        target_name: str,
        through: int,
        *,
        bindings: list[str | None] | None = None,
    ) -> dict[str, Any]:
        turns = source.turns[:through]
        params: dict[str, Any] = {
            "source": {
                "agentSessionId": source.agent_session_id,
                "providerSessionId": source.provider_session_id,
                "home": str(source.home),
                "cwd": str(source.cwd),
            },
            "target": {
                "agentSessionId": f"agent-{target_name}",
                "home": str(self.home(target_name)),
            },
            "providerTurnIds": [t for t, _ in turns],
            "title": f"fork {target_name}",
            "driverKind": "claude-code",
            "driverVersion": "0.2.189",
        }
        params["providerTurnBindings"] = [b for _, b in turns] if bindings is None else bindings
        return params

    def all_transcripts(self) -> list[Path]:
        return sorted(self.root.glob("runtimes/*/claude-config/projects/*/*.jsonl"))


def hold_reply(gate: threading.Event):
    def reply(body: dict[str, Any]) -> str:
        text = last_user_text(body)
        if text.startswith(SLOW_PREFIX):
            gate.wait(60)  # released by the test (or at teardown): never a timing assertion
        return f"echo: {text}"

    return reply


@pytest.fixture(scope="module")
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, gate: threading.Event) -> Iterator[Harness]:
    with MessagesServer(reply=hold_reply(gate)) as server:
        h = Harness(tmp_path_factory.mktemp("claude"), server)
        try:
            yield h
        finally:
            gate.set()
            h.driver.close()


@pytest.fixture(scope="module")
def three_turns(harness: Harness) -> ClaudeSession:
    """A source session with three completed turns: "one", "two", "three"."""
    session = harness.start("source")
    for text in ("one", "two", "three"):
        _, completed = harness.turn(session, text)
        assert completed["outcome"] == "completed", completed
    return session


@pytest.fixture
def claude_host_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon whose `claude-code` Sessions reach a fake Messages model of their own (an empty
    `tmp_path / "cwd"` made for them)."""
    with MessagesServer() as server:
        home = tmp_path / "home"
        home.mkdir()
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        (tmp_path / "cwd").mkdir()
        d = DaemonProcess(home).start()
        try:
            yield d
        finally:
            d.stop()
