"""The fork operation state machine as data (seed 000 §6.1, ARCHITECTURE.md "Contract decision").

One home for the statuses, the allowed
transitions, the active set (the source fence holds), the barrier rule (a new request identity
on the same source + boundary Turn gets the original operation back, whatever its point
kind) and the restart rule (what a
leftover of a dead process becomes). The store generates its SQL `IN (...)` lists from these
sets and each transition's guard from `SOURCES`; recovery and the saga ask `after_restart`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum


class ForkStatus(StrEnum):
    """Internal fork operation status (seed 000 §6.1).

    prepared → dispatching → provider_accepted → committed;
    prepared|dispatching → failed; dispatching → unknown;
    unknown → provider_accepted (fork.resolve adopt) | abandoned (fork.resolve abandon).
    """

    PREPARED = "prepared"
    DISPATCHING = "dispatching"
    PROVIDER_ACCEPTED = "provider_accepted"
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    # Terminal: an `unknown` operation settled by `fork.resolve` abandon.
    ABANDONED = "abandoned"


TRANSITIONS: Mapping[ForkStatus, frozenset[ForkStatus]] = {
    ForkStatus.PREPARED: frozenset({ForkStatus.DISPATCHING, ForkStatus.FAILED}),
    ForkStatus.DISPATCHING: frozenset(
        {ForkStatus.PROVIDER_ACCEPTED, ForkStatus.FAILED, ForkStatus.UNKNOWN}
    ),
    ForkStatus.PROVIDER_ACCEPTED: frozenset({ForkStatus.COMMITTED}),
    ForkStatus.COMMITTED: frozenset(),
    ForkStatus.FAILED: frozenset(),
    # Only an explicit `fork.resolve` with evidence leaves `unknown`; the saga and recovery
    # never do (law 1: never redispatched).
    ForkStatus.UNKNOWN: frozenset({ForkStatus.PROVIDER_ACCEPTED, ForkStatus.ABANDONED}),
    ForkStatus.ABANDONED: frozenset(),
}
"""`TRANSITIONS[a]` holds every status `a` may move to."""

ACTIVE: frozenset[ForkStatus] = frozenset(
    {ForkStatus.PREPARED, ForkStatus.DISPATCHING, ForkStatus.PROVIDER_ACCEPTED}
)
"""The source fence holds while an operation is in one of these (law 3)."""

TERMINAL: frozenset[ForkStatus] = frozenset(
    {ForkStatus.COMMITTED, ForkStatus.FAILED, ForkStatus.UNKNOWN, ForkStatus.ABANDONED}
)
"""Where a fork saga ends: the statuses it never moves on from by itself (`unknown` included:
only `fork.resolve` leaves it)."""

NOT_A_FORK: frozenset[ForkStatus] = frozenset({ForkStatus.FAILED, ForkStatus.ABANDONED})
"""Operations that never became (and never will become) a child: they neither hold a boundary
nor count as a valid fork of their source (the child title's ordinal, seed 000 §5)."""

BARRIER_UNCONDITIONAL: frozenset[ForkStatus] = ACTIVE | {ForkStatus.UNKNOWN}
"""Statuses that hold the boundary barrier whatever the client has seen; a `committed`
operation also holds it until a client ACKs it (`holds_barrier`). The barrier is keyed on the
resolved boundary — source + Turn — whatever point kind (`throughTurn`, `latestSettled`)
asked for it (ARCHITECTURE.md law 8)."""


def sources_of(to: ForkStatus) -> tuple[ForkStatus, ...]:
    """Every status that may move to `to`, in declaration order (the guard of a transition)."""
    return tuple(s for s in ForkStatus if to in TRANSITIONS[s])


SOURCES: Mapping[ForkStatus, tuple[ForkStatus, ...]] = {to: sources_of(to) for to in ForkStatus}
"""`sources_of` of every status, generated once: the guard a transition's UPDATE reads."""


def can_transition(frm: ForkStatus, to: ForkStatus) -> bool:
    return to in TRANSITIONS[frm]


def after_restart(status: ForkStatus) -> ForkStatus | None:
    """What an operation left in `status` by a dead host process becomes: `prepared` → failed
    (never dispatched), `dispatching` → unknown (the request may have left; never redispatched),
    `provider_accepted` → committed (only the local commit is left). `None`: terminal already."""
    return _RESTART.get(status)


_RESTART: dict[ForkStatus, ForkStatus] = {
    ForkStatus.PREPARED: ForkStatus.FAILED,
    ForkStatus.DISPATCHING: ForkStatus.UNKNOWN,
    ForkStatus.PROVIDER_ACCEPTED: ForkStatus.COMMITTED,
}


def holds_barrier(status: ForkStatus, client_observed: bool) -> bool:
    """The barrier rule: active, `unknown`, or committed but not yet ACKed by a client."""
    if status in BARRIER_UNCONDITIONAL:
        return True
    return status is ForkStatus.COMMITTED and not client_observed


def sql_in(statuses: Iterable[ForkStatus]) -> str:
    """`('a', 'b', ...)` for a SQL `IN` clause, in declaration order (values are fixed enum
    literals, never user input)."""
    wanted = set(statuses)
    return "(" + ", ".join(f"'{s.value}'" for s in ForkStatus if s in wanted) + ")"


NOT_A_FORK_SQL = sql_in(NOT_A_FORK)
"""`('failed', 'abandoned')`."""

ACTIVE_SQL = sql_in(ACTIVE)
"""`('prepared', 'dispatching', 'provider_accepted')`."""


def sql_any(statuses: Iterable[ForkStatus]) -> str:
    """`status = 'a' OR status = 'b' ...`, in declaration order: what `status IN (...)` tests,
    without the ephemeral index SQLite builds for a list of more than two constants at each run
    of a statement (schema v20)."""
    wanted = set(statuses)
    return " OR ".join(f"status = '{s.value}'" for s in ForkStatus if s in wanted)


BARRIER_RULE_SQL = (
    f"({sql_any(BARRIER_UNCONDITIONAL)}"
    f" OR (status = '{ForkStatus.COMMITTED.value}' AND client_observed_at_ms IS NULL))"
)
"""The barrier rule as a SQL predicate over a `fork_operations` row's status and ACK time
(`holds_barrier`): what its `barrier` column equals (schema v22's CHECK refuses any other value;
the invariant checker's `barrier_flag` law reports a row where it does not). The WHERE of the
barrier's partial index at v20 and v21."""

BARRIER_SQL = "barrier = 1"
"""The barrier's set as a SQL predicate: the flag kept equal to `BARRIER_RULE_SQL`, which a
fork's status steps never write (it moves only at prepare, `failed`, `abandoned` and the ACK),
so SQLite leaves the partial index `fork_operations_barrier_held` alone at each of them. The
index's WHERE to the letter (schema v22), which a query repeats so the planner may use it."""

BARRIER_RELEASE_SQL = ", barrier = 0"
"""What an UPDATE that moves an operation out of the barrier's set (`failed`, `abandoned`, the
ACK) also assigns, in the same statement: the column's CHECK refuses the move without it."""


class Stage:
    """Where an operation stands for its source (schema v23's `fork_operations.stage`): the
    column `fork_operations_by_source` keys on instead of the status, so a fork's dispatching
    and provider_accepted steps, which do not change it, leave that index alone."""

    NOT_A_FORK = 0
    """`failed`, `abandoned`: never became a child (`NOT_A_FORK`)."""
    SETTLED = 1
    """`committed`, `unknown`: a fork of its source (the title's count) no longer holding its
    fence."""
    ACTIVE = 2
    """`prepared`, `dispatching`, `provider_accepted`: holds its source's fence (`ACTIVE`)."""


def stage_of(status: ForkStatus) -> int:
    """The `stage` a row in `status` has (schema v23's CHECK: `STAGE_RULE_SQL`)."""
    if status in ACTIVE:
        return Stage.ACTIVE
    return Stage.NOT_A_FORK if status in NOT_A_FORK else Stage.SETTLED


STAGE_RULE_SQL = (
    f"(CASE WHEN {sql_any(ACTIVE)} THEN {Stage.ACTIVE}"
    f" WHEN {sql_any(NOT_A_FORK)} THEN {Stage.NOT_A_FORK} ELSE {Stage.SETTLED} END)"
)
"""`stage_of` as a SQL expression over a `fork_operations` row's status: what its `stage`
column equals (schema v23's CHECK refuses any other value; the invariant checker's
`stage_column` law reports a row where it does not)."""

STAGE_ACTIVE_SQL = f"stage = {Stage.ACTIVE}"
"""The operations holding their source's fence (`status IN ACTIVE_SQL`), as a seek in
`fork_operations_by_source (workspace, source, stage)`: the fence probe's predicate."""

STAGE_A_FORK_SQL = f"stage > {Stage.NOT_A_FORK}"
"""The operations that are or may become their source's child (`status NOT IN
NOT_A_FORK_SQL`), as a range of `fork_operations_by_source`: the title's count and the
prefixes that attribute a provider child."""


def stage_assignment(frm: ForkStatus, to: ForkStatus) -> str:
    """What an UPDATE moving a row from `frm` to `to` also assigns: `, stage = N` when the stage
    moves (the CHECK refuses the move without it), nothing when it does not (a statement that
    names `stage` rewrites the index's entry even when its value stays)."""
    new = stage_of(to)
    return "" if stage_of(frm) == new else f", stage = {new}"
