"""docs/tutti-agent.md's table of the built-in model's directives is the model's: a row for
each directive it obeys, and none for a directive it does not know."""

from __future__ import annotations

import re
from pathlib import Path

from tutti_agent import model

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "tutti-agent.md").read_text(encoding="utf-8")


def test_the_directive_table_is_every_directive_of_the_built_in_model() -> None:
    section = DOC.split("\n## The built-in model and its directives\n", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `/([a-z]+)[ `]", section, re.M))
    known = {name for name in model._DIRECTIVES if model.parse_directive(f"/{name} x")}  # noqa: SLF001
    assert len(known) > 5, known
    assert rows == known
