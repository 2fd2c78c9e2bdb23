"""The wire projection of store values (PROTOCOL.md "Objects"): Session, Turn, Message,
Interaction, Operation and Lineage as camelCase maps.

Capabilities are projected from the persisted runtime attestation through the provider
catalog, so projecting never spawns a process.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast, get_args

from actors.fork_saga import full_session_capable
from actors.ports import BindingState, ProviderCatalog
from protocol import objects as wire
from protocol.methods import LineageResult
from storage.lineage_tree import LineageAncestor, LineageNode, LineageTree, Truncation
from storage.models import (
    ForkOperation,
    ForkPointKind,
    Interaction,
    Lineage,
    Message,
    Session,
    Turn,
)
from storage.rows import json_column

L = TypeVar("L", bound=str)


def _one_of(options: tuple[L, ...], value: str) -> L:
    """`value` as the wire's closed set of words it belongs to: the store's columns are
    checked against the same words when written, so a miss is a broken store."""
    for option in options:
        if option == value:
            return option
    raise ValueError(f"{value!r} is none of {options}")


def _one_of_or_none(options: tuple[L, ...], value: str | None) -> L | None:
    return None if value is None else _one_of(options, value)


def lineage(value: Lineage | None) -> wire.Lineage | None:
    if value is None:
        return None
    return {
        "sourceAgentSessionId": value.source_session_id,
        "sourceTurnId": value.source_turn_id,
        "targetTurnId": value.target_turn_id,
        "operationId": value.operation_id,
        "forkedAtUnixMs": value.forked_at_ms,
    }


def capabilities(value: Session, catalog: ProviderCatalog) -> tuple[bool, bool]:
    """`(forkThroughTurn, forkFullSession)` of `value`: a child is neither; a root asks its
    catalog once where the catalog answers both (`Catalog.fork_capabilities`), else each."""
    if value.kind != "root":
        return False, False
    both = getattr(catalog, "fork_capabilities", None)
    if both is not None:
        through, full = both(value.provider, value.runtime_context)
        return bool(through), bool(full)
    return (
        catalog.fork_through_turn_capable(value.provider, value.runtime_context),
        full_session_capable(catalog, value.provider, value.runtime_context),
    )


def session(value: Session, catalog: ProviderCatalog) -> wire.Session:
    fork_through_turn, full = capabilities(value, catalog)
    return {
        "workspaceId": value.workspace_id,
        "agentSessionId": value.session_id,
        "kind": _one_of(("root", "child"), value.kind),
        "provider": value.provider,
        "providerSessionId": value.provider_session_id,
        "title": value.title,
        "cwd": value.cwd,
        "settings": dict(value.settings),
        "model": value.model,
        "pinned": value.pinned,
        "goal": value.goal,
        "activeTurnId": value.active_turn_id,
        "parentAgentSessionId": value.parent_session_id,
        "parentTurnId": value.parent_turn_id,
        "createdAtUnixMs": value.created_at_ms,
        "updatedAtUnixMs": value.updated_at_ms,
        # `fork` gates the whole-Session entry (seed 000 §3.2, §11 step 5): true only where the
        # driver declares full-Session support; `forkFullSession` is its alias for old clients.
        "lifecycleCapabilities": {
            "fork": full,
            "forkThroughTurn": fork_through_turn,
            "forkFullSession": full,
        },
        "forkedFrom": lineage(value.lineage),
    }


def message(value: Message) -> wire.Message:
    return {
        "messageId": value.message_id,
        "turnId": value.turn_id,
        "kind": value.kind,
        "text": value.text,
        "payload": dict(value.payload),
        "version": value.version,
    }


def message_of_row(r: Sequence[Any]) -> wire.Message:
    """`message` of a Message row (`storage.rows.MESSAGE_COLUMNS` first) with no `Message`
    value between: the same map `message(message_from_row(r))` gives."""
    payload = r[4]
    return {
        "messageId": r[0],
        "turnId": r[1],
        "kind": r[2],
        "text": r[3],
        "payload": {} if payload == "{}" else dict(json_column(payload)),
        "version": r[5],
    }


def interaction(value: Interaction) -> wire.Interaction:
    return {
        "requestId": value.request_id,
        "turnId": value.turn_id,
        "kind": _one_of(("approval", "question", "plan"), value.kind),
        "status": _one_of(("pending", "resolved", "superseded"), value.status),
        "input": dict(value.input),
        "output": None if value.output is None else dict(value.output),
    }


def turn(value: Turn, provider: str, catalog: ProviderCatalog) -> wire.Turn:
    return _turn(
        provider,
        catalog,
        value.turn_id,
        value.sequence,
        value.phase,
        value.outcome,
        value.error,
        value.root_provider_turn_id,
        value.provider_turn_binding_json,
        value.final_assistant_message_id,
        [message(m) for m in value.messages],
        value.interactions,
        value.created_at_ms,
        value.settled_at_ms,
        value.checkpoint_json,
        value.host_only,
    )


def turn_of_row(
    r: Sequence[Any],
    message_rows: Sequence[Sequence[Any]],
    interactions: Sequence[Interaction],
    provider: str,
    catalog: ProviderCatalog,
) -> wire.Turn:
    """`turn` of a Turn row (`storage.rows.TURN_COLUMNS`) with its Message rows and
    Interactions (a `storage.history.TimelinePage`'s), no `Turn` or `Message` value between:
    the same map `turn(turn_from_row(r, messages, interactions), ...)` gives."""
    return _turn(
        provider,
        catalog,
        r[2],
        r[3],
        r[5],
        r[6],
        r[10],
        r[7],
        r[8],
        r[9],
        list(map(message_of_row, message_rows)),
        interactions,
        r[11],
        r[12],
        r[13],
        bool(r[14]),
    )


def _turn(
    provider: str,
    catalog: ProviderCatalog,
    turn_id: str,
    sequence: int,
    phase: str,
    outcome: str | None,
    error: str | None,
    root_provider_turn_id: str | None,
    binding_json: str | None,
    final_assistant_message_id: str | None,
    messages: list[wire.Message],
    interactions: Sequence[Interaction],
    created_at_ms: int,
    settled_at_ms: int | None,
    checkpoint_json: str | None,
    host_only: bool,
) -> wire.Turn:
    state = catalog.binding_state(provider, root_provider_turn_id, binding_json)
    # The closed sets by dict lookups and the lists by `map`, not by helper and comprehension
    # frames: a timeline page projects up to 100 Turns on the read pool, ~6 Python calls a
    # Turn fewer (tests/daemon/test_projection_calls.py).
    wire_phase = _PHASES.get(phase)
    if wire_phase is None:
        raise ValueError(f"{phase!r} is none of {tuple(_PHASES)}")
    wire_outcome = None if outcome is None else _OUTCOMES.get(outcome)
    if outcome is not None and wire_outcome is None:
        raise ValueError(f"{outcome!r} is none of {tuple(_OUTCOMES)}")
    return {
        "turnId": turn_id,
        "sequence": sequence,
        "phase": wire_phase,
        "outcome": wire_outcome,
        "error": error,
        "errorReason": error_reason(error) if error else None,
        "rootProviderTurnId": root_provider_turn_id,
        # An active Turn is not a fork boundary yet: "bound" shows as "unavailable" until it
        # settles.
        "providerForkBindingState": (
            _STATE_VALUES[state]
            if wire_phase == "settled" or state != BindingState.BOUND
            else "unavailable"
        ),
        "finalAssistantMessageId": final_assistant_message_id,
        "messages": messages,
        "interactions": list(map(interaction, interactions)) if interactions else [],
        "createdAtUnixMs": created_at_ms,
        "settledAtUnixMs": settled_at_ms,
        # The Turn's workspace checkpoint record (docs/design/workspace.md), null if none.
        "workspace": _workspace(checkpoint_json) if checkpoint_json else None,
        # The provider never got it (docs/design/store.md, v24): in no fork's provider prefix.
        "hostOnly": host_only,
    }


_PHASES: dict[str, wire.TurnPhase] = {"active": "active", "settled": "settled"}
_OUTCOMES: dict[str, wire.TurnOutcome] = {
    "completed": "completed",
    "interrupted": "interrupted",
    "failed": "failed",
}
_STATE_VALUES: dict[BindingState, wire.BindingState] = {
    BindingState.BOUND: "bound",
    BindingState.RECOVERY_REQUIRED: "recovery_required",
    BindingState.UNAVAILABLE: "unavailable",
}


def _workspace(text: str | None) -> wire.TurnWorkspace | None:
    if not text:
        return None
    try:
        # The record the daemon's checkpoint code wrote in this shape (docs/design/workspace.md);
        # typed by its annotation, not `typing.cast` (a Python call per Turn of a page).
        value: wire.TurnWorkspace | None = json_column(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


_TURN_REASON = re.compile(
    r"\b(model_unreachable|model_auth_failed|model_timeout"
    r"|provider_stopped|provider_unresponsive|provider_protocol_error"
    r"|provider_history_missing): "
)


def error_reason(error: str | None) -> str | None:
    """The typed reason of a failed Turn whose model could not be reached, refused the
    credential or did not answer in time (the error text names the provider, the endpoint and
    the cause; for a timeout, the limit and its config key), or whose provider process stayed
    stopped, answered nothing or broke its stdio protocol (it names the provider and the
    process), or whose bound history the provider no longer holds."""
    if not error:
        return None
    match = _TURN_REASON.search(error)
    return match.group(1) if match else None


class Children:
    """The wire maps of the committed children last projected, by the identity of their
    `Session` value: a fork's child is one object from its commit on — the plan's Session the
    commit's changes carry (its `fork.operation` and its own `session.upserted`), the
    `fork.create` reply's operation, and every later decode of the operation through the
    store's `ProjectionCache` (the ACK's reply, `fork.get`) — so it is projected once, not four
    times a fork. A `Session` is frozen and its projection a function of it and the catalog
    alone, so the same object (held here: its id is not reused while it is kept) with the same
    catalog projects the same map; the map is shared, read-only, by every event and reply that
    carries it. Bounded (`size`, oldest first out); any thread."""

    __slots__ = ("_held", "_lock", "size", "projected")

    def __init__(self, size: int = 256) -> None:
        self._held: dict[int, tuple[Session, ProviderCatalog, wire.Session]] = {}
        self._lock = threading.Lock()
        self.size = size
        self.projected = 0
        """Children projected (a miss each); tests pin the one projection a fork."""

    def get(self, value: Session, catalog: ProviderCatalog) -> wire.Session:
        held = self._held.get(id(value))
        if held is not None and held[0] is value and held[1] is catalog:
            return held[2]
        projected = session(value, catalog)
        with self._lock:
            self.projected += 1
            self._held[id(value)] = (value, catalog, projected)
            if len(self._held) > self.size:
                del self._held[next(iter(self._held))]
        return projected


children = Children()
"""The process's committed children projected (`Children`)."""


def child_or_session(value: Session, catalog: ProviderCatalog) -> wire.Session:
    """`session(value, catalog)`; a fork's child's (a Session with a lineage) through
    `children` (a carried one is most often the commit's own row, which its operation's
    projection has met or will)."""
    if value.lineage is not None:
        return children.get(value, catalog)
    return session(value, catalog)


def operation(value: ForkOperation, catalog: ProviderCatalog) -> wire.Operation:
    committed = value.committed_session
    return {
        "operationId": value.operation_id,
        "requestId": value.request_id,
        "sourceAgentSessionId": value.source_session_id,
        "targetAgentSessionId": value.target_session_id,
        "point": _point(value.point_kind, value.source_turn_id),
        "status": value.public_status.value,
        "phase": value.phase.value,
        "session": None if committed is None else children.get(committed, catalog),
        "lineage": lineage(value.lineage),
        "error": value.error,
        "workspace": operation_workspace(value),
    }


def evidence(value: Mapping[str, object]) -> wire.Evidence:
    """A `fork.resolve`'s evidence as the resolve actor built it (`actors.fork_resolve`:
    the driver's inspection in `Evidence`'s keys, with the verdict)."""
    return cast(wire.Evidence, dict(value))


def _point(point_kind: str, turn_id: str) -> wire.ForkPoint:
    """The operation's `point` on the wire: the client's kind with the frozen Turn."""
    if point_kind == ForkPointKind.LATEST_SETTLED:
        return {"type": "latestSettled", "turnId": turn_id}
    return {"type": "throughTurn", "turnId": turn_id}


def operation_workspace(value: ForkOperation) -> wire.OperationWorkspace:
    """Where a fork's child works: `shared` (the source's directory), or `worktree` with the
    tree's path, the child's cwd in it, its branch (null outside a repository) and state."""
    plan = value.worktree
    if value.workspace_mode != "worktree" or plan is None:
        return {"mode": "shared"}
    return {
        "mode": "worktree",
        "path": plan.get("path"),
        "cwd": plan.get("childCwd"),
        "branch": plan.get("branch"),
        "state": _one_of_or_none(get_args(wire.WorktreeState), value.worktree_state),
    }


def _truncation(value: Truncation) -> wire.NodeTruncation:
    return {
        "reason": _one_of(("depth", "nodes"), value.reason),
        "omittedChildren": value.omitted_children,
    }


def _node_fields(value: LineageNode, children: list[wire.LineageNode]) -> wire.LineageNode:
    node: wire.LineageNode = {
        "agentSessionId": value.session_id,
        "title": value.title,
        "deleted": value.deleted,
        "ordinal": value.ordinal,
        "lineage": lineage(value.lineage),
        "children": children,
    }
    if value.truncated is not None:
        node["truncated"] = _truncation(value.truncated)
    return node


def lineage_nodes(values: list[LineageNode]) -> list[wire.LineageNode]:
    """The descendant tree on the wire, built with a stack of its own (no recursion): each
    node's `children` list is filled as its children are reached."""
    out: list[wire.LineageNode] = []
    stack: list[tuple[LineageNode, list[wire.LineageNode]]] = [(v, out) for v in reversed(values)]
    while stack:
        value, siblings = stack.pop()
        children: list[wire.LineageNode] = []
        siblings.append(_node_fields(value, children))
        stack.extend((c, children) for c in reversed(value.children))
    return out


def _ancestor_session(value: LineageAncestor, catalog: ProviderCatalog) -> wire.Session | None:
    """An ancestor's Session: None when deleted; read without its settings (the lineage
    read's bound), `settings: {}` with `settingsOmitted: true`, as an event carries it."""
    if value.session is None:
        return None
    out = session(value.session, catalog)
    if value.settings_omitted:
        out["settingsOmitted"] = True
    return out


def lineage_tree(value: LineageTree, catalog: ProviderCatalog) -> LineageResult:
    """`session.lineage`: ancestors nearest first, then the descendant tree;
    `truncated` null, or why the read stopped (docs/protocol.md)."""
    cut = value.truncated
    return {
        "session": session(value.session, catalog),
        "ancestors": [
            {
                "agentSessionId": a.session_id,
                "session": _ancestor_session(a, catalog),
                "lineage": lineage(a.lineage),
            }
            for a in value.ancestors
        ],
        "descendants": lineage_nodes(value.descendants),
        "truncated": None
        if cut is None
        else {
            "reason": _one_of(("depth", "nodes", "ancestors"), cut.reason),
            "maxDepth": cut.max_depth,
            "maxNodes": cut.max_nodes,
            "omittedChildren": cut.omitted_children,
            "ancestors": cut.ancestors,
        },
    }
