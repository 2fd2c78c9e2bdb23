"""The pure view rules the CLI and the GUI share (seed 000 §9): when a Turn's Fork action is
shown, enabled or hidden; where the "continued from" divider goes; the lineage tree order."""

from __future__ import annotations

from typing import Any

import pytest

from client.session_client import (
    ForkAction,
    divider_after,
    fork_action,
    resolve_turn,
    session_tree,
)

pytestmark = pytest.mark.timeout(10)


def session(
    sid: str = "s", *, can: bool = True, kind: str = "root", source: str | None = None
) -> dict[str, Any]:
    return {
        "agentSessionId": sid,
        "kind": kind,
        "createdAtUnixMs": 0,
        "lifecycleCapabilities": {"fork": False, "forkThroughTurn": can},
        "forkedFrom": None
        if source is None
        else {"sourceAgentSessionId": source, "targetTurnId": "t2", "operationId": "op"},
    }


def turn(tid: str = "t", *, phase: str = "settled", binding: str = "bound", seq: int = 1) -> Any:
    return {"turnId": tid, "sequence": seq, "phase": phase, "providerForkBindingState": binding}


@pytest.mark.parametrize(
    ("sess", "t", "pending", "expected"),
    [
        (session(), turn(), False, ForkAction.ENABLED),
        (session(), turn(), True, ForkAction.DISABLED),
        (session(can=False), turn(), False, ForkAction.HIDDEN),
        (session(kind="child"), turn(), False, ForkAction.HIDDEN),
        (session(), turn(phase="active", binding="unavailable"), False, ForkAction.HIDDEN),
        (session(), turn(binding="recovery_required"), False, ForkAction.HIDDEN),
        (session(), turn(binding="unavailable"), False, ForkAction.HIDDEN),
        (session(can=False), turn(), True, ForkAction.HIDDEN),
    ],
)
def test_fork_action_follows_capability_binding_and_pending(
    sess: dict[str, Any], t: dict[str, Any], pending: bool, expected: ForkAction
) -> None:
    assert fork_action(sess, t, pending) is expected


def test_divider_goes_after_the_boundary_turn_only_when_it_is_loaded() -> None:
    child = session("c", source="s")
    turns = [turn("t1", seq=1), turn("t2", seq=2), turn("t3", seq=3)]
    assert divider_after(child, turns) == 1
    assert divider_after(child, turns[:1]) is None  # not loaded: hidden, not at the end
    assert divider_after(session("r"), turns) is None  # a plain root has no divider


def test_session_tree_puts_children_under_their_source_and_orphans_at_the_root() -> None:
    rows = session_tree(
        [
            session("grandchild", source="child"),
            session("child", source="root"),
            session("root"),
            session("orphan", source="deleted"),
        ]
    )
    assert [(r.depth, r.session["agentSessionId"]) for r in rows] == [
        (0, "orphan"),
        (0, "root"),
        (1, "child"),
        (2, "grandchild"),
    ]


def test_turn_references_resolve_by_id_sequence_or_unique_prefix() -> None:
    turns = [turn("abc-1", seq=1), turn("abd-2", seq=2)]
    assert resolve_turn(turns, "abd-2") == "abd-2"
    assert resolve_turn(turns, "2") == "abd-2"
    assert resolve_turn(turns, "abc") == "abc-1"
    with pytest.raises(LookupError):
        resolve_turn(turns, "ab")
    with pytest.raises(LookupError):
        resolve_turn(turns, "9")


def test_a_busy_source_blocks_fork_with_its_reason() -> None:
    from client.session_client import fork_blocked

    settled = turn("t1", seq=1)
    running = {**turn("t2", phase="active", binding="unavailable", seq=2), "interactions": []}
    assert fork_action(session(), settled, pending=False, blocked=True) is ForkAction.BLOCKED
    # A fork in flight through this Turn still reads "Forking…" (DISABLED), not BLOCKED.
    assert fork_action(session(), settled, pending=True, blocked=True) is ForkAction.DISABLED
    assert fork_action(session(), running, pending=False, blocked=True) is ForkAction.HIDDEN
    assert fork_blocked({"activeTurnId": None}, [settled]) is None
    assert fork_blocked({"activeTurnId": "t2"}, [settled, running]) == (
        "Turn 2 is still running (source_turn_active)"
    )
    asking = {**running, "interactions": [{"status": "pending", "kind": "question"}]}
    assert fork_blocked({"activeTurnId": "t2"}, [settled, asking]) == (
        "Turn 2 is waiting for an answer (source_interaction_pending)"
    )


def test_interactions_and_errors_read_as_words() -> None:
    from client.session_client import format_interaction, turn_error_text

    approval = {"kind": "approval", "status": "resolved", "input": {"text": "ls"}}
    assert format_interaction({**approval, "output": {"decision": "approve"}}) == (
        "approval: ls  → approved"
    )
    question = {"kind": "question", "status": "resolved", "input": {"text": "colour?"}}
    assert format_interaction({**question, "output": {"text": "blue"}}) == (
        'question: colour?  → "blue"'
    )
    assert "pending" in format_interaction({**question, "status": "pending", "output": None})
    assert turn_error_text({"phase": "settled", "outcome": "failed", "error": "boom"}) == (
        "failed: boom"
    )
    assert turn_error_text({"phase": "settled", "outcome": "completed"}) is None
