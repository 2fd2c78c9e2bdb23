"""Adapts the drivers' WorkerSupervisor to the actors' WorkerPort, translating the link's
typed failures into the three delivery facts the saga reasons about.

`WorkerUnavailable` → `NotDelivered` (never left the host); `WorkerLost`/`WorkerTimeout` →
`DeliveryUnknown` (may have happened); `WorkerError` → `WorkerFailed` (an answer). A
request that never left the host while its worker is restarting is retried until its
timeout — except a fork, whose saga records a confirmed non-dispatch as `failed`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from actors.ports import DeliveryUnknown, NotDelivered, WorkerFailed
from drivers.errors import WorkerError, WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.supervisor import WorkerSupervisor

RETRY_INTERVAL_S = 0.2
NO_RETRY_METHODS = frozenset({"fork"})
# Safe to send twice: a lost answer to one of these is retried like a refusal.
IDEMPOTENT_METHODS = frozenset({"session.start", "session.stop", "runtime.attest"})


class SupervisorPort:
    def __init__(self, supervisor: WorkerSupervisor) -> None:
        self.supervisor = supervisor

    def request(
        self, provider: str, method: str, params: Mapping[str, Any], timeout: float
    ) -> Future[dict[str, Any]]:
        out: Future[dict[str, Any]] = Future()
        deadline = time.monotonic() + timeout
        self._attempt(out, provider, method, dict(params), deadline)
        return out

    def _attempt(
        self,
        out: Future[dict[str, Any]],
        provider: str,
        method: str,
        params: dict[str, Any],
        deadline: float,
    ) -> None:
        remaining = max(0.1, deadline - time.monotonic())
        try:
            inner = self.supervisor.request(provider, method, params, remaining)
        except Exception as exc:  # noqa: BLE001 - refused before sending
            out.set_exception(NotDelivered(str(exc)))
            return

        def _retry() -> None:
            self._attempt(out, provider, method, params, deadline)

        def _done(f: Future[dict[str, Any]]) -> None:
            exc = f.exception()
            if exc is None:
                out.set_result(f.result())
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
