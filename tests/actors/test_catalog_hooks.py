"""The two forkability hooks of the catalog (seed 000 §3.2): capability is the driver's attested
verdict only, and one per-Turn function decides both the projected binding state and what
prepare accepts (tests/daemon/test_fork_contract.py and tests/claude run them end to end)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from actors.ports import BindingState
from agenthost import projection
from agenthost.catalog import Catalog
from drivers.claude_transcript import encode_binding
from storage.models import Session


@pytest.mark.parametrize(
    ("provider", "context", "capable"),
    [
        # An unpinned Claude SDK: the driver says no, whatever the version string.
        (
            "claude-code",
            {
                "driverKind": "claude-code",
                "driverVersion": "9.9.9",
                "forkThroughTurn": False,
                "binderAvailable": True,
            },
            False,
        ),
        # A wrong brand above every version gate: the driver's verdict is no.
        (
            "tutti-agent",
            {
                "driverKind": "tutti-agent",
                "driverVersion": "0.200.0",
                "forkThroughTurn": False,
                "binderAvailable": True,
            },
            False,
        ),
        # No binder attested: not capable.
        (
            "codex",
            {"driverKind": "codex", "driverVersion": "0.171.0", "forkThroughTurn": True},
            False,
        ),
        # Another provider's attestation never counts.
        (
            "codex",
            {
                "driverKind": "tutti-agent",
                "driverVersion": "0.171.0",
                "forkThroughTurn": True,
                "binderAvailable": True,
            },
            False,
        ),
        (
            "tutti-agent",
            {
                "driverKind": "tutti-agent",
                "driverVersion": "0.0.10",
                "forkThroughTurn": True,
                "binderAvailable": True,
            },
            True,
        ),
    ],
)
def test_capability_is_the_attested_verdict_only(
    provider: str, context: dict[str, object], capable: bool
) -> None:
    assert Catalog().fork_through_turn_capable(provider, context) is capable


@pytest.mark.parametrize(
    ("binding", "state"),
    [
        (encode_binding("m-1"), BindingState.BOUND),
        ('{"checkpointMessageId": "m-1", "schemaVersion": 99}', BindingState.RECOVERY_REQUIRED),
        ("{}", BindingState.RECOVERY_REQUIRED),
        (None, BindingState.RECOVERY_REQUIRED),
    ],
)
def test_claude_turn_state_and_prepare_verdict_are_one_function(
    binding: str | None, state: BindingState
) -> None:
    catalog = Catalog()
    assert catalog.binding_state("claude-code", "root-1", binding) is state
    assert catalog.turn_forkable("claude-code", "root-1", binding) is (state is BindingState.BOUND)


class _Counting(Catalog):
    """The real catalog, counting how often a projection reads the attestation."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def fork_through_turn_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        self.asked += 1
        return super().fork_through_turn_capable(provider, runtime_context)


class _TwoHooks:
    """A catalog with only the protocol's hooks (no `fork_capabilities`): asked each."""

    def __init__(self, through: bool, full: bool) -> None:
        self.through, self.full = through, full

    def fork_through_turn_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        return self.through

    def fork_full_session_capable(self, provider: str, runtime_context: Mapping[str, Any]) -> bool:
        return self.full


def _session(provider: str, context: Mapping[str, Any], kind: str = "root") -> Session:
    return Session(
        workspace_id="ws",
        session_id="s-1",
        kind=kind,
        provider=provider,
        provider_session_id=None,
        title="t",
        cwd="/",
        settings={},
        runtime_context=context,
        model=None,
        pinned=False,
        deleted=False,
        goal=None,
        active_turn_id=None,
        parent_session_id=None,
        parent_turn_id=None,
        created_at_ms=0,
        updated_at_ms=0,
        lineage=None,
    )


_ATTESTED = {
    "driverKind": "tutti-agent",
    "forkThroughTurn": True,
    "binderAvailable": True,
}


@pytest.mark.parametrize(
    ("provider", "context"),
    [
        ("tutti-agent", _ATTESTED),
        ("codex", {**_ATTESTED, "driverKind": "codex"}),
        ("claude-code", {**_ATTESTED, "driverKind": "claude-code", "forkThroughTurn": False}),
        ("codex", _ATTESTED),  # another brand's attestation
        ("tutti-agent", {**_ATTESTED, "binderAvailable": False}),
    ],
)
def test_a_session_projection_reads_the_attestation_once(
    provider: str, context: dict[str, object]
) -> None:
    """The projection's `lifecycleCapabilities` are the two hooks' verdicts, from one reading
    of the attestation (it read it twice: through-Turn, then full-Session, which asks
    through-Turn again); a child shows neither and reads nothing."""
    catalog = _Counting()
    caps = projection.session(_session(provider, context), catalog)["lifecycleCapabilities"]
    through = Catalog().fork_through_turn_capable(provider, context)
    full = Catalog().fork_full_session_capable(provider, context)
    assert caps == {"fork": full, "forkThroughTurn": through, "forkFullSession": full}
    assert catalog.fork_capabilities(provider, context) == (through, full)
    assert catalog.asked == 2  # the projection's one, and the line above
    child = projection.session(_session(provider, context, kind="child"), catalog)
    assert child["lifecycleCapabilities"] == {
        "fork": False,
        "forkThroughTurn": False,
        "forkFullSession": False,
    }
    assert catalog.asked == 2


@pytest.mark.parametrize(("through", "full"), [(True, False), (False, True), (True, True)])
def test_a_catalog_without_both_at_once_is_asked_each(through: bool, full: bool) -> None:
    caps = projection.session(
        _session("tutti-agent", _ATTESTED), cast(Any, _TwoHooks(through, full))
    )
    assert caps["lifecycleCapabilities"] == {
        "fork": full,
        "forkThroughTurn": through,
        "forkFullSession": full,
    }
