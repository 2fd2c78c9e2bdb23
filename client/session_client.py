"""Client-side helpers shared by the CLI, the GUI and the demo, gathered under one name: this
module only re-exports them from the modules that own each concern.

- `client.view_rules`: the pure view rules (a Turn's Fork action, the divider, the lineage
  tree), free of Textual so the CLI and the GUI show the same thing;
- `client.references`: session/turn/operation references resolved to ids;
- `client.follow`: a Turn streamed to settlement, a one-shot fork followed to its ACK;
- `client.transcript_text`: a session's transcript and ancestry in words;
- `client.failure_words`: a refused fork or a failed request in words.
"""

from client.failure_words import BOUNDARY_REASONS, error_words, fork_blocked, fork_refusal
from client.follow import (
    POLL_S,
    STREAM_POLL_S,
    AnsweredElsewhere,
    InteractionHandler,
    TurnPrinter,
    TurnWaitTimeout,
    fork_and_wait,
    get_turn,
    run_turn,
    stream_turn,
)
from client.references import (
    ReferenceError_,
    list_sessions,
    resolve_operation,
    resolve_session,
    resolve_turn,
    timeline,
)
from client.transcript_text import (
    Ancestor,
    ancestry,
    describe_interaction,
    format_ancestry,
    format_interaction,
    format_message,
    format_transcript,
    source_title,
    turn_error_text,
)
from client.view_rules import (
    ForkAction,
    Json,
    TreeRow,
    divider_after,
    divider_text,
    fork_action,
    session_tree,
)

__all__ = [
    "BOUNDARY_REASONS",
    "POLL_S",
    "STREAM_POLL_S",
    "Ancestor",
    "AnsweredElsewhere",
    "ForkAction",
    "InteractionHandler",
    "Json",
    "ReferenceError_",
    "TreeRow",
    "TurnPrinter",
    "TurnWaitTimeout",
    "ancestry",
    "describe_interaction",
    "divider_after",
    "divider_text",
    "error_words",
    "fork_action",
    "fork_and_wait",
    "fork_blocked",
    "fork_refusal",
    "format_ancestry",
    "format_interaction",
    "format_message",
    "format_transcript",
    "get_turn",
    "list_sessions",
    "resolve_operation",
    "resolve_session",
    "resolve_turn",
    "run_turn",
    "session_tree",
    "source_title",
    "stream_turn",
    "timeline",
    "turn_error_text",
]
