"""Why a request failed, in words for a person: a refused fork (its `forkBoundaryReason` or
reason) as one sentence ending with the machine reason, why a source cannot be forked right
now, and any other failed request (`error_words`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transport.client import ApiError

_BOUNDARY_SENTENCES: dict[str, str] = {
    "source_not_root": "the session is not a root session (only a root Session can be forked)",
    "source_provider_session_missing": (
        "the session has no provider session yet (no turn has run on the provider)"
    ),
    "source_turn_active": "{active} is still running",
    "source_interaction_pending": (
        "{active} is waiting for an answer (`agenthost answer` or interrupt it first)"
    ),
    "source_goal_control_active": "a goal control is running on the session",
    "source_runtime_operation_active": (
        "a runtime operation (such as a compaction) is running on the session"
    ),
    "source_submit_claim_active": "a new turn is being submitted to the session",
    "source_fork_active": "another fork of this session is still in progress",
    "turn_not_found": "the session has no such turn",
    "turn_not_settled": "{turn} has not finished yet",
    "turn_sequence_unverified": (
        "the history up to {turn} was not recorded in order by agenthost, so it cannot be "
        "copied safely"
    ),
    "provider_turn_missing": (
        "a turn up to {turn} has no provider turn id, so the provider's history cannot be cut there"
    ),
    "descendant_lane_in_boundary": (
        "the history up to {turn} contains a sub-agent lane, which cannot be forked"
    ),
    "session_local_attachment_in_boundary": (
        "the history up to {turn} contains a session-local attachment, which cannot be copied"
    ),
    "provider_turn_not_bound": (
        "{turn} has no verified provider checkpoint (recovery required), so the provider's "
        "history cannot be cut there"
    ),
    "target_equals_source": "the new session id is the source session's own id",
    "target_session_exists": "the new session id is already used by a session",
    "target_session_reserved": "the new session id is reserved by another fork",
    "history_reference_unsafe": (
        "the history up to {turn} holds a reference that cannot be rewritten safely"
    ),
}
BOUNDARY_REASONS = tuple(_BOUNDARY_SENTENCES)

_FORK_REASON_SENTENCES: dict[str, str] = {
    "agent_session_fork_unsupported": "this session's provider cannot fork through a turn",
    "agent_session_fork_in_progress": "another fork of this session is still in progress",
    "agent_session_busy": "the session is busy",
    "agent_session_fork_request_conflict": "that request id was already used for another fork",
    "workspace_agent_session_not_found": "the session does not exist",
}


def _turn_label(turn_id: str | None, turns: Sequence[Mapping[str, Any]]) -> str:
    for turn in turns:
        if turn.get("turnId") == turn_id:
            return f"Turn {turn['sequence']}"
    return f"turn {turn_id[:8]}" if turn_id else "that turn"


def fork_refusal(
    reason: str,
    params: Mapping[str, Any] | None,
    *,
    turn_id: str | None,
    turns: Sequence[Mapping[str, Any]] = (),
    session: Mapping[str, Any] | None = None,
    message: str | None = None,
    latest: bool = False,
) -> str:
    """One sentence saying why a fork through `turn_id` was refused, ending with the machine
    reason in parentheses, e.g. `cannot fork through Turn 2: Turn 3 is still running
    (source_turn_active)`. With `latest` (a full-Session fork, `point: latestSettled`) it reads
    `cannot fork the whole session: …`."""
    params = params or {}
    boundary = params.get("forkBoundaryReason")
    active_id = (session or {}).get("activeTurnId")
    active = _turn_label(active_id, turns) if active_id else "a turn"
    if active == "a turn" and boundary == "source_turn_active":
        active = "a turn of the session"
    turn = "its latest turn" if latest else _turn_label(turn_id, turns)
    fields = {"turn": turn, "active": active}
    head = "cannot fork the whole session" if latest else f"cannot fork through {turn}"
    if latest and (boundary == "turn_not_found" or reason == "turn_not_found"):
        return f"{head}: it has no settled turn yet ({boundary or reason})"
    if latest and reason == "agent_session_fork_unsupported":
        return (
            f"{head}: it does not support a full-session fork (its provider does not declare "
            f"forkFullSession for it, or no turn has been verified yet) ({reason})"
        )
    if reason == "workspace_checkpoint_missing":
        # The daemon's message ends with why (`…: git is not installed`).
        detail = (message or "").rpartition(": ")[2] or "no checkpoint was recorded"
        return (
            f"{head} into a new worktree: {turn} has no checkpoint of its files ({detail}); "
            f"fork without --worktree to keep working in the same folder ({reason})"
        )
    if isinstance(boundary, str):
        template = _BOUNDARY_SENTENCES.get(boundary)
        why = template.format(**fields) if template else (message or boundary)
        return f"{head}: {why} ({boundary})"
    if params.get("field") == "targetAgentSessionId":
        return f"{head}: the target session id is already taken ({reason})"
    if params.get("forkReferenceError"):
        return (
            f"{head}: the history cannot be rewritten safely "
            f"({reason}/{params['forkReferenceError']})"
        )
    why = _FORK_REASON_SENTENCES.get(reason) or message or reason
    return f"{head}: {why} ({reason})"


def fork_blocked(
    session: Mapping[str, Any] | None, turns: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why no Turn of this session can be forked right now (the source is not quiet), as the
    sentence a refusal would carry, or None when it is quiet."""
    if not session or not session.get("activeTurnId"):
        return None
    active = next((t for t in turns if t.get("turnId") == session["activeTurnId"]), None)
    pending = any(i.get("status") == "pending" for i in ((active or {}).get("interactions") or []))
    label = _turn_label(str(session["activeTurnId"]), turns)
    if pending:
        return f"{label} is waiting for an answer (source_interaction_pending)"
    return f"{label} is still running (source_turn_active)"


_ERROR_WORDS: dict[str, str] = {
    "agent_session_busy": "a turn is already running in this session (wait, or interrupt it)",
    "agent_session_fork_in_progress": (
        "a fork of this session is in progress (try again when it finishes)"
    ),
    "workspace_agent_session_not_found": "the session no longer exists",
    "turn_not_found": "that turn no longer exists",
    "interaction_not_pending": "that question was already answered, or its turn has ended",
    "provider_unavailable": "the provider is not available (its worker could not start)",
    "provider_lost": "the provider's worker stopped while handling it",
    "shutting_down": "the daemon is shutting down",
    "overloaded": "the daemon is overloaded (try again)",
    "store_busy": "the daemon's store is busy (try again)",
    "invalid_argument": "a value was not accepted",
    "agent_session_fork_operation_not_found": "that fork operation does not exist",
    "agent_session_fork_resolve_in_progress": (
        "another resolve of this fork is running (try again when it finishes)"
    ),
    "agent_session_fork_resolve_conflict": "this fork was already resolved (inspect it again)",
    "fork_resolve_failed": (
        "the provider's worker failed while resolving; the fork is still unknown (try again)"
    ),
}


# A rename to an empty title, refused before anything is sent: the CLI's `rename S ""` and the
# GUI's rename dialog say the same words.
EMPTY_TITLE_WORDS = "the title is empty: give the new title"


def too_large_words(params: Mapping[str, Any] | None) -> str | None:
    """A 413 `payload_too_large` for a person: the request's size and the limit in MiB and
    what to do, not the frame's byte counts; None without them."""
    size, limit = (params or {}).get("bytes"), (params or {}).get("maxBytes")
    if not isinstance(size, int) or not isinstance(limit, int) or limit <= 0:
        return None
    mib = 1 << 20
    return (
        f"the request is too large ({size / mib:.1f} MiB; a request holds at most "
        f"{limit / mib:g} MiB): send a shorter message, or put the text in a file in the "
        "session's folder and ask the agent to read it"
    )


def error_words(action: str, exc: BaseException) -> str:
    """A sentence for a failed request, for a person: `cannot send: a turn is already running
    in this session (wait, or interrupt it)`, not `409 conflict/agent_session_busy`."""
    if isinstance(exc, ApiError):
        if isinstance((exc.params or {}).get("forkBoundaryReason"), str):
            return fork_refusal(exc.reason or exc.code, exc.params, turn_id=None)
        words = _ERROR_WORDS.get(exc.reason or "") or exc.message or exc.reason or exc.code
        params = exc.params or {}
        if exc.reason == "agent_session_fork_resolve_conflict" and params.get("verdict"):
            words = (
                f"the evidence is {params['verdict']}, not adoptable "
                "(only one verified provider child can be adopted; abandon it instead)"
            )
        elif exc.reason == "agent_session_fork_resolve_conflict" and params.get("status"):
            words = f"this fork is already {params['status']}, not unknown"
        if exc.reason == "agent_session_fork_unresolved":
            listed = params.get("operationIds")
            ops = [str(o) for o in listed] if isinstance(listed, list) else []
            words = (
                f"it has {len(ops)} unresolved fork(s) whose outcome is unknown "
                f"({', '.join(o[:8] for o in ops)}); their evidence lives with this session. "
                "Resolve them first: `agenthost resolve <operation>` (inspect), then "
                "`--adopt` or `--abandon`"
            )
        if exc.reason == "invalid_argument" and exc.message:
            words = exc.message
        if exc.reason == "payload_too_large":
            words = too_large_words(params) or words
        return f"cannot {action}: {words}"
    if isinstance(exc, TimeoutError):
        return f"cannot {action}: the daemon did not answer in time"
    return f"cannot {action}: {exc}"
