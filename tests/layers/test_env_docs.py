"""Every environment variable agenthost reads is documented where a user looks for it: the
`AGENTHOST_*` ones the daemon, the workers and the client read in docs/user-guide.md's
"Environment variables" table (and no variable there that nothing reads); the Tutti Agent's
`TUTTI_AGENT_*` ones and every `tutti-agent app-server` option in docs/tutti-agent.md's
settings table."""

from __future__ import annotations

import re
from pathlib import Path

from tutti_agent.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "agenthost",
    "client",
    "domain",
    "storage",
    "actors",
    "transport",
    "drivers",
    "tutti_agent",
    "workspace",
    "protocol",
)
"""What the daemon, its workers, the providers we ship and the client run (not tests/, bench/
or model_fakes/)."""


def _named(prefix: str, paths: list[Path]) -> set[str]:
    """Every variable a quoted string names in these files (`"AGENTHOST_HOME"`): the reads, and
    the constants they read through."""
    pattern = re.compile(rf"[\"']({prefix}[A-Z0-9_]+)[\"']")
    return {n for p in paths for n in pattern.findall(p.read_text(encoding="utf-8"))}


def _sources(*roots: str) -> list[Path]:
    return [p for root in roots for p in (ROOT / root).rglob("*.py")]


def _guide_section() -> tuple[set[str], str]:
    """The table's variables, and the text after it (the test suite's own)."""
    guide = (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8")
    section = guide.split("\n### Environment variables\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.split(" | ", 1)[0] for line in section.splitlines() if line.startswith("| `")]
    table = set(re.findall(r"`(AGENTHOST_[A-Z0-9_]+)`", "\n".join(cells)))
    return table, section[section.rindex("\n|") :].split("\n", 2)[2]


def test_every_variable_agenthost_reads_is_in_the_guide_and_no_other() -> None:
    read = _named("AGENTHOST_", _sources(*PACKAGES))
    assert len(read) > 10, read
    table, _ = _guide_section()
    assert read == table, {"not documented": read - table, "read by nothing": table - read}


def test_the_test_suites_variables_are_named_and_read_by_tests() -> None:
    _, after = _guide_section()
    named = set(re.findall(r"`(AGENTHOST_[A-Z0-9_]+)`", after))
    in_tests = _named("AGENTHOST_", _sources("tests"))
    assert named and named <= in_tests
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    table, _ = _guide_section()
    assert set(re.findall(r"AGENTHOST_[A-Z0-9_]+", makefile)) <= named | table


def test_every_tutti_agent_setting_is_in_its_settings_table() -> None:
    doc = (ROOT / "docs" / "tutti-agent.md").read_text(encoding="utf-8")
    table = "\n".join(line for line in doc.split("\n## ", 1)[0].splitlines() if line[:3] == "| `")
    variables = _named("TUTTI_AGENT_", _sources("tutti_agent"))
    assert len(variables) > 5, variables
    assert variables <= set(re.findall(r"`(TUTTI_AGENT_[A-Z_]+)`", table))
    app_server = build_parser()._subparsers._group_actions[0].choices["app-server"]  # type: ignore[union-attr]  # noqa: SLF001
    options = {o for a in app_server._actions for o in a.option_strings} - {"--help", "-h"}  # noqa: SLF001
    assert options <= set(re.findall(r"`(--[a-z-]+)", table))
