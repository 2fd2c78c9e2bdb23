"""The protocol table (`protocol.methods.METHODS`) is the contract docs/protocol.md states: the
same method names, every one of them served by the daemon, and no client calling a method the
table does not have."""

from __future__ import annotations

import re
from pathlib import Path

from protocol import methods
from protocol.events import EVENT_SHAPES, EVENT_TYPES
from protocol.methods import COMMON_ERRORS, METHODS, Method

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")


def _documented_methods() -> set[str]:
    """The first column of the method tables under "## Methods" (`a` / `b` rows name two)."""
    section = DOC.split("\n## Methods", 1)[1].split("\n## Objects", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        cell = line.split("|")[1] if line.startswith("| `") else ""
        names.update(re.findall(r"`([a-z]+\.[A-Za-z]+)`", cell))
    return names


def test_the_table_names_exactly_the_documented_methods() -> None:
    assert set(METHODS) == _documented_methods()


def test_every_method_of_the_table_is_served_by_the_daemon() -> None:
    api = (ROOT / "agenthost" / "api.py").read_text(encoding="utf-8")
    bound = re.findall(r"bind\(([A-Z_]+), self\.", api)
    served = {getattr(methods, name).name for name in bound}
    assert set(METHODS) == served


def test_no_client_calls_a_method_outside_the_table() -> None:
    called: set[str] = set()
    pattern = re.compile(
        r"(?:call|call_raw|submit|request|_call|_submit)\(\s*(?:[a-z_.]+,\s*)*([A-Z_]+)[,)]"
    )
    for path in [*(ROOT / "client").rglob("*.py"), *(ROOT / "transport").rglob("*.py")]:
        called.update(pattern.findall(path.read_text(encoding="utf-8")))
    assert called, "the scan found no call at all"
    constants = {name for name in called if isinstance(getattr(methods, name, None), Method)}
    assert len(constants) > 10, called
    assert {getattr(methods, name) for name in constants} <= set(METHODS.values())


def test_documented_error_reasons_and_events_are_in_the_tables() -> None:
    errors = DOC.split("\n## Errors", 1)[1].split("\n## Events", 1)[0]
    methods = DOC.split("\n## Methods", 1)[1].split("\n## Objects", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)`", errors + methods))
    declared = {r for m in METHODS.values() for r in m.errors} | set(COMMON_ERRORS)
    # Every reason a method declares is one docs/protocol.md documents.
    assert declared <= documented, declared - documented
    events = DOC.split("\n## Events (PUB)", 1)[1].split("\n## ", 1)[0]
    for event in EVENT_TYPES:
        assert f'"{event}"' in events, event


def _documented_events() -> dict[str, set[str]]:
    """Each `{type: "name", key, key: …}` shape of docs/protocol.md's events section (its
    Streaming part included), as its name and body keys."""
    section = DOC.split("\n## Events (PUB)", 1)[1].split("\n## ", 1)[0]
    shapes: dict[str, set[str]] = {}
    for name, rest in re.findall(r'\{type: "([a-z]+\.[a-z]+)",([^}]*)\}', section):
        shapes[name] = set(re.findall(r"(?:^|,)\s*([A-Za-z]+)", rest))
    return shapes


def test_the_event_types_are_exactly_the_documented_events_with_their_keys() -> None:
    documented = _documented_events()
    assert set(documented) == set(EVENT_SHAPES)
    for name, shape in EVENT_SHAPES.items():
        keys = set(shape.__annotations__) - {"type"}
        assert keys == documented[name], name
