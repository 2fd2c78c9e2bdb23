"""The store's surface.

`storage.Store` carries only what the daemon uses: every public method of its parts is called
somewhere outside the tests (a read or write only tests make lives in the test port,
tests/support/store_reads.py, running the same SQL through the store's own helpers). And the
actors never hold the `Store` class: each types its store as its own narrow port
(actors/store_ports.py), which the whole `Store` fits (mypy --strict checks that where the
daemon builds `HostContext`).
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

from storage.store import Store

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


def _parts(store: Store) -> dict[str, object]:
    """The Store's parts (its owner `db` included) by attribute name."""
    return {name: part for name, part in vars(store).items() if not name.startswith("_")}


def test_every_public_store_method_has_a_caller_outside_the_tests(tmp_path: Path) -> None:
    source = _non_test_source()
    store = Store(tmp_path / "s.db")
    try:
        parts = _parts(store)
    finally:
        store.close()
    assert {"db", "sessions", "turns", "history", "fork_prepare", "resolution"} <= set(parts)
    public = sorted(
        f"{part_name}.{name}"
        for part_name, part in parts.items()
        if part_name != "db"
        for name in dir(type(part))
        if not name.startswith("_") and callable(getattr(type(part), name))
    )
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


def _members(protocol: type) -> set[str]:
    """A protocol's own and inherited members (not `typing.Protocol`'s machinery)."""
    return {
        name
        for klass in protocol.__mro__
        if getattr(klass, "_is_protocol", False) and klass.__module__ != "typing"
        for name in vars(klass)
        if not name.startswith("_")
    }


def test_every_store_port_is_a_part_of_the_store(tmp_path: Path) -> None:
    """Each port names only parts the real `Store` has, and on each part only methods that
    part has (their signatures are mypy's check)."""
    from actors import store_ports

    ports = [
        obj
        for obj in vars(store_ports).values()
        if isinstance(obj, type)
        and getattr(obj, "_is_protocol", False)
        and any(isinstance(value, property) for value in vars(obj).values())
    ]
    assert len(ports) >= 7
    store = Store(tmp_path / "s.db")
    try:
        for port in ports:
            for name in _members(port):
                assert hasattr(store, name), f"{port.__name__} names a part Store lacks: {name}"
                fget = getattr(port, name).fget
                wanted = _members(typing.get_type_hints(fget)["return"])
                part = getattr(store, name)
                missing = sorted(m for m in wanted if not hasattr(part, m))
                assert missing == [], f"{port.__name__}.{name} names what the part lacks: {missing}"
    finally:
        store.close()
