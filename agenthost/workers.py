"""Adapts the drivers' WorkerSupervisor to the actors' WorkerPort: each typed call leaves as
its method's params map and its answer is read back as its type, and the link's typed failures
become the three delivery facts the saga reasons about. Also which providers' workers the
daemon starts ahead of their first use (`providers_ahead`).

`WorkerUnavailable` → `NotDelivered` (never left the host); `WorkerLost`/`WorkerTimeout` →
`DeliveryUnknown` (may have happened); `WorkerError` → `WorkerFailed` (an answer). A
request that never left the host while its worker is restarting is retried until its
timeout — except a fork, whose saga records a confirmed non-dispatch as `failed`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar

from actors.ports import DeliveryUnknown, NotDelivered, WorkerFailed
from agenthost import providers_info
from domain.providers import PROVIDERS, TUTTI_AGENT
from domain.worker_messages import (
    Attestation,
    ForkRequest,
    ForkResult,
    HistoryRequest,
    HistoryTurn,
    InteractionRespond,
    ResolveAdopt,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
    RuntimeAttest,
    SessionHistory,
    SessionStart,
    SessionStarted,
    SessionStop,
    TurnAccepted,
    TurnInterrupt,
    TurnStart,
)
from drivers.errors import WorkerError, WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.supervisor import WorkerSupervisor

RETRY_INTERVAL_S = 0.2
NO_RETRY_METHODS = frozenset({ForkRequest.METHOD})
# Safe to send twice: a lost answer to one of these is retried like a refusal.
IDEMPOTENT_METHODS = frozenset({SessionStart.METHOD, SessionStop.METHOD, RuntimeAttest.METHOD})

T = TypeVar("T")


def read_answer(answer: Future[dict[str, Any]], parse: Callable[[dict[str, Any]], T]) -> Future[T]:
    """`answer` read as its type once it arrives; a delivery failure passes through unchanged
    and an answer without the type's shape fails the future (`MalformedMessage`)."""
    out: Future[T] = Future()

    def _done(f: Future[dict[str, Any]]) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            out.set_result(parse(f.result()))
        except Exception as parse_exc:  # noqa: BLE001 - the waiter always gets an outcome
            out.set_exception(parse_exc)

    answer.add_done_callback(_done)
    return out


def providers_ahead(tables: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The providers whose workers the daemon starts once it is ready: tutti-agent (it ships
    with the host) and each provider the configuration has a table for (`[providers.<name>]`,
    or Codex recorded by `agenthost providers install`), in that order, if its program is
    installed. One that is not is left out without a word: its first use answers
    `provider_not_installed`, as before."""
    names = [TUTTI_AGENT, *(name for name in tables if name != TUTTI_AGENT)]
    out: list[str] = []
    for name in names:
        if name not in PROVIDERS:
            continue
        try:
            path, _wanted = providers_info.program(name, tables.get(name, {}))
        except Exception:  # noqa: BLE001 - a provider that cannot be located is not started
            path = None
        if path is not None:
            out.append(name)
    return out


def _nothing(_result: dict[str, Any]) -> None:
    return None


def _as_is(result: dict[str, Any]) -> dict[str, Any]:
    return result


class SupervisorPort:
    """The actors' `WorkerPort` over the real supervisor."""

    def __init__(self, supervisor: WorkerSupervisor) -> None:
        self.supervisor = supervisor

    def attest(self, provider: str, request: RuntimeAttest, timeout: float) -> Future[Attestation]:
        return self._call(
            provider, request.METHOD, request.to_wire(), timeout, Attestation.from_wire
        )

    def start_session(
        self, provider: str, request: SessionStart, timeout: float
    ) -> Future[SessionStarted]:
        return self._call(
            provider, request.METHOD, request.to_wire(), timeout, SessionStarted.from_wire
        )

    def stop_session(self, provider: str, request: SessionStop, timeout: float) -> Future[None]:
        return self._call(provider, request.METHOD, request.to_wire(), timeout, _nothing)

    def history(
        self, provider: str, request: HistoryRequest, timeout: float
    ) -> Future[SessionHistory]:
        """The whole history, page by page (each page asked when the one before answered,
        each within `timeout`): its Turns joined in order, `final` only when every page said
        so. A page that fails fails the whole."""
        out: Future[SessionHistory] = Future()
        turns: list[HistoryTurn] = []
        finals: list[bool] = []

        def ask(after_index: int, cursor: str | None) -> None:
            page = replace(request, after_index=after_index, cursor=cursor)
            answer = self._call(
                provider, page.METHOD, page.to_wire(), timeout, SessionHistory.from_wire
            )
            answer.add_done_callback(functools.partial(answered, after_index))

        def answered(after_index: int, f: Future[SessionHistory]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
                return
            page = f.result()
            turns.extend(page.turns)
            finals.append(page.final)
            # A next page that would not move on (a worker's mistake) ends the paging.
            if page.next_index is not None and page.next_index > after_index:
                ask(page.next_index, page.cursor)
                return
            out.set_result(SessionHistory(tuple(turns), final=all(finals)))

        ask(request.after_index, request.cursor)
        return out

    def start_turn(self, provider: str, request: TurnStart, timeout: float) -> Future[TurnAccepted]:
        return self._call(
            provider, request.METHOD, request.to_wire(), timeout, TurnAccepted.from_wire
        )

    def interrupt_turn(self, provider: str, request: TurnInterrupt, timeout: float) -> Future[None]:
        return self._call(provider, request.METHOD, request.to_wire(), timeout, _nothing)

    def respond_interaction(
        self, provider: str, request: InteractionRespond, timeout: float
    ) -> Future[None]:
        return self._call(provider, request.METHOD, request.to_wire(), timeout, _nothing)

    def fork(self, provider: str, request: ForkRequest, timeout: float) -> Future[ForkResult]:
        return self._call(
            provider, request.METHOD, request.to_wire(), timeout, ForkResult.from_wire
        )

    def inspect_fork(
        self, provider: str, request: ResolveRequest, timeout: float
    ) -> Future[ResolveInspection]:
        return self._call(
            provider,
            ResolveRequest.INSPECT,
            request.to_wire(),
            timeout,
            ResolveInspection.from_wire,
        )

    def adopt_fork(
        self, provider: str, request: ResolveAdopt, timeout: float
    ) -> Future[ForkResult]:
        return self._call(
            provider, request.METHOD, request.to_wire(), timeout, ForkResult.from_wire
        )

    def quarantine_fork(
        self, provider: str, request: ResolveRequest, timeout: float
    ) -> Future[ResolveQuarantined]:
        return self._call(
            provider,
            ResolveRequest.QUARANTINE,
            request.to_wire(),
            timeout,
            ResolveQuarantined.from_wire,
        )

    def send(
        self, provider: str, method: str, params: Mapping[str, Any], timeout: float
    ) -> Future[dict[str, Any]]:
        """One worker method's params map over the link, retried while it provably never
        left (and, for the idempotent ones, when its answer was lost)."""
        return self._call(provider, method, dict(params), timeout, _as_is)

    def _call(
        self,
        provider: str,
        method: str,
        params: Mapping[str, Any],
        timeout: float,
        parse: Callable[[dict[str, Any]], T],
    ) -> Future[T]:
        """`method` sent (retried as `send` says), its answer read by `parse` on the thread
        that delivers it: one future the caller waits on beside the supervisor's own (no
        second future and callback of `read_answer` chained behind it). A delivery failure
        reaches the future as `send`'s would; an answer without the type's shape fails it
        (`MalformedMessage`), as `read_answer`'s would."""
        out: Future[T] = Future()
        self._attempt(out, provider, method, params, time.monotonic() + timeout, parse)
        return out

    def _attempt(
        self,
        out: Future[T],
        provider: str,
        method: str,
        params: Mapping[str, Any],
        deadline: float,
        parse: Callable[[dict[str, Any]], T],
    ) -> None:
        remaining = max(0.1, deadline - time.monotonic())
        try:
            inner = self.supervisor.request(provider, method, params, remaining)
        except Exception as exc:  # noqa: BLE001 - refused before sending
            out.set_exception(NotDelivered(str(exc)))
            return

        def _retry() -> None:
            self._attempt(out, provider, method, params, deadline, parse)

        def _done(f: Future[dict[str, Any]]) -> None:
            exc = f.exception()
            if exc is None:
                try:
                    parsed = parse(f.result())
                except Exception as parse_exc:  # noqa: BLE001 - the waiter always gets an outcome
                    out.set_exception(parse_exc)
                else:
                    out.set_result(parsed)
            elif isinstance(exc, WorkerUnavailable) or (
                isinstance(exc, WorkerLost) and method in IDEMPOTENT_METHODS
            ):
                if (
                    method not in NO_RETRY_METHODS
                    and time.monotonic() + RETRY_INTERVAL_S < deadline
                ):
                    # Never sent (or idempotent): try again once the worker is back.
                    timer = threading.Timer(RETRY_INTERVAL_S, _retry)
                    timer.daemon = True
                    timer.start()
                elif isinstance(exc, WorkerLost):
                    out.set_exception(DeliveryUnknown(str(exc)))
                else:
                    out.set_exception(NotDelivered(str(exc)))
            elif isinstance(exc, WorkerLost | WorkerTimeout):
                out.set_exception(DeliveryUnknown(str(exc)))
            elif isinstance(exc, WorkerError):
                out.set_exception(WorkerFailed(exc.error))
            else:
                out.set_exception(DeliveryUnknown(f"{type(exc).__name__}: {exc}"))

        inner.add_done_callback(_done)
