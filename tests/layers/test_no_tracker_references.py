"""Code and the user-facing docs say what is and why, never which tracker issue asked for it:
an issue number belongs in a commit message or docs/performance.md (a measurement log), and
in code it only sends a reader to a page they may not have. Seed references stay (the spec)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The production packages: the Makefile's `lint` target checks the same ones.
PACKAGES = (
    "domain",
    "storage",
    "actors",
    "transport",
    "drivers",
    "tutti_agent",
    "agenthost",
    "client",
    "model_fakes",
    "workspace",
    "protocol",
)

# docs/performance.md and docs/reliability.md are measurement logs and may cite issues.
USER_DOCS = (
    "README.md",
    "docs/user-guide.md",
    "docs/protocol.md",
    "docs/client.md",
    "docs/providers.md",
    "docs/tutti-agent.md",
)

TRACKER = re.compile(r"[Ii]ssue #?[0-9]+")


def _citations(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), start=1):
            if TRACKER.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def _user_docs() -> list[Path]:
    return [ROOT / name for name in USER_DOCS] + sorted((ROOT / "docs" / "design").glob("*.md"))


@pytest.mark.parametrize(
    "text",
    ["(issue 20 rows 5-7: …)", "issue 21 §1", "Issue 15 #9", "see issue #34", "Issue 3."],
)
def test_the_pattern_catches_each_way_the_tracker_was_cited(text: str) -> None:
    assert TRACKER.search(text)


@pytest.mark.parametrize("text", ["seed 000 §8.3", "an issue with the lock", "issues"])
def test_the_pattern_leaves_seed_references_and_plain_words_alone(text: str) -> None:
    assert not TRACKER.search(text)


def test_production_code_cites_no_tracker_issue() -> None:
    sources = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(sources) > 100, "the production packages were not found"
    assert _citations(sources) == []


def test_user_facing_docs_cite_no_tracker_issue() -> None:
    docs = _user_docs()
    missing = [str(path.relative_to(ROOT)) for path in docs if not path.is_file()]
    assert missing == [], "a user-facing doc moved: update USER_DOCS"
    assert len(docs) > len(USER_DOCS), "docs/design/*.md were not found"
    assert _citations(docs) == []
