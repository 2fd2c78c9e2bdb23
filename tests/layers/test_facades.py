"""No re-export shims: a production package's `__init__.py` binds no names imported from its
modules (or anyone else's), so every import names the module that defines what it imports and
a reader finds a name where it is written. A package keeps a docstring saying what its modules
are; the drivers' worker loads `drivers.codex.driver`, `drivers.claude.driver` directly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layers.test_composition import OURS as OURS_PACKAGES

ROOT = Path(__file__).resolve().parents[2]

OURS = tuple(sorted(OURS_PACKAGES))
"""Every top-level package of ours (one list, in test_composition)."""


def _packages() -> list[str]:
    found = []
    for root in OURS:
        for init in sorted((ROOT / root).rglob("__init__.py")):
            found.append(".".join(init.parent.relative_to(ROOT).parts))
    return found


def bound_imports(package: str, root: Path = ROOT) -> list[str]:
    """`package: name (from module)` for every name its `__init__.py` binds by an import."""
    init = root.joinpath(*package.split("."), "__init__.py")
    tree = ast.parse(init.read_text(encoding="utf-8"), str(init))
    bound: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            source = "." * node.level + (node.module or "")
            bound += [f"{package}: {a.asname or a.name} (from {source})" for a in node.names]
        elif isinstance(node, ast.Import):
            bound += [f"{package}: {a.asname or a.name} (import)" for a in node.names]
    return bound


@pytest.mark.parametrize("package", _packages())
def test_a_package_init_binds_no_imported_name(package: str) -> None:
    assert bound_imports(package) == []


def test_the_walk_sees_every_package_and_a_re_export(tmp_path: Path) -> None:
    # An empty answer must not pass vacuously: the walk finds the packages and a binding.
    packages = _packages()
    assert {"drivers.codex", "drivers.claude", "drivers.app_server", "storage"} <= set(packages)
    assert {"storage", "client.engine"} <= set(packages)
    (tmp_path / "shim").mkdir()
    shim = '"""A shim."""\nfrom storage.store import Store\n'
    (tmp_path / "shim" / "__init__.py").write_text(shim)
    assert bound_imports("shim", tmp_path) == ["shim: Store (from storage.store)"]
