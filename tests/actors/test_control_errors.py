"""How a worker's error reply to a turn control (interrupt, interaction answer) reaches the
client: a driver's typed 4xx keeps its status, reason and params; anything else is a 502."""

from __future__ import annotations

import pytest

from actors.ports import DeliveryUnknown, NotDelivered, WorkerFailed
from actors.provider_errors import control_error as _control_error
from domain.errors import ProviderError


@pytest.mark.parametrize(
    ("code", "reason", "status"),
    [
        ("conflict", "interaction_not_pending", 409),
        ("invalid_request", "invalid_argument", 400),
        ("not_found", "turn_not_found", 404),
    ],
)
def test_a_drivers_typed_4xx_keeps_its_status(code: str, reason: str, status: int) -> None:
    err = _control_error(
        WorkerFailed(
            {"code": code, "reason": reason, "message": "m", "params": {"field": "response.x"}}
        ),
        "interaction response failed",
    )
    assert (err.status, err.code, err.reason) == (status, code, reason)
    assert err.params == {"field": "response.x"}
    assert err.message == "interaction response failed: m"


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (
            WorkerFailed({"code": "internal", "reason": "internal_error", "message": "x"}),
            "internal_error",
        ),
        (
            WorkerFailed({"code": "provider_error", "reason": "provider_start_failed"}),
            "provider_start_failed",
        ),
        (NotDelivered("worker down"), "provider_unavailable"),
        (DeliveryUnknown("worker died"), "provider_lost"),
    ],
)
def test_everything_else_is_a_provider_error(exc: Exception, reason: str) -> None:
    err = _control_error(exc, "interrupt failed")
    assert isinstance(err, ProviderError)
    assert (err.status, err.reason) == (502, reason)
