"""Comments and docstrings say what the code or test checks and why, never which tracker issue
asked for it: read with `tokenize`, so only comments and docstrings count, and a string the
code compares against (a bench table's printed heading) or a name stays free to hold a number.

Covers tests/ (tests/support/ included) and the production packages; the bench's target
tables are named after their issues, so a comment may quote those names (ALLOWED)."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = (
    "agenthost",
    "actors",
    "client",
    "domain",
    "drivers",
    "protocol",
    "storage",
    "transport",
    "tutti_agent",
    "workspace",
    "model_fakes",
)

# Every spelling of a tracker reference: the word in any case, singular or plural, optional
# white space (a docstring may wrap between the word and its number) and "#", then the number
# (SAMPLE and the parametrized cases hold examples).
TRACKER = re.compile(r"\bissues?\s*#?[0-9]+", re.IGNORECASE)

# Names of bench/targets.py's tables and the headings `make bench` prints for them: a comment
# may quote them to say which table a test reads. Nothing else may carry an issue number.
ALLOWED = (
    "ISSUE20",
    "ISSUE36",
    "issue20Targets",
    "issue36Targets",
    "issue 20 targets",
    "issue 36 targets",
)

_SKIP = {tokenize.NL, tokenize.COMMENT}
_LINE_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of `source`: a docstring being any string
    that is a statement of its own (module, class, function and attribute docstrings)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    significant = [t for t in tokens if t.type not in _SKIP]
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    # The stream ends with ENDMARKER, which also ends a docstring on the file's last line.
    previous = tokenize.NEWLINE
    run: list[tokenize.TokenInfo] = []
    for tok in significant:
        if tok.type == tokenize.STRING and (run or previous in _LINE_START):
            run.append(tok)
            continue
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            for part in run:
                yield part.start[0], part.string
        run = []
        previous = tok.type


def citations(source: str) -> list[tuple[int, str]]:
    """(line, reference) of every tracker reference in a comment or docstring of `source`."""
    found: list[tuple[int, str]] = []
    if not TRACKER.search(source):
        return found  # no number anywhere: nothing to tokenize (keeps the walk fast)
    for line, text in prose(source):
        for allowed in ALLOWED:
            text = text.replace(allowed, "")
        match = TRACKER.search(text)
        if match:
            found.append((line, match.group(0)))
    return found


def _sources() -> list[Path]:
    roots = [ROOT / "tests", *(ROOT / package for package in PACKAGES)]
    return [path for root in roots for path in sorted(root.rglob("*.py"))]


SAMPLE = '''"""Module docstring (issue 20)."""
X = 1
"""Attribute docstring, Issue 15 #9."""


class C:
    """Class docstring citing issue #34."""

    def f(self) -> str:
        """A seed 000 §7 reference, kept."""
        # a comment: see ISSUE 21 §1
        return "issue 20 targets" + ISSUE20 + "issue 3"  # literals and names are data
'''


def test_every_comment_and_docstring_is_read_and_only_they_are() -> None:
    assert citations(SAMPLE) == [
        (11, "ISSUE 21"),
        (1, "issue 20"),
        (3, "Issue 15"),
        (7, "issue #34"),
    ]


def test_a_reference_wrapped_between_its_word_and_number_is_caught() -> None:
    source = '"""A refusal the host prepared for (issue\n    20), wrapped."""\n'
    assert citations(source) == [(1, "issue\n    20")]


@pytest.mark.parametrize(
    "text",
    [
        "seed 000 §8.3",
        "an issue with the lock",
        "issues",
        "the `ISSUE36` targets",
        "the printed issue 20 targets table",
    ],
)
def test_seed_references_plain_words_and_the_bench_tables_names_pass(text: str) -> None:
    assert citations(f"# {text}\n") == []


def test_tests_and_production_code_cite_no_tracker_issue_in_comments_or_docstrings() -> None:
    sources = _sources()
    assert len(sources) > 300, "tests/ or the production packages were not found"
    found = [
        f"{path.relative_to(ROOT)}:{line}: {hit}"
        for path in sources
        for line, hit in citations(path.read_text(encoding="utf-8"))
    ]
    assert found == []
