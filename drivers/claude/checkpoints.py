"""The observed provider Turn identity of a Claude turn and its checkpoint binding: the root
user-message UUID found in the session's transcript as soon as the CLI writes it (`turn.started`),
each later persisted message moving the checkpoint (`turn.binding`), the checkpoint reconciled
with the transcript when the turn ends, and whether a transcript can be resumed at all.
Functions over a Session and its Turn; the state they move is the Turn's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from domain.turn_events import TurnBindingMoved, TurnStarted
from drivers.claude.state import SessionState, TurnState
from drivers.claude_transcript import (
    contains_uuid,
    encode_binding,
    legacy_checkpoint,
    parse_entries,
)

log = logging.getLogger("drivers.claude")


def reconcile_checkpoint(session: SessionState, turn: TurnState) -> None:
    """A streamed checkpoint the transcript does not hold would make fork fail later;
    replace it with the transcript's own last message of this turn.

    Every turn ends here, before `turn.completed`: the usual answer (the checkpoint is one of
    the lines this turn's CLI appended) is read from the turn's own lines, not from the whole
    transcript, which grows with every turn. Only when it is not there is the whole file read.
    """
    if turn.checkpoint and turn.transcript_offset:
        try:
            with open(session.transcript, "rb") as fh:
                fh.seek(turn.transcript_offset)
                tail = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return
        if contains_uuid(tail, turn.checkpoint):
            return
    try:
        text = session.transcript.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    assert turn.provider_turn_id is not None
    if turn.checkpoint and contains_uuid(text, turn.checkpoint):
        return
    recomputed = legacy_checkpoint(text, turn.provider_turn_id)
    if recomputed and recomputed != turn.checkpoint:
        set_checkpoint(session, turn, recomputed)


def observe_root(session: SessionState, turn: TurnState, root_uuid: str) -> None:
    """Records the observed root user-message UUID: the provider Turn identity."""
    if turn.provider_turn_id is not None:
        return
    turn.provider_turn_id = root_uuid
    # The root is also the Turn's first checkpoint: the start carries that binding, one worker
    # event (and one actor message on the host) where a start and a `turn.binding` were two.
    turn.checkpoint = root_uuid
    turn.emit(
        session.agent_session_id,
        TurnStarted(turn.turn_id, root_uuid, encode_binding(root_uuid)),
    )
    turn.started.set_result(root_uuid)


ROOT_POLL_S = 0.02
"""How often the transcript is looked at for the root while the CLI has not answered yet (a
CLI starting cold takes hundreds of ms before it reads the prompt)."""
ROOT_POLL_ANSWERING_S = 0.002
"""How often once it has (its first message of the Turn): the root is written within tens of
ms, right before the model's reply streams."""
ROOT_POLL_ANSWERING_FOR_S = 2.0
"""How long the quick looks last before they slow to `ROOT_POLL_S` again."""


async def watch_root(session: SessionState, turn: TurnState, answering: asyncio.Event) -> None:
    """Finds the turn's root user message in the transcript as soon as the CLI writes it.

    The CLI persists the prompt before it calls the model but echoes it only with the
    reply, so the transcript is the earliest place the observed UUID appears. Found then,
    the host's start of the Turn (its binding written, its change published) is done before
    the reply streams, not in the middle of it: once the CLI answers (`answering`), the
    transcript's size is looked at every `ROOT_POLL_ANSWERING_S` and the file read only when
    it grew.
    """
    seen: int | None = -1
    quick_until: float | None = None
    while True:
        try:
            size: int | None = os.stat(session.transcript).st_size
        except FileNotFoundError:
            size = None
        if size != seen:
            seen = size
            if scan_root(session, turn):
                return
        elif turn.provider_turn_id is not None:
            return  # the echo of the prompt named it
        if answering.is_set() and quick_until is None:
            quick_until = time.monotonic() + ROOT_POLL_ANSWERING_FOR_S
        quick = quick_until is not None and time.monotonic() < quick_until
        await asyncio.sleep(ROOT_POLL_ANSWERING_S if quick else ROOT_POLL_S)


def scan_root(session: SessionState, turn: TurnState) -> bool:
    """One look for the root user message past the turn's start offset; True once known."""
    if turn.provider_turn_id is not None:
        return True
    try:
        with open(session.transcript, "rb") as fh:
            fh.seek(turn.transcript_offset)
            tail = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return False
    root = next((e for e in parse_entries(tail) if e.is_root_user), None)
    if root is None:
        return False
    observe_root(session, turn, root.uuid)
    return True


def set_checkpoint(session: SessionState, turn: TurnState, message_uuid: str) -> None:
    if turn.checkpoint == message_uuid:
        return
    turn.checkpoint = message_uuid
    turn.emit(
        session.agent_session_id, TurnBindingMoved(turn.turn_id, encode_binding(message_uuid))
    )


def resumable(transcript: Path) -> bool:
    """Whether the CLI can resume this transcript: it holds a conversation message.

    A CLI SIGKILLed before it flushed a first turn can leave only its queue bookkeeping
    (observed: two `queue-operation` lines); resuming that fails with "No conversation found",
    every turn after. Such a file holds nothing to keep: it is moved aside (never deleted) and
    the next turn claims the session id afresh, as a first turn does.
    """
    try:
        with open(transcript, encoding="utf-8", errors="replace") as fh:
            # Stops at the first message (the third line of a normal transcript): every turn
            # start asks, and transcripts grow without bound.
            if any(e.type in ("user", "assistant") for line in fh for e in parse_entries(line)):
                return True
    except FileNotFoundError:
        return False
    aside = transcript.with_name(f".{transcript.name}.no-messages-{time.time_ns()}")
    os.rename(transcript, aside)
    log.warning("transcript %s holds no message (a CLI died early); moved to %s", transcript, aside)
    return False
