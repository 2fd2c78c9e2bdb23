"""The provider catalog: which providers exist, how each binds a fork child's provider state,
and the two forkability hooks (seed 000 §3.2).

Capability is the exact Session's persisted driver attestation — its own verdict on brand,
version gate, SDK pin and binder availability (`forkThroughTurn`, `binderAvailable`) — and
nothing else: the Host never re-derives it from the provider's name or a version number.
A Turn's forkability is one per-provider function (`binding_state`) that decides both the
projected `providerForkBindingState` and what `fork.create` accepts (`turn_forkable`); for
Claude it is the driver's own binding decoder, `schemaVersion` check included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.ports import BindingState, DriverInfo
from domain.providers import CLAUDE_CODE, CODEX, PROVIDERS, TUTTI_AGENT
from drivers.claude_transcript import decode_binding

# Drivers whose attestation declares `forkFullSession` (drivers/app_server, drivers/claude).
FULL_SESSION_DRIVERS = frozenset({TUTTI_AGENT, CODEX, CLAUDE_CODE})

# One entry per provider of the one list (domain.providers), in its order.
_INFO = {
    TUTTI_AGENT: DriverInfo(TUTTI_AGENT, "host_copy", True, "tutti-agent-home"),
    CODEX: DriverInfo(CODEX, "host_copy", True, "codex-home"),
    CLAUDE_CODE: DriverInfo(CLAUDE_CODE, "provider_owned", True, "claude-config"),
}
assert tuple(_INFO) == PROVIDERS


class Catalog:
    def __init__(self, overrides: Mapping[str, DriverInfo] | None = None) -> None:
        self._info = {**_INFO, **(overrides or {})}

    def providers(self) -> tuple[str, ...]:
        return tuple(self._info)

    def driver_info(self, provider: str) -> DriverInfo:
        return self._info[provider]

    def fork_through_turn_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        """The driver's attested verdict, persisted with the runtime context at session start
        and re-checked at dispatch: only an explicit `true` for both counts."""
        return (
            runtime_context.get("driverKind") == provider  # never another brand's attestation
            and runtime_context.get("forkThroughTurn") is True
            and runtime_context.get("binderAvailable") is True
        )

    def fork_full_session_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        """Full-Session fork cuts at the newest settled Turn with the same
        verified mechanism, so a driver declares it (`forkFullSession` in its attestation,
        re-checked at dispatch) only where the child's history is proven equal to the
        canonical prefix: the exact-prefix `thread/fork` gates and Claude's pinned SDK."""
        return provider in FULL_SESSION_DRIVERS and self.fork_through_turn_capable(
            provider, runtime_context
        )

    def fork_capabilities(
        self, provider: str, runtime_context: Mapping[str, Any]
    ) -> tuple[bool, bool]:
        """`(fork_through_turn_capable, fork_full_session_capable)` from one reading of the
        attestation: what a Session's projection shows (`lifecycleCapabilities`), asked once
        per projection instead of twice (the full-Session verdict is the through-Turn
        one for a driver that declares it)."""
        through = self.fork_through_turn_capable(provider, runtime_context)
        return through, through and provider in FULL_SESSION_DRIVERS

    def binding_state(
        self, provider: str, root_provider_turn_id: str | None, binding_json: str | None
    ) -> BindingState:
        if not root_provider_turn_id:
            return BindingState.UNAVAILABLE
        if provider != "claude-code":
            return BindingState.BOUND
        # Claude: only a real checkpoint in the adapter's JSON (its schemaVersion included)
        # binds the Turn; anything else needs the one-time transcript recovery.
        if decode_binding(binding_json) is not None:
            return BindingState.BOUND
        return BindingState.RECOVERY_REQUIRED

    def turn_forkable(
        self, provider: str, root_provider_turn_id: str | None, binding_json: str | None
    ) -> bool:
        """What `fork.create` accepts for the selected Turn: exactly what the projection
        shows as `providerForkBindingState == "bound"`."""
        return self.binding_state(provider, root_provider_turn_id, binding_json) is (
            BindingState.BOUND
        )
