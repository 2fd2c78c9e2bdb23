"""A worker's failure as the typed `HostError` a Session actor answers with.

One concern: translating what the worker port raises (`NotDelivered`, `DeliveryUnknown`,
`WorkerFailed`) into the error a client sees — a provider failure in general, or, for turn
controls, the driver's own 4xx verdict passed through with its status.
"""

from __future__ import annotations

from actors.ports import DeliveryUnknown, NotDelivered, WorkerFailed
from domain.errors import (
    Conflict,
    HostError,
    InvalidRequest,
    NotFound,
    ProviderError,
    ProviderNotCalled,
    RuntimeChanged,
    SessionBusy,
)

# A driver's client-side verdicts keep their status when they cross the worker link: an answer
# the provider no longer waits for is a 409, a malformed answer a 400, not a provider failure.
_PASSED_THROUGH: dict[str, type[HostError]] = {
    "invalid_request": InvalidRequest,
    "not_found": NotFound,
    "conflict": Conflict,
}


def control_error(exc: BaseException, what: str) -> HostError:
    """`provider_error` for turn controls (interrupt, interaction answers): a typed 4xx from
    the driver reaches the client as that 4xx, with its reason and params."""
    if isinstance(exc, WorkerFailed):
        cls = _PASSED_THROUGH.get(str(exc.error.get("code")))
        if cls is not None:
            params = exc.error.get("params")
            return cls(
                f"{what}: {exc.error.get('message')}",
                reason=str(exc.error.get("reason") or cls.default_reason),
                params=dict(params) if isinstance(params, dict) else None,
            )
    return provider_error(exc, what)


def runtime_changed(exc: BaseException) -> bool:
    """Whether the worker refused a request because it named a runtime generation that is no
    longer the live one (`RuntimeChanged`): refused before the provider saw anything."""
    return (
        isinstance(exc, WorkerFailed) and exc.error.get("reason") == RuntimeChanged.default_reason
    )


def provider_not_called(exc: BaseException) -> bool:
    """Whether the worker answered that its provider was never called (`ProviderNotCalled`:
    Claude Code's CLI could not start, or ended before it was handed the prompt)."""
    return (
        isinstance(exc, WorkerFailed)
        and exc.error.get("reason") == ProviderNotCalled.default_reason
    )


def provider_error(exc: BaseException, what: str) -> HostError:
    if isinstance(exc, HostError):
        return exc
    if isinstance(exc, NotDelivered):
        return ProviderError(
            f"{what}: provider worker unavailable: {exc}", reason="provider_unavailable"
        )
    if isinstance(exc, DeliveryUnknown):
        return ProviderError(f"{what}: provider worker lost: {exc}", reason="provider_lost")
    if isinstance(exc, WorkerFailed):
        error = exc.error
        if error.get("reason") == "agent_session_busy":
            return SessionBusy(str(error.get("message")))
        return ProviderError(
            f"{what}: {error.get('message')}", reason=str(error.get("reason") or "provider_error")
        )
    return ProviderError(f"{what}: {exc}")
