"""A Claude Code CLI that misbehaves on its stdout, through the real daemon: the SDK's bundled
`claude` behind the soaks' relay in its stream-json dialect (`provider_chaos.claude_front`)
writes one endless line, lines the SDK skips (`garbage`), what it cannot read on from
(`notobject`: wrong-shaped messages, bytes that are not UTF-8), or closes its stdout at the
Turn's prompt or once the Turn started. Each round is judged by the soaks' law,
`provider_fault_settles`, Claude's row: the Turn settles in its bound, `failed
provider_protocol_error` where the SDK cannot read on (the CLI killed), `completed` where it
skips the lines; the next Turn completes on a new CLI; the worker's memory stays bounded.

Was: the endless line and the unreadable messages failed the Turn untyped (`CLIJSONDecodeError`,
`UnicodeDecodeError`, an `AttributeError` of the driver's own), and a closed stdout left the
Turn active for good (the SDK waits for the CLI's exit after its stdout ends) or, mid-Turn,
failed `model_timeout` 30 s on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.provider_chaos import (
    CLAUDE,
    FAULTS,
    ProviderChaos,
    claude_front,
    relay_table,
)
from tests.reliability.reliability_harness import provider_env
from tests.support.daemon import DaemonProcess
from tests.support.invariants import CLAUDE_BREAKING_FAULTS

pytestmark = [pytest.mark.timeout(300)]


@pytest.mark.parametrize("stopped_limit", [None, 2], ids=["default", "stopped-2s"])
def test_every_stdout_fault_of_a_claude_cli_settles_as_the_law_says(
    tmp_path: Path, stopped_limit: int | None
) -> None:
    arms = tmp_path / "arms"
    config = (
        "" if stopped_limit is None else f"[daemon]\nprovider_stopped_seconds = {stopped_limit}\n"
    )
    with provider_env(
        CLAUDE,
        tmp_path / "home",
        config=config + relay_table(arms),
        commands={CLAUDE: claude_front(arms)},
    ) as cwd:
        chaos = ProviderChaos(arms, 0)
        d = DaemonProcess(tmp_path / "home").start()
        try:
            c = d.client(timeout=60)
            chaos.setup(c, str(cwd))
            claude = [sid for sid in chaos.sids if chaos.providers[sid] == CLAUDE]
            assert len(claude) == 1, chaos.providers
            chaos.sids, chaos.providers = claude, {claude[0]: CLAUDE}  # its rounds only
            for fault in FAULTS:
                chaos.next_fault = FAULTS.index(fault)
                assert chaos.round(c, lambda: 0) is not None, chaos.summary()
            violations = chaos.check(c)
        finally:
            d.stop()
    summary = chaos.summary()
    assert violations == [], (violations, summary)
    assert [f.fault for f in chaos.faults] == list(FAULTS), summary
    assert all(f.provider == CLAUDE and not f.disturbed for f in chaos.faults), chaos.faults
    for fault in FAULTS:
        said = (
            "failed provider_protocol_error"
            if fault in CLAUDE_BREAKING_FAULTS
            else "completed None"
        )
        assert chaos.calls[f"claude-code {fault} {said}"] == 1, summary
