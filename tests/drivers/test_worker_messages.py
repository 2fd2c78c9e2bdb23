"""The typed host↔worker messages (`domain.worker_messages`) are the wire, key for key: a real
Tutti Agent driver's every turn event reads as its `TurnEvent` and writes back to the same
msgpack bytes; the saga's `ForkRequest` is the map it always sent; a `ForkResult` round-trips,
and an answer that is not one is `MalformedMessage` (the saga records it `unknown`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from drv_helpers import EventLog, completed
from test_tutti_driver import Make, open_session

import drivers.base
from domain import turn_events as te
from domain import worker_messages as wm
from domain.enums import DeliveryDisposition, ProviderStateBindingMode


def _bytes(m: object) -> bytes:
    return msgpack.packb(m, use_bin_type=True)


@pytest.mark.timeout(90)
def test_every_event_a_real_driver_streams_is_its_turn_event_byte_for_byte(
    make_driver: Make,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    log = EventLog()
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=("hello there", "/tool grep needle", "/fail boom"))
    driver.start_turn({"agentSessionId": "src", "turnId": "Q", "text": "/ask colour?"}, log)
    asked = log.wait_for(lambda e: e["type"] == "interaction.requested")
    driver.respond_interaction(
        {"agentSessionId": "src", "requestId": asked["requestId"], "response": {"text": "blue"}}
    )
    log.wait_for(completed("Q"))
    seen = set()
    for _, event in log.events:
        typed = te.turn_event_from_wire(event)
        assert _bytes(typed.to_wire()) == _bytes(event), event
        seen.add(type(typed))
    assert {
        te.TurnStarted,
        te.TurnItem,
        te.TurnCompleted,
        te.InteractionRequested,
    } <= seen


class _RawLog(EventLog):
    """Keeps what the driver handed `emit`, before any serialisation."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[object] = []

    def __call__(self, sid: str, event: te.TurnEvent) -> None:
        self.raw.append(event)
        super().__call__(sid, event)


@pytest.mark.timeout(90)
def test_a_driver_emits_typed_turn_events_never_maps(
    make_driver: Make,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """The driver builds each event as its `TurnEvent`; the wire map is made once,
    at the worker's edge (`to_wire`), and reads back as the same value."""
    log = _RawLog()
    driver = make_driver()
    open_session(driver, log, tmp_path, texts=("hello there", "/tool grep needle"))
    assert log.raw
    kinds = (
        te.TurnStarted,
        te.TurnItem,
        te.InteractionRequested,
        te.TurnBindingMoved,
        te.TurnCompleted,
        te.MessageDelta,
        te.TurnActivity,  # a tool the model started: it has answered
    )
    for event in log.raw:
        assert isinstance(event, kinds), event
        assert te.turn_event_from_wire(event.to_wire()) == event


def _request() -> wm.ForkRequest:
    return wm.ForkRequest(
        source=wm.ForkSource("1:w:s", "thread-1", "/h/src", "/cwd"),
        target=wm.ForkTarget("1:w:t", "/h/tgt"),
        source_turn_id="turn-3",
        provider_turn_ids=("p1", "p2"),
        extra={"providerTurnBindings": [None, '{"x": 1}']},
        title="Source (2)",
        driver_kind="tutti-agent",
        driver_version="0.0.10",
    )


def test_the_fork_request_is_the_map_the_saga_always_sent() -> None:
    request = _request()
    # The literal the saga built by hand before the type existed, in its key order.
    legacy = {
        "source": {
            "agentSessionId": "1:w:s",
            "providerSessionId": "thread-1",
            "home": "/h/src",
            "cwd": "/cwd",
        },
        "target": {"agentSessionId": "1:w:t", "home": "/h/tgt"},
        "sourceTurnId": "turn-3",
        "providerTurnIds": ["p1", "p2"],
        "providerTurnBindings": [None, '{"x": 1}'],
        "title": "Source (2)",
        "driverKind": "tutti-agent",
        "driverVersion": "0.0.10",
    }
    assert _bytes(request.to_wire()) == _bytes(legacy)
    assert wm.ForkRequest.from_wire(legacy) == request
    assert request.provider_turn_bindings == (None, '{"x": 1}')
    # One definition: the drivers' names are the domain's types.
    assert drivers.base.ForkRequest is wm.ForkRequest
    assert drivers.base.ForkResult is wm.ForkResult


@pytest.mark.parametrize("mode", list(ProviderStateBindingMode))
def test_a_fork_result_round_trips(mode: ProviderStateBindingMode) -> None:
    result = wm.ForkResult(
        DeliveryDisposition.ACCEPTED,
        child=wm.ForkChild("child-1", "thread-1", ("p1", "p2")),
        binding=wm.ForkBinding(
            mode,
            {"sha256": "x"},
            {"p1": {"rootProviderTurnId": "c1", "bindingJson": None}}
            if mode is ProviderStateBindingMode.PROVIDER_OWNED
            else None,
        ),
    )
    assert wm.ForkResult.from_wire(result.to_wire()) == result
    for other in (wm.ForkResult.not_started("no"), wm.ForkResult.unknown("lost")):
        assert wm.ForkResult.from_wire(other.to_wire()) == other


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"disposition": "maybe"},
        {"disposition": "accepted"},
        {"disposition": "accepted", "child": {"providerSessionId": "c"}},
        {
            "disposition": "accepted",
            "child": {"providerSessionId": "c"},
            "binding": {"mode": "telepathy", "receipt": {"a": 1}},
        },
    ],
)
def test_an_answer_that_is_not_a_fork_result_is_malformed(answer: dict[str, object]) -> None:
    with pytest.raises(wm.MalformedMessage):
        wm.ForkResult.from_wire(answer)


@pytest.mark.timeout(60)
def test_the_typed_fork_call_through_a_real_worker_answers_a_fork_result(tmp_path: Path) -> None:
    """The port's typed `fork` over the daemon's real port and a real worker process: the
    request leaves as `ForkRequest.to_wire()`, the answer comes back a `ForkResult`."""
    from agenthost.workers import SupervisorPort
    from drivers.supervisor import WorkerSupervisor

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    supervisor = WorkerSupervisor(run_dir)
    try:
        port = SupervisorPort(supervisor)
        request = wm.ForkRequest(
            source=wm.ForkSource("1:w:s", "no-such-thread", str(tmp_path / "src"), str(tmp_path)),
            target=wm.ForkTarget("1:w:t", str(tmp_path / "tgt")),
            provider_turn_ids=("p1",),
            title="t",
            driver_kind="tutti-agent",
            driver_version="0",
        )
        got = port.fork("tutti-agent", request, 30).result(40)
    finally:
        supervisor.close()
    assert isinstance(got, wm.ForkResult)
    assert got.disposition is DeliveryDisposition.NOT_STARTED, got


def test_a_turn_started_carries_its_binding_or_none() -> None:
    """`turn.started` may carry the Turn's first binding (`bindingJson`): it reads back as
    itself; one without the key (the Claude driver's, an older worker's) reads as before."""
    carried = te.TurnStarted("t", "p", '{"schemaVersion": 1}')
    assert carried.to_wire() == {
        "type": "turn.started",
        "turnId": "t",
        "providerTurnId": "p",
        "bindingJson": '{"schemaVersion": 1}',
    }
    assert te.turn_event_from_wire(carried.to_wire()) == carried
    bare = {"type": "turn.started", "turnId": "t", "providerTurnId": "p"}
    assert te.turn_event_from_wire(bare) == te.TurnStarted("t", "p")
    assert te.TurnStarted("t", "p").to_wire() == bare


def test_an_unknown_event_type_is_malformed() -> None:
    with pytest.raises(wm.MalformedMessage):
        te.turn_event_from_wire({"type": "turn.exploded", "turnId": "t"})


def _resolve_request() -> wm.ResolveRequest:
    return wm.ResolveRequest(
        operation_id="op-1",
        source=wm.ForkSource("1:w:s", "thread-1", "/h/src", "/cwd"),
        target=wm.ForkTarget("1:w:t", "/h/tgt"),
        provider_turn_ids=("p1", "p2"),
        exclude_child_ids=("other-child",),
        title="Source (2)",
        provider_turn_bindings=(None, '{"x": 1}'),
        driver_kind="claude-code",
        driver_version="2.1.0",
    )


def test_the_resolve_requests_are_the_maps_fork_resolve_always_sent() -> None:
    """fork.inspect / fork.quarantine / fork.adopt params, in the key order the resolver built
    them by hand before the types existed; each reads back as its type, and the driver's
    re-verification request carries what its fork would (bindings, the frozen prefix)."""
    request = _resolve_request()
    legacy = {
        "operationId": "op-1",
        "source": {
            "agentSessionId": "1:w:s",
            "providerSessionId": "thread-1",
            "home": "/h/src",
            "cwd": "/cwd",
        },
        "target": {"agentSessionId": "1:w:t", "home": "/h/tgt"},
        "providerTurnIds": ["p1", "p2"],
        "excludeChildIds": ["other-child"],
        "title": "Source (2)",
        "providerTurnBindings": [None, '{"x": 1}'],
        "driverKind": "claude-code",
        "driverVersion": "2.1.0",
        # Attribution (law 9): the other operations' prefixes, and quarantine's scope.
        "otherPrefixes": [],
        "childIds": [],
    }
    assert _bytes(request.to_wire()) == _bytes(legacy)
    assert wm.ResolveRequest.from_wire(legacy) == request
    scoped = replace(request, other_prefixes=(("p1",),), child_ids=("c",))
    assert wm.ResolveRequest.from_wire(scoped.to_wire()) == scoped
    assert scoped.attributes(("p1", "p2")) and not scoped.attributes(("p1",))
    assert scoped.attributes(None) and request.attributes(None)  # unread: listed, undecided
    adopt = wm.ResolveAdopt(request, "child-1")
    assert _bytes(adopt.to_wire()) == _bytes({**legacy, "childId": "child-1"})
    assert wm.ResolveAdopt.from_wire({**legacy, "childId": "child-1"}) == adopt
    fork = request.fork_request()
    assert fork.provider_turn_ids == ("p1", "p2")
    assert fork.provider_turn_bindings == (None, '{"x": 1}')
    assert (fork.source, fork.target) == (request.source, request.target)


@pytest.mark.parametrize("read_error", ["absent", None, "app-server would not start"])
def test_an_inspection_answer_round_trips_with_or_without_a_read_error(
    read_error: str | None,
) -> None:
    child: dict[str, object] = {
        "providerSessionId": "child-1",
        "forkedFromId": "thread-1",
        "providerTurnIds": ["p1"],
        "turnsEqualPrefix": True,
        "readsFromOwnHome": False,
        "locations": ["source"],
    }
    if read_error != "absent":
        # The app-server drivers' key sits after the Turn ids (its place in their map).
        child = {
            **{k: child[k] for k in ("providerSessionId", "forkedFromId", "providerTurnIds")},
            "readError": read_error,
            **{k: child[k] for k in ("turnsEqualPrefix", "readsFromOwnHome", "locations")},
        }
    answer = {"children": [child], "quarantined": ["/h/src/quarantine/op-1/a.jsonl"]}
    inspection = wm.ResolveInspection.from_wire(answer)
    assert _bytes(inspection.to_wire()) == _bytes(answer)
    assert inspection.children[0].turns_equal_prefix is True
    quarantined = wm.ResolveQuarantined(("/h/tgt/quarantine/op-1/b.jsonl",))
    assert wm.ResolveQuarantined.from_wire(quarantined.to_wire()) == quarantined


def test_an_inspection_whose_children_are_not_maps_is_malformed() -> None:
    with pytest.raises(wm.MalformedMessage):
        wm.ResolveInspection.from_wire({"children": ["child-1"]})


def test_the_resolver_verdict_reads_typed_children() -> None:
    from actors.fork_resolve import verdict

    def child(**over: object) -> wm.ResolvedChild:
        raw = {"providerSessionId": "c", "forkedFromId": "thread-1", "turnsEqualPrefix": True}
        return wm.ResolvedChild.from_wire({**raw, **over})

    assert verdict((), "thread-1") == "absent"
    assert verdict((child(),), "thread-1") == "adoptable"
    assert verdict((child(turnsEqualPrefix="yes"),), "thread-1") == "ambiguous"
    assert verdict((child(forkedFromId="x"),), "thread-1") == "ambiguous"
    assert verdict((child(), child()), "thread-1") == "ambiguous"
