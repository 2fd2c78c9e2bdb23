"""No re-export shims: a production package's `__init__.py` binds no names imported from its
modules (or anyone else's), so every import names the module that defines what it imports and
a reader finds a name where it is written. A package keeps a docstring saying what its modules
are; the drivers' worker loads `drivers.codex.driver`, `drivers.claude.driver` directly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Every top-level package of ours (pyproject's import-linter `root_packages`).
OURS = (
    "domain",
    "storage",
    "actors",
    "transport",
    "drivers",
    "tutti_agent",
    "agenthost",
    "model_fakes",
    "client",
    "workspace",
    "protocol",
)

KNOWN_FACADES = ("storage", "client.engine")
"""Packages whose `__init__.py` still re-exports (the Store's names; the client Engine's):
each is expected to fail (strict xfail), so the day one is emptied its test passes and this
list must lose it."""


def _packages() -> list[str]:
    found = []
    for root in OURS:
        for init in sorted((ROOT / root).rglob("__init__.py")):
            found.append(".".join(init.parent.relative_to(ROOT).parts))
    return found


def bound_imports(package: str) -> list[str]:
    """`package: name (from module)` for every name its `__init__.py` binds by an import."""
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    tree = ast.parse(init.read_text(encoding="utf-8"), str(init))
    bound: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            source = "." * node.level + (node.module or "")
            bound += [f"{package}: {a.asname or a.name} (from {source})" for a in node.names]
        elif isinstance(node, ast.Import):
            bound += [f"{package}: {a.asname or a.name} (import)" for a in node.names]
    return bound


@pytest.mark.parametrize("package", [p for p in _packages() if p not in KNOWN_FACADES])
def test_a_package_init_binds_no_imported_name(package: str) -> None:
    assert bound_imports(package) == []


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="a facade"))
        for p in KNOWN_FACADES
    ],
)
def test_the_known_facades_still_re_export(package: str) -> None:
    assert bound_imports(package) == []


def test_the_walk_sees_every_package_and_a_re_export() -> None:
    # An empty answer must not pass vacuously: the walk finds the packages and a binding.
    packages = _packages()
    assert {"drivers.codex", "drivers.claude", "drivers.app_server", "storage"} <= set(packages)
    assert "storage: Store (from storage.store)" in bound_imports("storage")
