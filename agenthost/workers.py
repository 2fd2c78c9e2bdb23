"""Adapts the drivers' WorkerSupervisor to the actors' WorkerPort, translating the link's
typed failures into the three delivery facts the saga reasons about.

`WorkerUnavailable` → `NotDelivered` (never left the host); `WorkerLost`/`WorkerTimeout` →
`DeliveryUnknown` (may have happened); `WorkerError` → `WorkerFailed` (an answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from actors.ports import DeliveryUnknown, NotDelivered, WorkerFailed
from drivers.errors import WorkerError, WorkerLost, WorkerTimeout, WorkerUnavailable
from drivers.supervisor import WorkerSupervisor


class SupervisorPort:
    def __init__(self, supervisor: WorkerSupervisor) -> None:
        self.supervisor = supervisor

    def request(
        self, provider: str, method: str, params: Mapping[str, Any], timeout: float
    ) -> Future[dict[str, Any]]:
        out: Future[dict[str, Any]] = Future()
        try:
            inner = self.supervisor.request(provider, method, dict(params), timeout)
        except Exception as exc:  # noqa: BLE001 - refused before sending
            out.set_exception(NotDelivered(str(exc)))
            return out

        def _done(f: Future[dict[str, Any]]) -> None:
            exc = f.exception()
            if exc is None:
                out.set_result(f.result())
            elif isinstance(exc, WorkerUnavailable):
                out.set_exception(NotDelivered(str(exc)))
            elif isinstance(exc, WorkerLost | WorkerTimeout):
                out.set_exception(DeliveryUnknown(str(exc)))
            elif isinstance(exc, WorkerError):
                out.set_exception(WorkerFailed(exc.error))
            else:
                out.set_exception(DeliveryUnknown(f"{type(exc).__name__}: {exc}"))

        inner.add_done_callback(_done)
        return out
