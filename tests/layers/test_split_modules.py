"""Splits by concern in the drivers' room: the supervisor (`drivers.supervisor`), the config
(`agenthost.config`) and tutti-agent's turns (`tutti_agent.turns`) are each split into one
module per concern (each saying its one concern in its docstring), and the names others
import are found where callers look for them: `agenthost.config` is a facade whose names are
the concern modules' own objects, `drivers.supervisor` still names its sinks and states,
`tutti_agent.turns` its `_TurnIO` (a test wraps its methods inside a daemon's app-server)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SPLITS = {
    "drivers.supervisor": (
        "drivers.worker_state",
        "drivers.worker_spawn",
    ),
    "agenthost.config": (
        "agenthost.config_values",
        "agenthost.config_schema",
        "agenthost.config_load",
        "agenthost.config_paths",
    ),
    "tutti_agent.turns": ("tutti_agent.turn_io",),
}


@pytest.mark.parametrize("name", [n for pair in SPLITS.items() for n in (pair[0], *pair[1])])
def test_each_module_of_a_split_says_its_concern(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__ and len(module.__doc__.split()) >= 10, name


def test_the_config_facade_keeps_every_public_name() -> None:
    config = importlib.import_module("agenthost.config")
    for public in config.__all__:
        value = getattr(config, public)
        homes = [
            m
            for m in SPLITS["agenthost.config"]
            if getattr(importlib.import_module(m), public, None) is value
        ]
        assert homes, f"agenthost.config.{public} is defined in none of its concern modules"


def test_the_old_names_are_the_new_objects() -> None:
    import drivers.supervisor
    import drivers.worker_state
    import tutti_agent.turn_io
    import tutti_agent.turns

    assert drivers.supervisor.WorkerState is drivers.worker_state.WorkerState
    assert tutti_agent.turns._TurnIO is tutti_agent.turn_io.LiveTurnIO


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


def test_each_module_of_ours_says_its_concern() -> None:
    """Modules are split by concern, not by line count (the review rule: a module says its one
    concern in its opening docstring); package `__init__` files may be empty."""
    import ast

    silent: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if path.name != "__init__.py" and not ast.get_docstring(ast.parse(text)):
                silent.append(str(path.relative_to(ROOT)))
    assert silent == []
