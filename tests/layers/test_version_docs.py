"""The pinned provider versions are one each: the Makefile's, `agenthost providers install`'s,
pyproject's extra and every one the user docs name."""

from __future__ import annotations

import re
from pathlib import Path

from agenthost.provider_install import CODEX_VERSION
from drivers.claude.env import PINNED_SDK_VERSION

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/user-guide.md", "docs/providers.md", "docs/client.md")
VERSION = r"(\d+\.\d+\.\d+)"


def test_every_pin_of_codex_and_the_claude_sdk_is_the_same_version() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.findall(rf"^CODEX_VERSION := {VERSION}$", makefile, re.M) == [CODEX_VERSION]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert set(re.findall(rf"claude-agent-sdk=={VERSION}", pyproject)) == {PINNED_SDK_VERSION}
    text = "\n".join((ROOT / name).read_text(encoding="utf-8") for name in DOCS)
    codex = set(re.findall(rf"(?:[Cc]odex |@openai/codex@){VERSION}", text))
    sdk = set(re.findall(rf"claude-agent-sdk(?:==| ){VERSION}", text))
    assert codex == {CODEX_VERSION}
    assert sdk == {PINNED_SDK_VERSION}
