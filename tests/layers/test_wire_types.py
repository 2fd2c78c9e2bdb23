"""No `dict[str, Any]` or `Mapping[str, Any]` crosses the client wire in either direction: the
signatures at the boundary — the daemon's handlers (params in, `Answer[R]` out), the request
plumbing they answer through, the projection that builds their results, the publisher's
events, the transport's publish, the envelope, `Client.call` — and every type they name (the
`protocol` TypedDicts, walked field by field) say what the wire carries. An open map the
protocol does not shape is a `JsonObject`, whose values are JSON, not `Any`."""

from __future__ import annotations

import collections.abc
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ForwardRef, NotRequired, TypedDict, get_args, get_origin, get_type_hints

import pytest

from agenthost import api_base, projection, publisher, turn_events
from agenthost.api import Api
from protocol import envelope, events, methods, objects
from transport.client import Client
from transport.server import ApiServer
from transport.wire import error_body

_MAPS = {dict, collections.abc.Mapping, collections.abc.MutableMapping}
# `JsonValue` is a recursive alias spelled as a string: resolvable wherever a hint names it.
_NAMES = {"JsonValue": objects.JsonValue}


def loose(tp: object, where: str, seen: set[int] | None = None) -> Iterator[str]:
    """Where `tp` holds a str-keyed map of `Any` values, walking unions, generics' arguments
    and TypedDicts' fields (each type once)."""
    seen = set() if seen is None else seen
    if isinstance(tp, str | ForwardRef) or id(tp) in seen:
        return
    seen.add(id(tp))
    if typing.is_typeddict(tp):
        for field, hint in get_type_hints(tp, localns=_NAMES).items():
            yield from loose(hint, f"{where}.{field}", seen)
        return
    origin, args = get_origin(tp), get_args(tp)
    if origin in _MAPS and len(args) == 2 and args[0] is str and args[1] is Any:
        yield f"{where}: {tp}"
    for arg in args:
        if isinstance(arg, list):  # Callable's parameter list
            for item in arg:
                yield from loose(item, where, seen)
        else:
            yield from loose(arg, where, seen)


def signature_loose(fn: Callable[..., object], where: str) -> list[str]:
    found: list[str] = []
    for name, hint in get_type_hints(fn, localns=_NAMES).items():
        found += loose(hint, f"{where}({name})")
    return found


def _handlers() -> list[tuple[str, Callable[..., object]]]:
    names = [m.name for m in methods.METHODS.values()]
    out = []
    for name in names:
        attr = name.replace(".", "_")
        attr = "".join("_" + c.lower() if c.isupper() else c for c in attr)
        out.append((name, getattr(Api, attr)))
    return out


BOUNDARY: list[tuple[str, Callable[..., object]]] = [
    *[(f"Api handler of {name}", fn) for name, fn in _handlers()],
    *[
        (f"RequestPlumbing.{n}", getattr(api_base.RequestPlumbing, n))
        for n in ("read", "read_now", "route")
    ],
    ("api_base.Answer.result", api_base.Answer.result),
    *[
        (f"projection.{n}", fn)
        for n, fn in inspect.getmembers(projection, inspect.isfunction)
        if fn.__module__ == projection.__name__
    ],
    ("EventPublisher.project", publisher.EventPublisher.project),
    ("EventSink.publish_many", publisher.EventSink.publish_many),
    ("turn_events.updated_turn", turn_events.updated_turn),
    ("ApiServer.publish", ApiServer.publish),
    ("ApiServer.publish_many", ApiServer.publish_many),
    ("transport.wire.error_body", error_body),
    *[
        (f"envelope.{n}", fn)
        for n, fn in inspect.getmembers(envelope, inspect.isfunction)
        if fn.__module__ == envelope.__name__
    ],
    ("envelope.Request", envelope.Request),
    ("envelope.EnvelopeError", envelope.EnvelopeError.__init__),
    *[(f"Client.call overload {i}", fn) for i, fn in enumerate(typing.get_overloads(Client.call))],
]


@pytest.mark.parametrize(("where", "fn"), BOUNDARY, ids=[w for w, _ in BOUNDARY])
def test_no_any_map_in_a_wire_boundary_signature(where: str, fn: Callable[..., object]) -> None:
    assert signature_loose(fn, where) == []


PROTOCOL_TYPES: list[tuple[str, object]] = [
    *[(f"{m.name} params", m.params) for m in methods.METHODS.values()],
    *[(f"{m.name} result", m.result) for m in methods.METHODS.values()],
    *[(f"event {t.__name__}", t) for t in get_args(events.Event)],
    *[
        (f"objects.{n}", t)
        for n, t in vars(objects).items()
        if typing.is_typeddict(t) and t.__module__ == objects.__name__
    ],
]


@pytest.mark.parametrize(("where", "tp"), PROTOCOL_TYPES, ids=[w for w, _ in PROTOCOL_TYPES])
def test_no_any_map_in_a_protocol_type(where: str, tp: object) -> None:
    assert list(loose(tp, where)) == []


class _Inner(TypedDict):
    settings: NotRequired[dict[str, Any] | None]


class _Outer(TypedDict):
    items: list[_Inner]


def test_the_boundary_is_walked_whole() -> None:
    # An empty walk must not pass: every wire method has its handler, both `Client.call`
    # overloads are seen, and the walk finds a loose map however deep it is nested.
    assert len(_handlers()) == len(methods.METHODS)
    assert len(typing.get_overloads(Client.call)) == 2
    assert len(get_args(events.Event)) == 5

    def handler(params: _Outer, reply: Callable[[int, Mapping[str, Any]], None]) -> None: ...

    found = signature_loose(handler, "h")
    assert [f.split(":")[0] for f in found] == [
        "h(params).items.settings",
        "h(reply)",
    ]
    assert list(loose(objects.Session, "Session")) == []


# -- the client's side ------------------------------------------------------------------------

from client import follow  # noqa: E402
from client.cli import command  # noqa: E402
from client.engine import acks, cache, calls, forks, ports, reconcile, unknown, values  # noqa: E402
from client.engine.lifecycle import Engine  # noqa: E402
from client.gui.view import SessionView  # noqa: E402
from transport import client as transport_client  # noqa: E402

_CLIENT_NAMES = {**_NAMES, "Client": Client}


def _with_overloads(
    where: str, fn: Callable[..., object]
) -> list[tuple[str, Callable[..., object]]]:
    overloads = typing.get_overloads(fn)
    return [(f"{where} overload {i}", o) for i, o in enumerate(overloads)] or [(where, fn)]


def _members(where: str, cls: type) -> list[tuple[str, Callable[..., object]]]:
    """Every function a class defines itself (overloads one by one), `__init__` included."""
    out: list[tuple[str, Callable[..., object]]] = []
    for name, fn in vars(cls).items():
        fn = fn.__func__ if isinstance(fn, classmethod | staticmethod) else fn
        if inspect.isfunction(fn) and fn.__module__ != cls.__module__:
            continue  # generated (a NamedTuple's `__new__`): its fields are walked instead
        if inspect.isfunction(fn):
            out += _with_overloads(f"{where}.{name}", fn)
        elif isinstance(fn, property) and fn.fget is not None:
            out.append((f"{where}.{name}", fn.fget))
    return out


def _module_boundary(module: object) -> list[tuple[str, Callable[..., object]]]:
    """Every function and class method a module defines."""
    name = getattr(module, "__name__", "")
    out: list[tuple[str, Callable[..., object]]] = []
    for attr, value in vars(module).items():
        if getattr(value, "__module__", None) != name:
            continue
        if inspect.isfunction(value):
            out += _with_overloads(f"{name}.{attr}", value)
        elif inspect.isclass(value):
            out += _members(f"{name}.{attr}", value)
    return out


def _fields(cls: type) -> Callable[..., object]:
    """A stand-in whose annotations are the fields of `cls` (a NamedTuple's are not on any
    function of ours)."""

    def fields() -> None: ...

    fields.__annotations__ = dict(get_type_hints(cls, localns=_NAMES))
    return fields


CLIENT_BOUNDARY: list[tuple[str, Callable[..., object]]] = [
    # The transport client whole: requests, replies (and a reply's fields), events, the Turn
    # merge.
    *_module_boundary(transport_client),
    ("transport.client.Reply fields", _fields(transport_client.Reply)),
    # The Engine's edges: its request port, its calls, the events pump, what reads replies
    # and events (records, cache, the `unknown` index), what it hands views.
    *_module_boundary(ports),
    *_module_boundary(calls),
    *_module_boundary(cache),
    *_module_boundary(unknown),
    *_module_boundary(values),
    *_members("Reconciliation", reconcile.Reconciliation),
    *_members("Acknowledgements", acks.Acknowledgements),
    *_members("ForkRequests", forks.ForkRequests),
    *_members("Engine", Engine),
    # The CLI's call and the Turn follower; the GUI's event entry points.
    *_with_overloads("cli.command.call", command.call),
    *[
        (f"follow.{n}", getattr(follow, n))
        for n in ("get_turn", "stream_turn", "run_turn", "_next_turn_event", "fork_and_wait")
    ],
    ("follow.TurnPrinter.delta", follow.TurnPrinter.delta),
    *[
        (f"SessionView.{n}", getattr(SessionView, n))
        for n in ("on_daemon_event", "on_delta", "merge_turn", "_reload_turn", "_page_loaded")
    ],
]


def client_signature_loose(fn: Callable[..., object], where: str) -> list[str]:
    found: list[str] = []
    for name, hint in get_type_hints(fn, localns=_CLIENT_NAMES).items():
        found += loose(hint, f"{where}({name})")
    return found


@pytest.mark.parametrize(("where", "fn"), CLIENT_BOUNDARY, ids=[w for w, _ in CLIENT_BOUNDARY])
def test_no_any_map_in_a_client_wire_signature(where: str, fn: Callable[..., object]) -> None:
    assert client_signature_loose(fn, where) == []


def test_the_client_boundary_is_walked_whole() -> None:
    # Every call shape is seen: the typed and the bare-name overloads of `submit`, `call_raw`,
    # `call` and the Engine's `request`, the event subscriber and the request port.
    names = [w for w, _ in CLIENT_BOUNDARY]
    for method in ("Client.submit", "Client.call_raw", "Client.call", "Engine.request"):
        assert sum(1 for w in names if f"{method} overload" in w) == 2, method
    for where in ("EventSubscriber.next_message", "ApiPort.submit", "Reply fields"):
        assert any(where in w for w in names), where
    assert len(CLIENT_BOUNDARY) > 100


def test_the_transport_client_spells_no_any_map() -> None:
    # Beyond signatures: no local variable or attribute of the client's wire module is one.
    source = inspect.getsource(transport_client)
    for loose_map in ("dict[str, Any]", "Mapping[str, Any]"):
        assert loose_map not in source
