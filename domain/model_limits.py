"""How long a provider waits on its model: the time to the first byte of an answer and the
silence allowed between two pieces of a stream, per provider (`[providers.<name>]`), with the
`model_timeout` sentence every provider and the host's backstop use when one is exceeded.

The built-in tutti-agent keeps its own copy of the sentence (it imports nothing of ours); the
two are held together by the tests, which match the reason and the key names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODEL_TIMEOUT = "model_timeout"

FIRST_BYTE_KEY = "model_first_byte_seconds"
STREAM_IDLE_KEY = "model_stream_idle_seconds"
RETRIES_KEY = "model_retries"

# A model that has not begun to answer in half a minute is down, loading or behind a proxy
# that swallowed the request; one that has begun may pause longer (a long tool call, thinking).
DEFAULT_FIRST_BYTE_S = 30.0
DEFAULT_STREAM_IDLE_S = 120.0
DEFAULT_RETRIES = 0
"""The provider's own retries of a failed or silent request (each waits its own limit)."""

# The host's backstop fires this much after the provider's own limit, so the provider's own
# failure (which knows more) normally settles the Turn first.
BACKSTOP_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """A provider's limits on its model, in seconds (retries: a count)."""

    first_byte_s: float = DEFAULT_FIRST_BYTE_S
    stream_idle_s: float = DEFAULT_STREAM_IDLE_S
    retries: int = DEFAULT_RETRIES

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ModelLimits:
        """From a `[providers.<name>]` table (validated by the daemon); absent keys default."""

        def number(key: str, default: float) -> float:
            value = config.get(key)
            return float(value) if value is not None else default

        retries = config.get(RETRIES_KEY)
        return cls(
            first_byte_s=number(FIRST_BYTE_KEY, DEFAULT_FIRST_BYTE_S),
            stream_idle_s=number(STREAM_IDLE_KEY, DEFAULT_STREAM_IDLE_S),
            retries=int(retries) if retries is not None else DEFAULT_RETRIES,
        )

    @property
    def first_byte_budget_s(self) -> float:
        """The whole wait for a first byte, the provider's own retries included."""
        return self.first_byte_s * (1 + self.retries)


def seconds(value: float) -> str:
    return f"{value:g} s"


def first_byte_timeout(provider: str, endpoint: str | None, limit_s: float) -> str:
    """`model_timeout: codex model endpoint http://…/v1 sent nothing within 30 s of the request
    (model_first_byte_seconds)`: the reason, the provider, the endpoint, the limit and its key."""
    where = endpoint or "(the provider's default endpoint)"
    return (
        f"{MODEL_TIMEOUT}: {provider} model endpoint {where} sent nothing within "
        f"{seconds(limit_s)} of the request ({FIRST_BYTE_KEY})"
    )


def stream_idle_timeout(provider: str, endpoint: str | None, limit_s: float) -> str:
    """The same sentence for a stream that began and then went silent."""
    where = endpoint or "(the provider's default endpoint)"
    return (
        f"{MODEL_TIMEOUT}: {provider} model endpoint {where} stopped answering for "
        f"{seconds(limit_s)} in the middle of its reply ({STREAM_IDLE_KEY})"
    )


def stream_empty_timeout(provider: str, endpoint: str | None, limit_s: float) -> str:
    """The same sentence for a stream that opened and never carried a piece of the reply (a
    provider whose stream-idle limit also covers the wait for the first event)."""
    where = endpoint or "(the provider's default endpoint)"
    return (
        f"{MODEL_TIMEOUT}: {provider} model endpoint {where} opened its reply and then sent "
        f"nothing of it for {seconds(limit_s)} ({STREAM_IDLE_KEY})"
    )
