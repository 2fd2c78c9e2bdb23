"""The client Engine is one object that owns its parts (STYLE.md, "Composition over
inheritance"): it inherits from nothing of ours, and its constructor wires parts that each
keep their own state and share the Engine's one lock. `test_composition` walks the package
for towers; this file pins the shape of the Engine itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from client.engine.lifecycle import Engine
from client.engine.records import MutationRecords
from tests.layers.test_composition import _modules, inherited_from_ours


def test_the_walk_reaches_the_engine_and_would_catch_a_part_subclassed() -> None:
    # `test_composition` holds `client.engine` to the rule; an empty answer there must not
    # pass vacuously: the walk reaches the Engine's modules, and a class on a part is caught.
    walked = {getattr(m, "__name__", "") for m in _modules("client.engine")}
    assert {"client.engine.lifecycle", "client.engine.records", "client.engine.forks"} <= walked
    assert inherited_from_ours(["client.engine"]) == []
    tower = type("Tower", (MutationRecords,), {"__module__": "client.engine.records"})
    import client.engine.records as records

    records.Tower = tower  # type: ignore[attr-defined]
    try:
        assert inherited_from_ours(["client.engine"]) == [
            "client.engine.records.Tower <- client.engine.records.MutationRecords"
        ]
    finally:
        del records.Tower  # type: ignore[attr-defined]


@pytest.mark.timeout(10)
def test_the_engine_owns_its_parts_over_one_lock() -> None:
    class NoApi:
        def submit(self, method: str, params: object = None) -> object:
            raise AssertionError("nothing is sent at construction")

    assert Engine.__bases__ == (object,)
    engine = Engine(NoApi(), "ws")  # type: ignore[arg-type]
    try:
        parts: list[Any] = [
            engine._records,
            engine._sessions,
            engine._unknown,
            engine._acks,
            engine._reconciliation,
            engine._forks,
        ]
        assert len({id(p) for p in parts}) == len(parts)
        # Every part that takes the lock takes the Engine's one lock.
        assert {id(p._feed) for p in parts} == {id(engine._feed)}
    finally:
        engine.close()
