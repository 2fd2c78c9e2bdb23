"""The client Engine is one object that owns its parts (STYLE.md, "Composition over
inheritance"): no class of `client.engine` inherits from a class of ours other than an
abstract port (a `typing.Protocol` or an `abc.ABC`), and the Engine is built from parts it
wires in its constructor, each with its own state, sharing one lock.
"""

from __future__ import annotations

import abc
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import pytest

from client.engine import Engine
from client.engine.records import MutationRecords

OURS = frozenset(
    {
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
    }
)


def _classes(package: str) -> Iterator[type]:
    root = importlib.import_module(package)
    modules = [root] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(root.__path__, f"{package}.")
    ]
    for module in modules:
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                yield cls


def _is_port(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False)) or (
        isinstance(cls, abc.ABCMeta) and abc.ABC in cls.__bases__
    )


def _inherits_from_ours(cls: type) -> list[str]:
    if issubclass(cls, BaseException):
        return []
    return [
        f"{cls.__module__}.{cls.__qualname__} <- {base.__module__}.{base.__qualname__}"
        for base in cls.__bases__
        if base.__module__.split(".")[0] in OURS and not _is_port(base)
    ]


def test_no_engine_class_inherits_from_a_class_of_ours_but_an_abstract_port() -> None:
    towers = [line for cls in _classes("client.engine") for line in _inherits_from_ours(cls)]
    assert towers == []


def test_the_walk_sees_the_engine_and_would_catch_a_part_subclassed() -> None:
    # An empty answer must not pass vacuously: the walk reaches the Engine and its parts, and
    # a class built on one of our parts is reported.
    walked = {f"{c.__module__}.{c.__qualname__}" for c in _classes("client.engine")}
    assert {
        "client.engine.lifecycle.Engine",
        "client.engine.records.MutationRecords",
        "client.engine.forks.ForkRequests",
    } <= walked
    tower = type("Tower", (MutationRecords,), {"__module__": "client.engine.example"})
    assert _inherits_from_ours(tower) == [
        "client.engine.example.Tower <- client.engine.records.MutationRecords"
    ]


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
        feeds = {id(p._feed) for p in parts}
        assert feeds == {id(engine._feed)}
    finally:
        engine.close()
