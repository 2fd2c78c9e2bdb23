"""The messages the HostActor and SessionActors exchange, and the reply callback they carry.

A reply is called exactly once with either a domain value or a `HostError` instance; the API
layer (agenthost/api.py) projects it onto the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from domain.turn_events import TurnEvent

Reply = Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class FollowUp:
    """Run `fn` on the actor's own thread (continuations of driver futures and timers).
    `reply`, when set, is the request's reply: answered with a typed error if `fn` raises."""

    fn: Callable[[], None]
    reply: Reply | None = None
    turn_event: bool = False
    """The provider's answer to a Turn's `turn.start`: it only queues that Turn's writes (its
    binding, the events that came before it), so the Turn's held writes may wait for it as
    for a driver event (`SessionActor.on_receive`)."""


@dataclass(frozen=True, slots=True)
class Mutate:
    """A plain store write serialised through the Session's actor (settings, title, goal…).

    `fn` is the write itself, closed over the caller's store (the API's): the actor only runs
    it in turn with the Session's other writes, and never needs the whole store for it."""

    fn: Callable[[], Any]
    reply: Reply
    stop_runtime: bool = False


@dataclass(frozen=True, slots=True)
class Submit:
    request_id: str
    text: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class Interrupt:
    turn_id: str
    reply: Reply
    # The Turn's `error` once it settles interrupted: who stopped it and why.
    why: str | None = None


@dataclass(frozen=True, slots=True)
class Respond:
    turn_id: str
    request_id: str
    response: Mapping[str, Any]
    reply: Reply
    # Who answered (`interaction.respond`'s `by`), recorded beside the answer, never sent on.
    by: str | None = None


@dataclass(frozen=True, slots=True)
class DriverEvent:
    """A turn event from the Session's worker, read from its wire map by the HostActor."""

    event: TurnEvent


@dataclass(frozen=True, slots=True)
class ForkCreate:
    request_id: str
    target_session_id: str
    turn_id: str
    reply: Reply
    # storage.models.ForkPointKind; `latest_settled` leaves turn_id "" (resolved at prepare).
    point_kind: str = "through_turn"
    # `shared` or `worktree` (the child gets a tree holding the fork Turn's checkpoint).
    workspace: str = "shared"


@dataclass(frozen=True, slots=True)
class ForkAdvance:
    """From `fork.get`: advance a non-terminal operation that no live saga owns."""

    operation_id: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class ForkReply:
    """A fork operation plus whether the saga is over (200) or still running (202)."""

    operation: Any
    final: bool


@dataclass(frozen=True, slots=True)
class RuntimeLost:
    """A provider's worker died: its live runtimes (and their active Turns) are gone."""

    provider: str
    reason: str
