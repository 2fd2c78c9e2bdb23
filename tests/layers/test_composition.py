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
from typing import Protocol

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

COMPOSED = tuple(sorted(OURS))
"""Every package of ours is held to the rule."""


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


def _bases_of_ours(cls: type, ours: frozenset[str] = OURS) -> list[str]:
    """`module.Class <- base.module.Base` per direct base of `cls` that is a class of ours
    (its package in `ours`) and not an abstract port; none for an exception class."""
    if issubclass(cls, BaseException):
        return []
    return [
        f"{cls.__module__}.{cls.__qualname__} <- {base.__module__}.{base.__qualname__}"
        for base in cls.__bases__
        if base.__module__.split(".")[0] in ours and not _is_port(base)
    ]


def inherited_from_ours(packages: Sequence[str]) -> list[str]:
    """`module.Class <- base.module.Base` for every class defined in `packages` whose direct
    base is a class of ours that is not an abstract port (exceptions excepted)."""
    found: list[str] = []
    for package in packages:
        for module in _modules(package):
            name = getattr(module, "__name__", "")
            for _attr, cls in sorted(vars(module).items()):
                if inspect.isclass(cls) and cls.__module__ == name:
                    found += _bases_of_ours(cls)
    return found


@pytest.mark.parametrize("package", COMPOSED)
def test_no_class_inherits_from_a_class_of_ours_but_an_abstract_port(package: str) -> None:
    assert inherited_from_ours([package]) == []


class _Mixin:
    """A concern mixed into the class below: what the walk is for."""


class _Mixed(_Mixin):
    pass


class _Port(Protocol):
    def run(self) -> None: ...


class _Implements(_Port):
    def run(self) -> None:
        pass


def test_the_walk_sees_a_mixin_and_lets_a_port_pass() -> None:
    # The walker must catch what it is for (an empty answer would pass vacuously); this test
    # module counts as ours here.
    from drivers.base import ProviderDriver

    assert _is_port(ProviderDriver)
    ours = OURS | {__name__.split(".")[0]}
    assert _bases_of_ours(_Mixed, ours) == [f"{__name__}._Mixed <- {__name__}._Mixin"]
    assert _bases_of_ours(_Implements, ours) == []


def test_the_client_has_no_tower() -> None:
    assert inherited_from_ours(["client"]) == []


def test_the_session_actor_owns_its_parts_and_inherits_only_the_pooled_actor() -> None:
    # `PooledActor` is our pykka flavour, an abstract framework base like
    # `pykka.ThreadingActor`: it schedules; what goes ahead of what is the actor's to say.
    from actors.session_actor import SessionActor

    assert SessionActor.__bases__ == (PooledActor,)
    assert _is_port(PooledActor)
    assert PooledActor.__abstractmethods__ == {"goes_ahead", "is_background"}
    assert not inspect.isabstract(SessionActor)
