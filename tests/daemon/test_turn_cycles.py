"""A submitted and settled Turn leaves no reference cycle behind: reference counting alone frees
its state (`TurnState`), its checkpoint captures and the `Submit` that started it, so the
daemon's collector never has them to walk.

An in-process daemon (real store file, real worker and tutti-agent app-server, workspace
checkpoints on). The collector is off while the Turns run — the Session's first (its runtime
prepared: `session.start`), its second and the warm ones after — then one collection keeps its
garbage (`gc.DEBUG_SAVEALL`) and the test looks for any object of a Turn in it."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.checkpoints import Capture
from actors.messages import Submit
from actors.session_base import DurableWrite, TurnState
from agenthost.daemon import Daemon
from tests.support.daemon import create_session, run_turn, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)

# What a Turn's cycle held (the closures of its submit and of its `before` capture).
TURN_KINDS = (TurnState, Submit, Capture, DurableWrite)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _unsettled(turn_ids: set[str]) -> list[str]:
    """The Turns of `turn_ids` whose state does not yet say its settlement is durable (its
    actor has not dropped it). Only this test's Turns: a TurnState another test of the same
    worker process left alive is not this daemon's."""
    return [
        o.turn_id
        for o in gc.get_objects()
        if isinstance(o, TurnState) and o.turn_id in turn_ids and not o.settled
    ]


def test_settled_turns_leave_no_reference_cycle(running: tuple[Daemon, Client]) -> None:
    _, c = running
    turns = 5
    gc.collect()
    gc.disable()
    try:
        sid = create_session(c, title="no cycles")["agentSessionId"]
        turn_ids: set[str] = set()
        for i in range(turns):
            turn = run_turn(c, sid, f"turn {i}")
            assert turn["outcome"] == "completed"
            turn_ids.add(turn["turnId"])
        # Each settled Turn is dropped by its actor once its settlement is durable.
        try:
            wait_for(lambda: not _unsettled(turn_ids), 30)
        except AssertionError:
            raise AssertionError(f"Turns never marked settled: {_unsettled(turn_ids)}") from None
        garbage = _collected()
    finally:
        gc.enable()
    left = Counter(type(o).__qualname__ for o in garbage if isinstance(o, TURN_KINDS))
    assert not left, f"{turns} settled Turns left cycles holding {dict(left)}"


def _collected() -> list[object]:
    """One full collection, keeping what it found unreachable (the objects of cycles)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _turn_in_a_cycle() -> None:
    state = TurnState("t")
    state.after_before.append(lambda: None if state.settling else None)


def test_the_check_sees_a_cycle_that_holds_a_turn() -> None:
    """The collection above would show a Turn's cycle: one made here on purpose is found."""
    gc.disable()
    try:
        _turn_in_a_cycle()
        garbage = _collected()
    finally:
        gc.enable()
    assert any(isinstance(o, TurnState) for o in garbage)
