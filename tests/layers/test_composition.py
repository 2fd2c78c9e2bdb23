"""Objects own their parts; they do not inherit them (STYLE.md, "Composition over
inheritance"): no production class inherits from a class of ours other than an abstract port
(a `typing.Protocol` or an `abc.ABC`). Framework bases (pykka, textual) are not ours and pass;
exception classes pass too (the typed error hierarchy carries its wire identity, STYLE.md).
"""

from __future__ import annotations

import abc
import importlib
import inspect
import pkgutil
from collections.abc import Iterator, Sequence

import pytest

from actors.pool import PooledActor

# Every top-level package of ours (pyproject's import-linter `root_packages`).
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

COMPOSED = ("drivers", "tutti_agent", "client.engine", "actors", "model_fakes", "agenthost")
"""Packages held to the rule today."""

KNOWN_TOWERS = ("client.gui", "storage")
"""Known exceptions, still class towers (the GUI's App subclasses over its view, the Store's
MRO): each is expected to fail the walk (strict xfail), so the day one is composed its test
passes and this list must lose it. In `client` the GUI is the only one left
(`test_outside_the_gui_the_client_has_no_tower`)."""


def _modules(package: str) -> Iterator[object]:
    root = importlib.import_module(package)
    yield root
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # a program's entry: importing it runs it
        yield importlib.import_module(info.name)


def _is_port(cls: type) -> bool:
    """An abstract port: a Protocol, or an ABC (directly or by its metaclass)."""
    return bool(getattr(cls, "_is_protocol", False)) or (
        isinstance(cls, abc.ABCMeta) and abc.ABC in cls.__bases__
    )


def inherited_from_ours(packages: Sequence[str]) -> list[str]:
    """`module.Class <- base.module.Base` for every class defined in `packages` whose direct
    base is a class of ours that is not an abstract port (exceptions excepted)."""
    found: list[str] = []
    for package in packages:
        for module in _modules(package):
            name = getattr(module, "__name__", "")
            for attr, cls in sorted(vars(module).items()):
                if not inspect.isclass(cls) or cls.__module__ != name:
                    continue
                if issubclass(cls, BaseException):
                    continue
                for base in cls.__bases__:
                    if base.__module__.split(".")[0] in OURS and not _is_port(base):
                        found.append(f"{name}.{attr} <- {base.__module__}.{base.__qualname__}")
    return found


@pytest.mark.parametrize("package", COMPOSED)
def test_no_class_inherits_from_a_class_of_ours_but_an_abstract_port(package: str) -> None:
    assert inherited_from_ours([package]) == []


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="a class tower"))
        for p in KNOWN_TOWERS
    ],
)
def test_the_known_towers_are_still_towers(package: str) -> None:
    assert inherited_from_ours([package]) == []


def test_the_walk_sees_a_mixin_and_lets_a_port_pass() -> None:
    # The walker must catch what it is for (an empty answer would pass vacuously).
    from drivers.base import ProviderDriver

    assert _is_port(ProviderDriver)
    towers = inherited_from_ours(["storage"])
    assert any(line.startswith("storage.store.Store <- ") for line in towers), towers


def test_outside_the_gui_the_client_has_no_tower() -> None:
    towers = inherited_from_ours(["client"])
    assert [line for line in towers if not line.startswith("client.gui.")] == []


def test_the_session_actor_owns_its_parts_and_inherits_only_the_pooled_actor() -> None:
    # `PooledActor` is our pykka flavour, an abstract framework base like
    # `pykka.ThreadingActor`: it schedules; what goes ahead of what is the actor's to say.
    from actors.session_actor import SessionActor

    assert SessionActor.__bases__ == (PooledActor,)
    assert _is_port(PooledActor)
    assert PooledActor.__abstractmethods__ == {"goes_ahead", "is_background"}
    assert not inspect.isabstract(SessionActor)
