"""A wire method's or event's name is spelled only in protocol/: every other production module
reaches it through the table (`protocol.methods`, `protocol.events`), so renaming one is a
change to one file and a reader finds every caller by its constant.

The host↔worker pipe is a different, internal wire whose method names partly coincide with
the public ones (`turn.interrupt`, `interaction.respond`, `debug.failpoints`): its two ends,
the worker process (drivers/) and the host's typed worker messages (domain/worker_messages.py),
are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

from protocol.events import EVENT_TYPES
from protocol.methods import METHODS

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = (
    "agenthost",
    "client",
    "transport",
    "actors",
    "domain",
    "storage",
    "workspace",
    "tutti_agent",
    "model_fakes",
    "drivers",
)
INTERNAL_WIRE = ("drivers/", "domain/worker_messages.py")
NAMES = set(METHODS) | set(EVENT_TYPES)


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string constant in `source` that is a wire method or event."""
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES
    )


def test_the_scan_finds_a_spelled_name() -> None:
    sample = 'client.call("fork.create", {})\nkind = "turn.updated"\nSESSION_GET = 1\n'
    assert spelled_names(sample) == [(1, "fork.create"), (2, "turn.updated")]


def test_no_production_module_outside_protocol_spells_a_wire_name() -> None:
    found: list[str] = []
    scanned = 0
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(INTERNAL_WIRE):
                continue
            scanned += 1
            found += [f"{rel}:{line}: {name!r}" for line, name in spelled_names(path.read_text())]
    assert scanned > 100
    assert not found, "spelled outside protocol/ (use its constant):\n" + "\n".join(found)
