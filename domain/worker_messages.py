"""The typed messages between the host and its driver workers, standard library only: the fork
request and answer (seed 000 §7, §7.1), fork.resolve's inspect / adopt / quarantine requests and
answers, and the turn events a driver streams (docs/design/internals.md "Turn
events").

Both ends use these types: the saga builds a `ForkRequest` and reads a `ForkResult`, the worker
hands the driver a `ForkRequest` and sends its `ForkResult`; fork.resolve sends a
`ResolveRequest` / `ResolveAdopt` and reads a `ResolveInspection` / `ForkResult` /
`ResolveQuarantined`, which the worker's resolution handlers take and give; a driver builds
its turn events as `TurnEvent`s, the worker sends them, and the Session actor reads them as such
(the host parses each once, at its end of the link). `to_wire`/`from_wire` convert
at the link (the msgpack maps of `transport/worker_link.py` are unchanged, key for key).

The types live by concern: `domain.fork_messages` (the fork and `MalformedMessage`),
`domain.resolve_messages` (fork.resolve), `domain.turn_events` (the turn events); this module
gathers them under the one name both ends import.
"""

from domain.fork_messages import (
    ForkBinding,
    ForkChild,
    ForkRequest,
    ForkResult,
    ForkSource,
    ForkTarget,
    MalformedMessage,
)
from domain.resolve_messages import (
    ResolveAdopt,
    ResolvedChild,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from domain.turn_events import (
    InteractionRequested,
    MessageDelta,
    TurnActivity,
    TurnBindingMoved,
    TurnCompleted,
    TurnEvent,
    TurnItem,
    TurnStarted,
    turn_event_from_wire,
)

__all__ = [
    "ForkBinding",
    "ForkChild",
    "ForkRequest",
    "ForkResult",
    "ForkSource",
    "ForkTarget",
    "InteractionRequested",
    "MalformedMessage",
    "MessageDelta",
    "ResolveAdopt",
    "ResolveInspection",
    "ResolveQuarantined",
    "ResolveRequest",
    "ResolvedChild",
    "TurnActivity",
    "TurnBindingMoved",
    "TurnCompleted",
    "TurnEvent",
    "TurnItem",
    "TurnStarted",
    "turn_event_from_wire",
]
