"""Re-binding a lost provider binding, through the real daemon and tutti-agent: a settled
completed Turn whose provider binding the host never recorded (as when the
binding write failed) is re-bound from the provider's own history at the next runtime
preparation, by order and content, so later forks are not refused `provider_turn_missing`
for good; when two Turns could be the same provider turn, nothing is re-bound (fail closed)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from actors.rebind import CanonicalTurn, match_missing, prove_absent
from tests.support.daemon import WS, DaemonProcess, create_session, fork_params, run_turn
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.timeout(120)


def _unbind(home: Path, turn_ids: list[str]) -> None:
    """What a dropped `turn.started`/binding write left in the store (a stopped daemon's)."""
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        for turn_id in turn_ids:
            conn.execute(
                "UPDATE turns SET root_provider_turn_id = NULL, provider_turn_binding_json = NULL"
                " WHERE turn_id = ?",
                (turn_id,),
            )
    finally:
        conn.close()


def _fork(c: object, sid: str, turn_id: str) -> tuple[int, dict]:
    return c.call_raw(  # type: ignore[attr-defined, no-any-return]
        "fork.create",
        fork_params(WS, sid, turn_id),
        timeout=30,
    )


def test_lost_binding_is_rebound_from_provider_history(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client()
    sid = create_session(c)["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("alpha", "beta", "gamma")]
    d.stop()
    lost = turns[1]
    _unbind(home, [lost["turnId"]])
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        new = run_turn(c, sid, "delta")  # the next runtime preparation re-binds
        status, body = _fork(c, sid, new["turnId"])
        assert status in (200, 202), body
        timeline = c.call(
            "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 100}
        )["turns"]
        rebound = next(t for t in timeline if t["turnId"] == lost["turnId"])
        assert rebound["rootProviderTurnId"] == lost["rootProviderTurnId"]
        assert rebound["providerForkBindingState"] == "bound"
    finally:
        d.stop()
    assert_invariants(home)


def test_ambiguous_lost_bindings_stay_unbound(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    c = d.client()
    sid = create_session(c)["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("same", "same", "other")]
    d.stop()
    _unbind(home, [turns[0]["turnId"], turns[1]["turnId"]])
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        new = run_turn(c, sid, "next")
        status, body = _fork(c, sid, new["turnId"])
        assert status == 409, body
        assert body["params"]["forkBoundaryReason"] == "provider_turn_missing"
        timeline = c.call(
            "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 100}
        )["turns"]
        assert [t["rootProviderTurnId"] for t in timeline[:2]] == [None, None]
    finally:
        d.stop()


def _p(pid: str, text: str) -> dict:
    return {"providerTurnId": pid, "userText": text}


def test_matcher_binds_only_the_unambiguous() -> None:
    a = CanonicalTurn("a", "p1", "x", False)
    b = CanonicalTurn("b", None, "y", True)
    c = CanonicalTurn("c", "p3", "z", False)
    provider = [_p("p1", "x"), _p("p2", "y"), _p("p3", "z")]
    assert match_missing([a, b, c], provider) == {"b": "p2"}
    # Content must agree.
    assert match_missing([a, CanonicalTurn("b", None, "other", True), c], provider) == {}
    # Two candidates in the window (an unbound interrupted provider turn with the same text).
    twice = [_p("p1", "x"), _p("p2", "y"), _p("p2b", "y"), _p("p3", "z")]
    assert match_missing([a, b, c], twice) == {}
    # Anchors out of order: fail closed.
    assert match_missing([c, b, a], provider) == {}


def test_a_final_history_proves_absent_only_what_no_provider_turn_can_be() -> None:
    a = CanonicalTurn("a", "p1", "x", False)
    lost = CanonicalTurn("lost", None, "y", True, unanswered=True)
    c = CanonicalTurn("c", "p3", "z", False)
    provider = [_p("p1", "x"), _p("p3", "z")]
    # Every provider turn is a bound Turn's, in order: the unanswered missing Turn is absent.
    assert prove_absent([a, lost, c], provider, {}) == ["lost"]
    # A completed one ran to its answer at the provider: never proven absent.
    done = CanonicalTurn("lost", None, "y", True)
    assert prove_absent([a, done, c], provider, {}) == []
    # A provider turn with the same text, matched or not: no mark.
    same = [_p("p1", "x"), _p("p2", "y"), _p("p3", "z")]
    assert prove_absent([a, lost, c], same, match_missing([a, lost, c], same)) == []
    # ... nor with another text (it could still be the Turn), nor two candidates (ambiguity).
    other = [_p("p1", "x"), _p("p2", "other"), _p("p3", "z")]
    assert prove_absent([a, lost, c], other, match_missing([a, lost, c], other)) == []
    twice = [_p("p1", "x"), _p("p2", "y"), _p("p2b", "y"), _p("p3", "z")]
    assert prove_absent([a, lost, c], twice, match_missing([a, lost, c], twice)) == []
    # Anchors out of order, a bound Turn the history lacks (another thread), a duplicate
    # provider id, or no anchor at all: nothing is proven.
    assert prove_absent([c, lost, a], provider, {}) == []
    assert prove_absent([a, lost, c], [_p("p1", "x")], {}) == []
    assert prove_absent([a, lost, c], [*provider, _p("p1", "x")], {}) == []
    assert prove_absent([lost], [], {}) == []
    # A matched Turn claims its provider turn: the other missing one is then proven absent.
    b = CanonicalTurn("b", None, "w", True, unanswered=True)
    with_b = [_p("p1", "x"), _p("p2", "w"), _p("p3", "z")]
    matches = match_missing([a, b, lost, c], with_b)
    assert matches == {"b": "p2"}
    assert prove_absent([a, b, lost, c], with_b, matches) == ["lost"]
