"""docs/user-guide.md's Makefile table is the Makefile: a row for every target it declares
phony and for no other, every variable a user may set (`VAR ?= …`) named in it, and every
`make TARGET` the user docs show is a target."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
GUIDE = (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8")
USER_DOCS = ("README.md", "docs/user-guide.md", "docs/client.md", "docs/providers.md")


def _targets() -> set[str]:
    phony = re.search(r"^\.PHONY:(.*)$", MAKEFILE, re.M)
    assert phony is not None
    return set(phony.group(1).split())


def _table() -> str:
    return GUIDE.split("\n| target | what it does |\n", 1)[1].split("\n\n", 1)[0]


def test_the_table_has_a_row_for_every_target_and_no_other() -> None:
    rows = set(re.findall(r"^\| `make ([a-z-]+)` \|", _table(), re.M))
    assert rows == _targets()


def test_every_variable_a_user_may_set_is_in_the_table() -> None:
    settable = set(re.findall(r"^([A-Z_]+) \?=", MAKEFILE, re.M))
    assert {"PROVIDER", "PYTEST_ARGS"} <= settable
    named = set(re.findall(r"`([A-Z_]+)=", _table()))
    # BENCH_ARGS is read without a default (`$(BENCH_ARGS)`): settable all the same.
    assert settable | {"BENCH_ARGS"} == named


def test_every_make_command_the_docs_show_is_a_target() -> None:
    shown = {
        target
        for name in USER_DOCS
        for target in re.findall(r"`make ([a-z-]+)", (ROOT / name).read_text(encoding="utf-8"))
    }
    assert len(shown) > 5, shown
    assert shown <= _targets()
