"""Version gates parsed from the app-server userAgent (seed 000 §3.2)."""

from __future__ import annotations

import pytest

from drivers.versions import CODEX_GATE, TUTTI_AGENT_GATE, GateVerdict, UserAgent, Version


@pytest.mark.parametrize(
    ("ua", "verdict"),
    [
        ("tutti_agent/0.0.10 (Linux; x86_64)", GateVerdict.SUPPORTED),
        ("tutti_agent/0.1.0 (Linux; x86_64)", GateVerdict.SUPPORTED),
        ("tutti_agent/0.0.11-alpha.2 (Linux; x86_64)", GateVerdict.SUPPORTED),
        ("tutti_agent/0.0.9 (Linux; x86_64)", GateVerdict.TOO_OLD),
        ("tutti_agent/0.0.10-rc.1 (Linux)", GateVerdict.TOO_OLD),  # a pre-release precedes 0.0.10
        ("codex/0.171.0 (Debian 12.0.0; x86_64)", GateVerdict.WRONG_BRAND),
        ("", GateVerdict.UNPARSABLE),
        ("tutti_agent/latest (Linux)", GateVerdict.UNPARSABLE),
    ],
)
def test_tutti_agent_gate(ua: str, verdict: GateVerdict) -> None:
    assert TUTTI_AGENT_GATE.check(ua).verdict is verdict


@pytest.mark.parametrize(
    ("ua", "verdict"),
    [
        ("acc/0.171.0 (Debian 12.0.0; x86_64) xterm (acc; 0.0.1)", GateVerdict.SUPPORTED),
        ("codex/0.144.0 (Linux)", GateVerdict.SUPPORTED),
        ("codex-cli 0.171.0", GateVerdict.SUPPORTED),
        ("codex/0.172.0-alpha.3 (Linux)", GateVerdict.SUPPORTED),
        ("codex/0.143.9 (Linux)", GateVerdict.TOO_OLD),
        ("tutti_agent/0.171.0 (Linux)", GateVerdict.WRONG_BRAND),
        ("", GateVerdict.UNPARSABLE),
    ],
)
def test_codex_gate(ua: str, verdict: GateVerdict) -> None:
    assert CODEX_GATE.check(ua).verdict is verdict


def test_version_is_the_token_after_the_first_slash() -> None:
    assert UserAgent.parse("acc/0.171.0 (Debian; x86_64) xterm (acc; 0.0.1)") == UserAgent(
        "acc", "0.171.0"
    )
    assert TUTTI_AGENT_GATE.check("tutti_agent/0.2.0 (x)").version == "0.2.0"


def test_semver_precedence_orders_prereleases_below_their_release() -> None:
    parse = Version.parse
    assert parse("1.0.0-alpha") < parse("1.0.0-alpha.1") < parse("1.0.0-beta")  # type: ignore[operator]
    assert parse("1.0.0-beta.2") < parse("1.0.0-beta.11") < parse("1.0.0")  # type: ignore[operator]
    assert parse("nope") is None
