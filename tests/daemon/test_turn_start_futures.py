"""A Turn's `turn.start` through the real worker port makes two futures, not three: the
supervisor's own and the one the Session actor waits on, the answer read as `TurnAccepted`
by the callback that settles it (no `read_answer` future and callback chained between)."""

from __future__ import annotations

import concurrent.futures
from concurrent.futures import Future
from typing import Any

import pytest

from agenthost.workers import SupervisorPort
from domain.worker_messages import TurnAccepted, TurnStart
from drivers.errors import WorkerError


class _Supervisor:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any], Future[dict[str, Any]]]] = []

    def request(
        self, provider: str, method: str, params: Any, timeout: float | None = 30.0
    ) -> Future[dict[str, Any]]:
        fut: Future[dict[str, Any]] = Future()
        self.sent.append((provider, method, dict(params), fut))
        return fut


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made = [0]
    init = Future.__init__

    def counted(self: Future[Any]) -> None:
        made[0] += 1
        init(self)

    monkeypatch.setattr(concurrent.futures.Future, "__init__", counted)
    return made


def test_a_turn_start_makes_two_futures_and_reads_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sup = _Supervisor()
    port = SupervisorPort(sup)  # type: ignore[arg-type]
    made = _counting(monkeypatch)
    out = port.start_turn("tutti-agent", TurnStart("ws/s", "t1", "hi"), 5.0)
    ((_, method, params, inner),) = sup.sent
    inner.set_result({"providerTurnId": "p1"})
    # Without the change: 3 (the supervisor's, `send`'s, `read_answer`'s).
    assert made[0] == 2
    assert method == "turn.start" and params["turnId"] == "t1"
    assert out.result(0) == TurnAccepted("p1")


def test_a_turn_starts_worker_error_and_unreadable_answer_still_reach_the_waiter() -> None:
    sup = _Supervisor()
    port = SupervisorPort(sup)  # type: ignore[arg-type]
    failed = port.start_turn("tutti-agent", TurnStart("ws/s", "t1", "hi"), 5.0)
    sup.sent[0][3].set_exception(WorkerError({"code": "x", "message": "no"}))
    assert type(failed.exception(0)).__name__ == "WorkerFailed"

    def bad(_result: Any) -> TurnAccepted:
        raise ValueError("not a TurnAccepted")

    with pytest.MonkeyPatch().context() as m:
        m.setattr(TurnAccepted, "from_wire", bad)
        unreadable = port.start_turn("tutti-agent", TurnStart("ws/s", "t2", "hi"), 5.0)
    sup.sent[1][3].set_result({})
    assert isinstance(unreadable.exception(0), ValueError)
