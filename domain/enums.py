"""Enums that more than one layer speaks, defined once here and imported from here."""

from __future__ import annotations

from enum import StrEnum


class DeliveryDisposition(StrEnum):
    """What the host may conclude about a provider fork (seed 000 §7.1)."""

    NOT_STARTED = "not_started"
    """Failed before the provider call was sent: certainly no provider child. Host → failed."""
    REJECTED = "rejected"
    """The provider answered with an explicit JSON-RPC/SDK error. Host → failed."""
    UNKNOWN = "unknown"
    """Sent, then timeout/disconnect/unverifiable answer/binder failure. Host → unknown, never
    redispatched."""
    ACCEPTED = "accepted"
    """A verified child exists and its provider state is bound. Host → provider_accepted."""


class ProviderStateBindingMode(StrEnum):
    """How the child's provider state becomes independently resumable (seed 000 §7).

    - `host_copy`: the host's binder copies the child's provider state into the child's home;
      the provider must return the exact frozen ordered prefix of provider Turn ids.
    - `provider_owned`: the provider keeps the state (Claude SDK); it remaps Turn identities and
      must return a binding for at least the selected Turn.
    """

    HOST_COPY = "host_copy"
    PROVIDER_OWNED = "provider_owned"


class TurnOutcome(StrEnum):
    """How a settled Turn ended."""

    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
