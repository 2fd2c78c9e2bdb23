"""The two forkability hooks of the catalog (seed 000 §3.2): capability is the driver's attested
verdict only, and one per-Turn function decides both the projected binding state and what
prepare accepts (tests/daemon/test_fork_contract.py and tests/claude run them end to end)."""

from __future__ import annotations

import pytest

from actors.ports import BindingState
from agenthost.catalog import Catalog
from drivers.claude_transcript import encode_binding


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
