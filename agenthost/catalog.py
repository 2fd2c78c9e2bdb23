"""The provider catalog: which providers exist, how each binds a fork child's provider state,
the version gates for `forkThroughTurn`, and how a Turn's binding projects.

Capability comes from the exact Session's persisted attestation (driver kind + version),
never from the provider's name alone (seed 000 §3.2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from actors.ports import BindingState, DriverInfo
from drivers.versions import CODEX_MIN, TUTTI_AGENT_MIN, Version

# First versions whose app-server `thread/fork` takes `lastTurnId` (inclusive).
FORK_GATES: dict[str, Version] = {"tutti-agent": TUTTI_AGENT_MIN, "codex": CODEX_MIN}

# Drivers whose attestation declares `forkFullSession` (drivers/tutti_agent.py, claude.py).
FULL_SESSION_DRIVERS = frozenset({"tutti-agent", "codex", "claude-code"})

_INFO = {
    "tutti-agent": DriverInfo("tutti-agent", "host_copy", True, "tutti-agent-home"),
    "codex": DriverInfo("codex", "host_copy", True, "codex-home"),
    "claude-code": DriverInfo("claude-code", "provider_owned", True, "claude-config"),
}


class Catalog:
    def __init__(self, overrides: Mapping[str, DriverInfo] | None = None) -> None:
        self._info = {**_INFO, **(overrides or {})}

    def providers(self) -> tuple[str, ...]:
        return tuple(self._info)

    def driver_info(self, provider: str) -> DriverInfo:
        return self._info[provider]

    def fork_through_turn_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        kind = runtime_context.get("driverKind")
        if kind != provider:
            return False  # no attestation yet, or a different brand: never assume
        if provider == "claude-code":
            # Structural: the pinned SDK is the attested driver.
            return bool(runtime_context.get("driverVersion"))
        gate = FORK_GATES.get(provider)
        version = Version.parse(str(runtime_context.get("driverVersion") or ""))
        return gate is not None and version is not None and version >= gate

    def fork_full_session_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        """Full-Session fork (issue 21 §2) cuts at the newest settled Turn with the same
        verified mechanism, so a driver declares it (`forkFullSession` in its attestation,
        re-checked at dispatch) only where the child's history is proven equal to the
        canonical prefix: the exact-prefix `thread/fork` gates and Claude's pinned SDK."""
        return provider in FULL_SESSION_DRIVERS and self.fork_through_turn_capable(
            provider, runtime_context
        )

    def binding_state(
        self, provider: str, root_provider_turn_id: str | None, binding_json: str | None
    ) -> BindingState:
        if not root_provider_turn_id:
            return BindingState.UNAVAILABLE
        if provider != "claude-code":
            return BindingState.BOUND
        # Claude: only a real checkpoint in the adapter's JSON binds the Turn; a legacy row
        # with an id but no checkpoint needs the one-time transcript recovery.
        try:
            data = json.loads(binding_json) if binding_json else {}
        except ValueError:
            return BindingState.RECOVERY_REQUIRED
        if isinstance(data, dict) and data.get("checkpointMessageId"):
            return BindingState.BOUND
        return BindingState.RECOVERY_REQUIRED
