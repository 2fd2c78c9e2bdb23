"""The typed host↔worker calls besides fork and fork.resolve (`domain.fork_messages`,
`domain.resolve_messages`): a runtime's attestation, a Session's start, stop and provider
history, a Turn's start and interrupt, an Interaction's answer. Standard library only.

Each request type names its worker method (`METHOD`) and converts to the params map the link
carries (`to_wire`); each answer is read back once at the host (`from_wire`). The maps are
the ones internals.md pins ("Worker methods"), key for key: the wire does not change. A
runtime context (a driver's attested verdict) is the driver's own record, persisted as given:
it stays a map inside its typed answer, as a fork's binding receipt does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from domain.fork_messages import MalformedMessage

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _map(value: Any, name: str) -> Mapping[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise MalformedMessage(f"{name} must be a map, not {type(value).__name__}")
    return value


def _generation(value: Any) -> str | None:
    """A runtime generation: anything but a non-empty string is none (the host then
    re-attests before the next fork)."""
    return value if isinstance(value, str) and value else None


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


@dataclass(frozen=True, slots=True)
class RuntimeStamp:
    """What a worker adds to the answer of a call that carries a verdict, when the runtime it
    came from was live before and after the call: its generation, the pid of its process and
    how long the driver keeps it idle (the host reuses it for a fork within that window)."""

    generation: str | None = None
    pid: int | None = None
    idle_s: float | None = None

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> RuntimeStamp:
        pid = _positive(result.get("runtimePid"))
        return cls(
            generation=_generation(result.get("runtimeGeneration")),
            pid=None if pid is None else int(pid),
            idle_s=_positive(result.get("runtimeIdleS")),
        )

    KEYS: ClassVar[frozenset[str]] = frozenset({"runtimeGeneration", "runtimePid", "runtimeIdleS"})


@dataclass(frozen=True, slots=True)
class RuntimeAttest:
    """`runtime.attest`: the dispatch-time re-attestation of a Session's prepared runtime."""

    METHOD: ClassVar[str] = "runtime.attest"

    agent_session_id: str
    home: str
    cwd: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "agentSessionId": self.agent_session_id,
            "home": self.home,
            "cwd": self.cwd,
            "settings": dict(self.settings),
        }


@dataclass(frozen=True, slots=True)
class Attestation:
    """The answer to `runtime.attest`: the driver's verdict (`driverKind`, `driverVersion`,
    `bindingMode`, `binderAvailable`, `forkThroughTurn`, …) and the runtime's stamp."""

    verdict: Mapping[str, Any]
    stamp: RuntimeStamp = RuntimeStamp()

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> Attestation:
        verdict = {k: v for k, v in result.items() if k not in RuntimeStamp.KEYS}
        return cls(verdict, RuntimeStamp.from_wire(result))


@dataclass(frozen=True, slots=True)
class SessionStart:
    """`session.start`: start or resume a Session's provider runtime on its own home."""

    METHOD: ClassVar[str] = "session.start"

    agent_session_id: str
    home: str
    cwd: str
    settings: Mapping[str, Any]
    model: str | None
    provider_session_id: str | None
    runtime_context: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {
            "agentSessionId": self.agent_session_id,
            "home": self.home,
            "cwd": self.cwd,
            "settings": dict(self.settings),
            "model": self.model,
            "providerSessionId": self.provider_session_id,
            "runtimeContext": dict(self.runtime_context),
        }


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The answer to `session.start`: the provider's session id, the runtime context to
    persist (the attested verdict and what the driver adds), and the runtime's stamp."""

    provider_session_id: str
    runtime_context: Mapping[str, Any]
    stamp: RuntimeStamp = RuntimeStamp()

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> SessionStarted:
        return cls(
            provider_session_id=str(result.get("providerSessionId") or ""),
            runtime_context=dict(_map(result.get("runtimeContext"), "runtimeContext")),
            stamp=RuntimeStamp.from_wire(result),
        )


@dataclass(frozen=True, slots=True)
class SessionStop:
    """`session.stop`: stop the Session's provider runtime (it respawns at the next use)."""

    METHOD: ClassVar[str] = "session.stop"

    agent_session_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"agentSessionId": self.agent_session_id}


@dataclass(frozen=True, slots=True)
class HistoryRequest:
    """`session.history`: the provider's own Turns of the Session, in its order."""

    METHOD: ClassVar[str] = "session.history"

    agent_session_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"agentSessionId": self.agent_session_id}


@dataclass(frozen=True, slots=True)
class HistoryTurn:
    """One provider Turn: its id, status, the user's text and (Claude Code) its binding."""

    provider_turn_id: str
    status: str = ""
    user_text: str | None = None
    binding_json: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"providerTurnId": self.provider_turn_id, "status": self.status}
        out["userText"] = self.user_text
        if self.binding_json is not None:
            out["bindingJson"] = self.binding_json
        return out


@dataclass(frozen=True, slots=True)
class SessionHistory:
    """The answer to `session.history`."""

    turns: tuple[HistoryTurn, ...]

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> SessionHistory:
        raw = result.get("turns") or []
        if not isinstance(raw, (list, tuple)):
            raise MalformedMessage("turns must be a list")
        turns = []
        for item in raw:
            entry = _map(item, "a history turn")
            text, binding = entry.get("userText"), entry.get("bindingJson")
            turns.append(
                HistoryTurn(
                    provider_turn_id=str(entry.get("providerTurnId") or ""),
                    status=str(entry.get("status") or ""),
                    user_text=text if isinstance(text, str) else None,
                    binding_json=binding if isinstance(binding, str) and binding else None,
                )
            )
        return cls(tuple(turns))


@dataclass(frozen=True, slots=True)
class TurnStart:
    """`turn.start`: run a Turn. With `runtime_generation` (and `home`) it goes to that warm
    runtime only: the worker refuses it (`runtime_changed`) if another one is live."""

    METHOD: ClassVar[str] = "turn.start"

    agent_session_id: str
    turn_id: str
    text: str
    home: str | None = None
    runtime_generation: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "agentSessionId": self.agent_session_id,
            "turnId": self.turn_id,
            "text": self.text,
        }
        if self.runtime_generation is not None:
            out.update(home=self.home, runtimeGeneration=self.runtime_generation)
        return out


@dataclass(frozen=True, slots=True)
class TurnAccepted:
    """The answer to `turn.start`: the provider's id of the Turn (its events follow)."""

    provider_turn_id: str

    @classmethod
    def from_wire(cls, result: Mapping[str, Any]) -> TurnAccepted:
        return cls(str(result.get("providerTurnId") or ""))


@dataclass(frozen=True, slots=True)
class TurnInterrupt:
    """`turn.interrupt`: stop the Session's running provider Turn."""

    METHOD: ClassVar[str] = "turn.interrupt"

    agent_session_id: str
    provider_turn_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"agentSessionId": self.agent_session_id, "providerTurnId": self.provider_turn_id}


@dataclass(frozen=True, slots=True)
class InteractionRespond:
    """`interaction.respond`: the answer to a pending Interaction (`{decision}` for an
    approval, `{text}` for a question; the driver checks which)."""

    METHOD: ClassVar[str] = "interaction.respond"

    agent_session_id: str
    request_id: str
    response: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {
            "agentSessionId": self.agent_session_id,
            "requestId": self.request_id,
            "response": dict(self.response),
        }
