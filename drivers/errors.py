"""Typed errors of the host↔worker link and of the drivers (`domain.errors.HostError` kinds).

The supervisor fails a request's future with exactly one of these, so the saga can tell "never sent"
(`WorkerUnavailable`) from "sent, fate unknown" (`WorkerLost`, `WorkerTimeout`) from a typed answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.errors import HostError, InvalidRequest, ProviderError, Unavailable, status_for


class WorkerUnavailable(Unavailable):
    """The request never left the host: no worker, worker not ready, closing. Safe to retry."""

    default_reason = "worker_unavailable"


class WorkerLost(ProviderError):
    """The request was sent and the worker died (exit or silence) before answering: delivery
    unknown."""

    default_reason = "worker_lost"


class WorkerTimeout(ProviderError):
    """The request was sent and no answer came within its timeout: delivery unknown."""

    default_reason = "worker_timeout"


class WorkerError(HostError):
    """The worker answered `ok: false`; carries the worker's error map (`error`) and exposes its
    code/reason on the wire, so a driver's typed error crosses the process boundary intact."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        self.error: dict[str, Any] = dict(error)
        params = self.error.get("params")
        super().__init__(
            str(self.error.get("message") or "worker error"),
            reason=str(self.error.get("reason") or "internal_error"),
            params=params if isinstance(params, dict) else None,
        )
        # Instance values shadow the class defaults so `to_wire()` and `.status` carry the
        # worker's identity unchanged (law 7: typed errors end to end).
        self.code = str(self.error.get("code") or "internal")  # type: ignore[misc]
        self.retryable = bool(self.error.get("retryable", False))  # type: ignore[misc]
        self.status = status_for(self.code)  # type: ignore[misc]


class FailpointError(HostError):
    """Raised by a failpoint armed with `error` (fault-injection tests only)."""

    default_reason = "failpoint"


class DriverError(ProviderError):
    """A provider-side failure inside a driver (app-server died, bad answer, version gate)."""

    default_reason = "provider_error"


class UnknownProvider(InvalidRequest):
    default_reason = "unknown_provider"
