"""The store's surface (issue 19).

`storage.Store` carries only what the daemon uses: every public method of it is called
somewhere outside the tests (a read or write only tests make lives in the test port,
tests/support/store_reads.py, running the same SQL through the store's own helpers). And the
actors never hold the `Store` class: each types its store as its own narrow port
(actors/store_ports.py), which the whole `Store` fits (mypy --strict checks that where the
daemon builds `HostContext`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from storage import Store

ROOT = Path(__file__).resolve().parents[2]
NON_TEST_PACKAGES = (
    "domain",
    "storage",
    "actors",
    "transport",
    "drivers",
    "tutti_agent",
    "agenthost",
    "model_fakes",
    "client",
    "bench",
)


def _non_test_source() -> str:
    return "\n".join(
        path.read_text()
        for package in NON_TEST_PACKAGES
        if (ROOT / package).is_dir()
        for path in sorted((ROOT / package).rglob("*.py"))
    )


def test_every_public_store_method_has_a_caller_outside_the_tests() -> None:
    source = _non_test_source()
    public = sorted(name for name in dir(Store) if not name.startswith("_"))
    unused = [name for name in public if not re.search(rf"\.{name}\b", source)]
    assert unused == [], f"Store methods only tests call (move them to tests/support): {unused}"


def _imports_of(path: Path) -> set[tuple[str, str]]:
    """(module, name) for every `from module import name`, and (module, "") per `import`."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {(alias.name, "") for alias in node.names}
    return found


def test_no_actor_module_imports_the_store_class() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            f"{module}.{name}" if name else module
            for module, name in _imports_of(path)
            if (module == "storage" and name == "Store") or module == "storage.store"
        )
        for path in sorted((ROOT / "actors").glob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_every_store_port_is_a_part_of_the_store() -> None:
    """Each port names only methods the real `Store` has (its signatures are mypy's check)."""
    from actors import store_ports

    ports = [
        obj
        for obj in vars(store_ports).values()
        if isinstance(obj, type) and getattr(obj, "_is_protocol", False)
    ]
    assert len(ports) >= 7
    for port in ports:
        # Its own members (a composed port's are checked on its parts).
        members = {name for name in vars(port) if not name.startswith("_")}
        missing = sorted(name for name in members if not hasattr(Store, name))
        assert missing == [], f"{port.__name__} names what Store lacks: {missing}"
