"""Who acted on a Turn from outside, in words: the `by` values `turn.interrupt` and
`interaction.respond` take, and the sentence an interrupted Turn records as its `error`, so
every client can say who stopped a Turn and why without a table of its own."""

from __future__ import annotations

INTERRUPTED_BY: dict[str, str] = {
    "ctrl_c": "Ctrl-C in the CLI",
    "cli": "the CLI",
    "gui": "the GUI",
    "host": "the host",
    "client": "a client",
}
"""`turn.interrupt`'s `by`: who stopped the Turn (absent: `client`)."""

ANSWERED_BY: dict[str, str] = {
    "cli": "the CLI",
    "gui": "the GUI",
    "client": "a client",
}
"""`interaction.respond`'s `by`: who answered; recorded in the Interaction's `output.by`."""

REASON_MAX = 500


def interrupt_error(by: str | None, reason: str | None) -> str:
    """The interrupted Turn's `error`: `by the GUI: the user pressed Stop`, `by a client`."""
    who = INTERRUPTED_BY.get(by or "client", INTERRUPTED_BY["client"])
    return f"by {who}: {reason}" if reason else f"by {who}"


HOST_RESTART_ERROR = interrupt_error(
    "host", "it stopped while this turn ran, and settled the turn when it started again"
)
"""A Turn left active by a previous daemon process (shutdown or crash)."""
