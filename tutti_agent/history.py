"""History semantics of seed 004 §2, §4-§6: turns rebuilt from rollout items, the snapshot
turn state, Nth-user-message truncation and the Interrupted boundary.

Pure functions over `RolloutItem` sequences; nothing here touches files, so the fork code
and the property tests exercise exactly the same rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, NamedTuple

from tutti_agent.rollout import LineType, RolloutItem

# Model-visible text of the marker a live interrupt records (observed in Codex 0.171).
TURN_ABORTED_MARKER_TEXT = (
    "<turn_aborted>\nThe user interrupted the previous turn on purpose. Any running unified "
    "exec processes may still be running in the background. If any tools/commands were "
    "aborted, they may have partially executed.\n</turn_aborted>"
)

# Harness-injected user-role fragments: model-visible, but never a user turn (seed 004 §5).
CONTEXTUAL_USER_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "# AGENTS.md instructions",
    "<turn_aborted>",
    "<user_shell_command>",
    "<subagent_notification>",
    "<skill>",
)

_EVENT_MSG: str = LineType.EVENT_MSG.value
_RESPONSE_ITEM: str = LineType.RESPONSE_ITEM.value

MODEL_VISIBLE_TYPES = frozenset({"message", "reasoning", "function_call", "function_call_output"})

_LIFECYCLE = ("task_started", "error", "task_complete", "turn_aborted")
"""The events `ThreadHistoryBuilder.handle` acts on whatever its state (a tuple: `in` compares
with `==`, as `handle` does, so an unhashable `type` value is passed over, not an error)."""


class TurnStatus(StrEnum):
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    IN_PROGRESS = "inProgress"


class InterruptedMarker(StrEnum):
    """Which model-visible marker precedes `turn_aborted` when a snapshot is closed."""

    CONTEXTUAL_USER = "contextualUser"  # a `<turn_aborted>` user-role fragment (default)
    DEVELOPER = "developer"  # the Multi-agent V2 variant: a developer-role message
    DISABLED = "disabled"  # no marker; the `turn_aborted` event is still appended


@dataclass(frozen=True, slots=True)
class TruncateBeforeNthUserMessage:
    """Keep history strictly before the n-th (0-based) *real* user message.

    In range: cut right before that message. `n` equal to or beyond the count: the whole
    history when it ends at a stable boundary; when it ends mid-turn, cut at the active
    turn's explicit start (or, for legacy history without lifecycle events, at the last
    user message), dropping only the unfinished suffix. An empty result is a new history.
    """

    n: int


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Snapshot as if the source were interrupted now, without interrupting it.

    At a terminal boundary nothing is added. Mid-turn, the marker (if enabled) and a
    `turn_aborted(interrupted)` event are appended; an explicit turn id is kept, a legacy
    turn gets none. A re-fork of such a snapshot sees the terminal event and adds nothing.
    """


ForkSnapshot = TruncateBeforeNthUserMessage | Interrupted


@dataclass(frozen=True, slots=True)
class SnapshotTurnState:
    ends_mid_turn: bool = False
    active_turn_id: str | None = None
    active_turn_started_at: int | None = None
    active_turn_start_index: int | None = None


class TurnRecord(NamedTuple):
    """A turn as rebuilt from history; indices are positions in the item sequence.

    A named tuple, not a frozen dataclass (whose constructor sets each of its ten fields
    through `object.__setattr__`): a 10,000-Turn history reduces to 10,000 of them."""

    id: str | None
    status: TurnStatus
    items: tuple[Mapping[str, Any], ...]
    error: str | None
    started_at: int | None
    completed_at: int | None
    duration_ms: int | None
    start_index: int | None  # the task_started item; None for legacy turns
    end_index: int | None  # exclusive end after the terminal event; None while in progress
    explicit: bool


def message_text(payload: Mapping[str, Any]) -> str:
    parts = payload.get("content") or []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping) and "text" in p)


def is_contextual_user_text(text: str) -> bool:
    return text.lstrip().startswith(CONTEXTUAL_USER_PREFIXES)


def is_real_user_message(item: RolloutItem) -> bool:
    if item.type != LineType.RESPONSE_ITEM:
        return False
    p = item.payload
    if p.get("type") != "message" or p.get("role") != "user":
        return False
    return not is_contextual_user_text(message_text(p))


def user_message_positions(items: Sequence[RolloutItem]) -> list[int]:
    return [i for i, item in enumerate(items) if is_real_user_message(item)]


def is_terminal_event(item: RolloutItem) -> bool:
    return item.event_type in ("task_complete", "turn_aborted")


@dataclass(slots=True)
class _OpenTurn:
    id: str | None
    explicit: bool
    start_index: int | None
    started_at: int | None
    items: list[Mapping[str, Any]] = field(default_factory=list)
    error: str | None = None
    status: TurnStatus = TurnStatus.IN_PROGRESS


def _copy(turn: _OpenTurn | None) -> _OpenTurn | None:
    return None if turn is None else replace(turn, items=list(turn.items))


class ThreadHistoryBuilder:
    """Reduces rollout items into turns, tracking the active (unfinished) turn.

    `with_items=False`: the same turns (ids, statuses, errors, times, boundaries) without
    their items, for a caller that reads only those (a `thread/read` or `thread/fork` asked
    for `turnItems: false`, the host's readability proof): one reduction, so both read a
    history the same way."""

    def __init__(self, *, with_items: bool = True) -> None:
        self._turns: list[TurnRecord] = []
        self._active: _OpenTurn | None = None
        self._with_items = with_items

    def handle(self, index: int, item: RolloutItem) -> None:
        # `item.event_type` inlined: this runs once per rollout line (60,000 for a
        # 10,000-Turn thread), and most lines are events.
        p = item.payload
        ev = p.get("type") if item.type == _EVENT_MSG else None
        if ev is None:
            if self._active is None and item.type == _RESPONSE_ITEM and is_real_user_message(item):
                # Legacy history: no lifecycle events, a user message opens an implicit turn.
                self._active = _OpenTurn(id=None, explicit=False, start_index=None, started_at=None)
        elif ev == "item_completed":
            if self._active is None:
                self._ensure_legacy_turn()
            if self._with_items:
                assert self._active is not None
                self._active.items.append(p.get("item") or {})
        elif ev == "task_started":
            if self._active is not None:
                # A new start without a terminal event: the old task died (crash); it can
                # never resume, so it projects as interrupted, ending where the new one starts.
                self._close(TurnStatus.INTERRUPTED, index, None, None)
            self._active = _OpenTurn(
                id=_str_or_none(p.get("turn_id")),
                explicit=p.get("turn_id") is not None,
                start_index=index,
                started_at=_int_or_none(p.get("started_at")),
            )
        elif ev == "error":
            if self._active is not None:
                self._active.error = str(p.get("message", ""))
                self._active.status = TurnStatus.FAILED
        elif ev == "task_complete":
            if self._active is not None:
                self._adopt_id(p)
                status = (
                    TurnStatus.FAILED if self._active.error is not None else TurnStatus.COMPLETED
                )
                self._close(
                    status,
                    index + 1,
                    _int_or_none(p.get("completed_at")),
                    _int_or_none(p.get("duration_ms")),
                )
        elif ev == "turn_aborted" and self._active is not None:
            self._adopt_id(p)
            self._close(
                TurnStatus.INTERRUPTED,
                index + 1,
                _int_or_none(p.get("completed_at")),
                _int_or_none(p.get("duration_ms")),
            )

    def handle_range(self, items: Sequence[RolloutItem], start: int, stop: int) -> None:
        """`handle(i, items[i])` for each `i` in `range(start, stop)`: the same state after.

        Without items (`with_items=False`), the lines that cannot change this reducer are
        passed over without a call — an `item_completed` event or a `response_item` while a
        turn is open, an event `handle` ignores, any other line type —, and the two lines
        every Turn has, its `task_started` with no turn open and its `task_complete` closing
        an unfailed turn that has its id, are reduced here as `handle` reduces them; every
        other line goes to `handle`. A 10,000-Turn history's lean reduction (a resume's
        prewarm and each readability proof) so makes no call for 40,000 of its 60,000 lines
        and no keyword construction for its 10,000 turns."""
        if self._with_items:
            handle = self.handle
            for i in range(start, stop):
                handle(i, items[i])
            return
        handle = self.handle
        append = self._turns.append
        new = tuple.__new__
        completed = TurnStatus.COMPLETED
        # The turn a `task_started` opened here, held in these locals (`open_id` ... `open_at`)
        # while `pending`, not as an `_OpenTurn` (one built per Turn for nothing): it becomes
        # `self._active` (`hand_over`) before any line goes to `handle` and at the end.
        pending = False
        open_id: str | None = None
        open_explicit = False
        open_start = 0
        open_at: int | None = None

        def hand_over() -> None:
            self._active = _OpenTurn(
                id=open_id, explicit=open_explicit, start_index=open_start, started_at=open_at
            )

        for i in range(start, stop):
            item = items[i]
            kind = item.type
            if kind == _EVENT_MSG:
                p = item.payload
                ev = p.get("type")
                if pending:
                    if ev == "task_complete" and open_id is not None:
                        # `handle`'s `task_complete` of an unfailed turn with its id: the id
                        # kept (`_adopt_id` fills only a missing one), completed, `_close`d.
                        done, took = p.get("completed_at"), p.get("duration_ms")
                        append(
                            new(
                                TurnRecord,
                                (
                                    open_id,
                                    completed,
                                    (),
                                    None,
                                    open_at,
                                    done if type(done) is int else _int_or_none(done),
                                    took if type(took) is int else _int_or_none(took),
                                    open_start,
                                    i + 1,
                                    open_explicit,
                                ),
                            )
                        )
                        pending = False
                    elif ev in _LIFECYCLE:
                        hand_over()
                        pending = False
                        handle(i, item)
                    # else: an `item_completed` (no item kept) or an ignored event: nothing
                elif ev == "task_started" and self._active is None:
                    turn_id = p.get("turn_id")
                    at = p.get("started_at")
                    pending = True
                    open_id = None if turn_id is None else str(turn_id)
                    open_explicit = turn_id is not None
                    open_start = i
                    open_at = at if type(at) is int else _int_or_none(at)
                elif ev in _LIFECYCLE or (ev == "item_completed" and self._active is None):
                    handle(i, item)
            elif kind == _RESPONSE_ITEM and not pending and self._active is None:
                handle(i, item)
        if pending:
            hand_over()

    def _adopt_id(self, payload: Mapping[str, Any]) -> None:
        # A turn whose start was never persisted may still be named by its terminal event;
        # it stays non-explicit (no start boundary), so BeforeTurn on it is rejected.
        if self._active is not None and self._active.id is None:
            self._active.id = _str_or_none(payload.get("turn_id"))

    def _ensure_legacy_turn(self) -> None:
        if self._active is None:
            self._active = _OpenTurn(id=None, explicit=False, start_index=None, started_at=None)

    def _close(
        self, status: TurnStatus, end: int, completed_at: int | None, duration_ms: int | None
    ) -> None:
        t = self._active
        assert t is not None
        self._turns.append(
            TurnRecord(
                id=t.id,
                status=status,
                items=tuple(t.items),
                error=t.error,
                started_at=t.started_at,
                completed_at=completed_at,
                duration_ms=duration_ms,
                start_index=t.start_index,
                end_index=end,
                explicit=t.explicit,
            )
        )
        self._active = None

    def has_active_turn(self) -> bool:
        return self._active is not None

    def initial(self) -> bool:
        """Nothing reduced yet changed the state: no turn closed, none open."""
        return not self._turns and self._active is None

    def state(self, start: int, stop: int) -> ReducedRun:
        """This reducer's state as a `ReducedRun` of `items[start:stop]` (a copy)."""
        return ReducedRun(start, stop, self._with_items, tuple(self._turns), _copy(self._active))

    def resume(self, run: ReducedRun) -> None:
        """Continue from `run`'s state (its open turn copied: `run` stays reusable)."""
        self._turns = list(run.turns)
        self._active = _copy(run.active)

    def active_turn_id_if_explicit(self) -> str | None:
        if self._active is not None and self._active.explicit:
            return self._active.id
        return None

    def active_turn_snapshot(self) -> TurnRecord | None:
        t = self._active
        if t is None:
            return None
        return TurnRecord(
            id=t.id,
            status=t.status,
            items=tuple(t.items),
            error=t.error,
            started_at=t.started_at,
            completed_at=None,
            duration_ms=None,
            start_index=t.start_index,
            end_index=None,
            explicit=t.explicit,
        )

    def active_turn_start_index(self) -> int | None:
        return self._active.start_index if self._active is not None else None

    def turns(self) -> list[TurnRecord]:
        active = self.active_turn_snapshot()
        return [*self._turns, active] if active is not None else list(self._turns)


def build_turns(
    items: Sequence[RolloutItem], *, with_items: bool = True, run: ReducedRun | None = None
) -> list[TurnRecord]:
    """The turns of `items`; `with_items=False`: each turn's `items` left empty.

    `run`: the reduction of `items[run.start:run.stop]` from the reducer's initial state
    (`reduce_run`), which the caller knows to be those very items (equal items reduce
    equally): used when the items before `run.start` leave the reducer in its initial state
    (as a `session_meta` line does), so those lines are not reduced again; else ignored."""
    builder = ThreadHistoryBuilder(with_items=with_items)
    begin = 0
    if run is not None and run.with_items == with_items and run.stop <= len(items):
        builder.handle_range(items, 0, run.start)
        if builder.initial():
            builder.resume(run)
            begin = run.stop
        else:
            begin = run.start
    builder.handle_range(items, begin, len(items))
    return builder.turns()


class ReducedRun(NamedTuple):
    """The reducer's state after `items[start:stop]` of some history, reduced from its initial
    state: the turns it closed and the one it left open (`reduce_run`)."""

    start: int
    stop: int
    with_items: bool
    turns: tuple[TurnRecord, ...]
    active: _OpenTurn | None


def reduce_run(
    items: Sequence[RolloutItem], start: int, stop: int, *, with_items: bool = True
) -> ReducedRun:
    """`items[start:stop]` reduced from the initial state (indices as in `items`)."""
    builder = ThreadHistoryBuilder(with_items=with_items)
    builder.handle_range(items, start, stop)
    return builder.state(start, stop)


def snapshot_turn_state(items: Sequence[RolloutItem]) -> SnapshotTurnState:
    """Describe the persisted snapshot only: explicit lifecycle first, legacy fallback after."""
    builder = ThreadHistoryBuilder()
    builder.handle_range(items, 0, len(items))
    active_id = builder.active_turn_id_if_explicit()
    if builder.has_active_turn() and active_id is not None:
        snap = builder.active_turn_snapshot()
        if snap is not None and snap.status != TurnStatus.IN_PROGRESS:
            # The reducer already reached a terminal status: residual structure is not mid-turn.
            return SnapshotTurnState()
        return SnapshotTurnState(
            ends_mid_turn=True,
            active_turn_id=active_id,
            active_turn_started_at=snap.started_at if snap else None,
            active_turn_start_index=builder.active_turn_start_index(),
        )
    positions = user_message_positions(items)
    if not positions:
        return SnapshotTurnState()
    last = positions[-1]
    # Legacy/synthetic history: mid-turn iff no terminal event follows the last user message.
    return SnapshotTurnState(
        ends_mid_turn=not any(is_terminal_event(it) for it in items[last + 1 :])
    )


def truncate_before_nth_user_message(
    items: Sequence[RolloutItem], n: int, state: SnapshotTurnState
) -> list[RolloutItem]:
    positions = user_message_positions(items)
    if state.ends_mid_turn and n >= len(positions):
        cut = state.active_turn_start_index
        if cut is None and positions:
            cut = positions[-1]
        return list(items[:cut]) if cut is not None else list(items)
    if n < len(positions):
        return list(items[: positions[n]])
    return list(items)


def interrupted_marker_item(marker: InterruptedMarker) -> RolloutItem | None:
    if marker == InterruptedMarker.DISABLED:
        return None
    role = "developer" if marker == InterruptedMarker.DEVELOPER else "user"
    return RolloutItem(
        LineType.RESPONSE_ITEM,
        {
            "type": "message",
            "role": role,
            "content": [{"type": "input_text", "text": TURN_ABORTED_MARKER_TEXT}],
        },
    )


def turn_aborted_item(
    turn_id: str | None,
    started_at: int | None,
    *,
    completed_at: int | None = None,
    duration_ms: int | None = None,
) -> RolloutItem:
    return RolloutItem(
        LineType.EVENT_MSG,
        {
            "type": "turn_aborted",
            "turn_id": turn_id,
            "reason": "interrupted",
            "started_at": started_at,
            "completed_at": completed_at,
            "duration_ms": duration_ms,
        },
    )


def append_interrupted_boundary(
    items: Sequence[RolloutItem],
    turn_id: str | None,
    started_at: int | None,
    marker: InterruptedMarker,
) -> list[RolloutItem]:
    """Close a child snapshot: marker (optional) strictly before the TurnAborted event."""
    out = list(items)
    marker_item = interrupted_marker_item(marker)
    if marker_item is not None:
        out.append(marker_item)
    out.append(turn_aborted_item(turn_id, started_at))
    return out


def fork_history_from_snapshot(
    snapshot: ForkSnapshot, items: Sequence[RolloutItem], marker: InterruptedMarker
) -> list[RolloutItem]:
    state = snapshot_turn_state(items)
    if isinstance(snapshot, TruncateBeforeNthUserMessage):
        return truncate_before_nth_user_message(items, snapshot.n, state)
    if state.ends_mid_turn:
        # Only the child snapshot is closed; the source gets no interrupt.
        return append_interrupted_boundary(
            items, state.active_turn_id, state.active_turn_started_at, marker
        )
    return list(items)


def model_context(items: Sequence[RolloutItem]) -> list[Mapping[str, Any]]:
    """The Responses-API `input` a model sees for this history (response items, in order)."""
    return [
        it.payload
        for it in items
        if it.type == LineType.RESPONSE_ITEM and it.payload.get("type") in MODEL_VISIBLE_TYPES
    ]


ABORTED_CALL_OUTPUT = "aborted"
"""The output a `function_call` left without one (a crash, a full disk or an interrupt between
the call's line and its output's) is given in the model's input, as Codex gives it: the
Responses and Chat Completions APIs refuse an input whose tool call has no output, so every
later request of the thread would fail."""


def unanswered_calls(context: Sequence[Mapping[str, Any]]) -> set[str]:
    """The `call_id`s of the `function_call`s in `context` (model-visible payloads) that no
    `function_call_output` answers."""
    calls: set[str] = set()
    for payload in context:
        kind = payload.get("type")
        if kind == "function_call":
            call_id = payload.get("call_id")
            if isinstance(call_id, str):
                calls.add(call_id)
        elif kind == "function_call_output":
            calls.discard(payload.get("call_id"))  # type: ignore[arg-type]
    return calls


def answer_calls(
    context: Sequence[Mapping[str, Any]], unanswered: set[str]
) -> list[Mapping[str, Any]]:
    """`context` with an `ABORTED_CALL_OUTPUT` output right after each call of `unanswered`."""
    out: list[Mapping[str, Any]] = []
    for payload in context:
        out.append(payload)
        if payload.get("type") == "function_call" and payload.get("call_id") in unanswered:
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": payload["call_id"],
                    "output": ABORTED_CALL_OUTPUT,
                }
            )
    return out


_NUMBER = (int, float)


def _int_or_none(v: object) -> int | None:
    if type(v) is int:  # the usual case, first: a decoded integer is exactly int
        return v
    return int(v) if isinstance(v, _NUMBER) and not isinstance(v, bool) else None


def _str_or_none(v: object) -> str | None:
    return str(v) if v is not None else None
