"""The host↔worker port is typed call by call: `WorkerPort` has one method per worker call,
each taking its request type and answering a future of its answer type (the way `fork` and
fork.resolve are), and no generic `request(provider, method: str, params)` is left."""

from __future__ import annotations

import inspect
import typing
from concurrent.futures import Future

from actors.ports import WorkerPort
from agenthost.workers import SupervisorPort
from domain import worker_messages

# worker method → the port's method for it
CALLS = {
    "runtime.attest": "attest",
    "session.start": "start_session",
    "session.stop": "stop_session",
    "session.history": "history",
    "turn.start": "start_turn",
    "turn.interrupt": "interrupt_turn",
    "interaction.respond": "respond_interaction",
    "fork": "fork",
    "fork.inspect": "inspect_fork",
    "fork.adopt": "adopt_fork",
    "fork.quarantine": "quarantine_fork",
}


def _methods(cls: type) -> dict[str, typing.Any]:
    return {
        name: fn
        for name, fn in vars(cls).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }


def test_the_port_has_one_typed_method_per_worker_call_and_no_generic_request() -> None:
    methods = _methods(WorkerPort)
    assert set(methods) == set(CALLS.values()), sorted(methods)
    assert "request" not in methods
    namespace = {**vars(worker_messages), "Future": Future}
    for name, fn in methods.items():
        hints = typing.get_type_hints(fn, globalns=namespace)
        params = list(inspect.signature(fn).parameters)
        assert params == ["self", "provider", "request", "timeout"], (name, params)
        request = hints["request"]
        assert request.__module__.startswith("domain."), (name, request)
        assert request is not typing.Any and not str(request).startswith("typing.Mapping")
        # The answer is a future of a type (or of nothing), never of a map.
        answer = typing.get_args(hints["return"])
        assert answer and answer[0] is not dict and typing.get_origin(answer[0]) is not dict, (
            name,
            hints["return"],
        )


def test_every_request_type_names_the_worker_method_its_port_method_sends() -> None:
    sent = {
        getattr(t, "METHOD", None)
        for t in vars(worker_messages).values()
        if isinstance(t, type) and hasattr(t, "METHOD")
    }
    assert sent == {
        "fork",
        "fork.adopt",
        "runtime.attest",
        "session.start",
        "session.stop",
        "session.history",
        "turn.start",
        "turn.interrupt",
        "interaction.respond",
    }
    assert sent < set(CALLS)


def test_the_real_port_implements_every_call() -> None:
    real = _methods(SupervisorPort)
    for name in CALLS.values():
        assert name in real, name
        assert list(inspect.signature(real[name]).parameters) == [
            "self",
            "provider",
            "request",
            "timeout",
        ]
