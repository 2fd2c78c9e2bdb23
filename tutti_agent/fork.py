"""Thread fork (seed 004 §1, §7-§10): named boundaries, PreparedFork with its source
reservation, and materialization of a Copied or Referenced child rollout.

Forking never writes to the source; a child whose initialization fails leaves no rollout;
the source reservation is held until materialization ends, even if the caller gave up."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol

from tutti_agent import __version__
from tutti_agent.errors import (
    AppServerError,
    ForkInitFailed,
    InvalidParams,
    TurnInProgress,
    TurnNotFound,
    TurnStartMissing,
)
from tutti_agent.history import (
    ForkSnapshot,
    Interrupted,
    InterruptedMarker,
    TruncateBeforeNthUserMessage,
    TurnRecord,
    build_turns,
    fork_history_from_snapshot,
    is_real_user_message,
    is_terminal_event,
    snapshot_turn_state,
)
from tutti_agent.ids import uuid7
from tutti_agent.rollout import LineType, RolloutItem, gc_paused, now_iso
from tutti_agent.store import (
    HistoryPosition,
    Reservation,
    ThreadHead,
    ThreadHistory,
    ThreadStore,
    remove_file_durably,
)

if TYPE_CHECKING:
    import concurrent.futures


@dataclass(frozen=True, slots=True)
class Latest:
    """The source's current durable position; may be mid-turn (then closed as Interrupted).

    Rejected only when the lineage cannot be resolved."""


@dataclass(frozen=True, slots=True)
class ThroughTurn:
    """Through the latest visible instance of the turn, inclusive.

    Rejected when the turn is unknown (`turn not found`) or still in progress / has no
    persisted end (`identifies an in-progress turn`); never approximated."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class BeforeTurn:
    """Strictly before the turn's original start (its `task_started` line).

    Rejected when the turn is unknown or has no persisted start boundary (legacy turn)."""

    turn_id: str


ForkBoundary = Latest | ThroughTurn | BeforeTurn


class ForkPersistence(StrEnum):
    COPIED = "copied"  # the surviving prefix is written into the child: self-contained
    REFERENCED = "referenced"  # the child holds only its own lines + a history_base


@dataclass(frozen=True, slots=True)
class PreparedFork:
    """A frozen boundary of the source; holds the source reservation until released."""

    source_thread_id: str
    source: ThreadHistory
    end_ordinal_exclusive: int
    history_base: HistoryPosition | None
    reservation: Reservation
    settled: bool = False
    """The prefix ends with a turn's terminal event: no turn is open at its end, so an
    Interrupted snapshot of it adds nothing."""
    turns: tuple[TurnRecord, ...] = ()
    """The turns of the prefix when `settled` (each ended inside it), else empty."""

    @property
    def model_context(self) -> tuple[RolloutItem, ...]:
        """The prefix's items (`source.lines[:end_ordinal_exclusive]`'s), made when asked: a
        settled fork whose child copies the prefix's bytes reads none of them (a tuple of
        60,000 items for a 10,000-Turn prefix, and its copy, made for its length)."""
        return tuple(map(itemgetter(2), self.source.lines[: self.end_ordinal_exclusive]))


@dataclass(frozen=True, slots=True)
class ForkOptions:
    boundary: ForkBoundary = Latest()
    snapshot: ForkSnapshot | None = None  # None: Interrupted (Codex's default for forks)
    persistence: ForkPersistence = ForkPersistence.COPIED
    marker: InterruptedMarker = InterruptedMarker.CONTEXTUAL_USER
    cwd: str | None = None
    model: str | None = None
    turn_items: bool = True
    """False: the result's turns are reduced without their items (`turnItems: false`)."""
    keep_child_parse: bool = True
    """False (a child forked `loaded: false`): the store does not keep the child's parse."""


@dataclass(frozen=True, slots=True)
class ForkResult:
    child: ThreadHistory | None
    """The child's history from the lines written; None for a child forked unopened from a
    copied span (`keep_child_parse=False`): then `head` says what its answer needs."""
    prepared_end: int
    turns: tuple[TurnRecord, ...] | None = None
    """The child's turns as `build_turns` projects them (ids, status, items; the indices are
    the source's), when the fork knew them from its prefix; else None."""
    settings: Mapping[str, Any] | None = None
    """The child's `effective_settings()`, known without a pass over its lines: its own
    `thread_settings_applied` line (cwd and model) is the last such line of its history, its
    `model_provider` its `session_meta`'s, and the lines before it are the source's, whose
    pass the fork has just made (so they raise nothing)."""
    head: ThreadHead | None = None
    """The child's head (what `ThreadStore.head` reads of it), from what the fork wrote and the
    source's lines it copied, when `child` is None."""


class ForkHooks(Protocol):
    """Test seams inside materialization (a fault or a gate at a precise step)."""

    def before_materialize(self, prepared: PreparedFork) -> None: ...

    def after_child_write(self, child_thread_id: str) -> None: ...


class NoHooks:
    def before_materialize(self, prepared: PreparedFork) -> None:
        return None

    def after_child_write(self, child_thread_id: str) -> None:
        return None


def resolve_boundary(history: ThreadHistory, boundary: ForkBoundary) -> int:
    """Map a named boundary to an exclusive end ordinal of the logical history."""
    return _resolve(history, boundary)[0]


def _resolve(
    history: ThreadHistory, boundary: ForkBoundary, reduced: Sequence[TurnRecord] | None = None
) -> tuple[int, tuple[TurnRecord, ...] | None]:
    """`resolve_boundary`, and the prefix's turns when it is settled: it ends with the
    terminal event (`task_complete`/`turn_aborted`) that closed the named turn, so no turn
    is open there and the prefix's turns are exactly those that ended inside it (a turn
    closed by a later `task_started` ends on that start, not on a terminal event: not
    settled, its snapshot closes it as interrupted). `reduced`: the history's turns, when the
    caller has them (`ThreadStore.turns`)."""
    if isinstance(boundary, Latest):
        return history.next_ordinal, None
    turns = build_turns(history.items) if reduced is None else reduced
    matches = [t for t in turns if t.id == boundary.turn_id]
    if not matches:
        raise TurnNotFound(boundary.turn_id)
    turn = matches[-1]
    if isinstance(boundary, ThroughTurn):
        end = turn.end_index
        if end is None:
            raise TurnInProgress(boundary.turn_id)
        if not is_terminal_event(history.lines[end - 1].item):
            return end, None
        kept = tuple(t for t in turns if t.end_index is not None and t.end_index <= end)
        # Through the last turn: the reduction itself (its projection is kept with it).
        return end, turns if isinstance(turns, tuple) and len(kept) == len(turns) else kept
    if turn.start_index is None:
        raise TurnStartMissing(boundary.turn_id)
    return turn.start_index, None


class ForkService:
    """Prepares and materializes forks against one ThreadStore."""

    def __init__(self, store: ThreadStore, hooks: ForkHooks | None = None) -> None:
        self.store = store
        self.hooks: ForkHooks = hooks or NoHooks()

    def prepare(
        self, source_thread_id: str, boundary: ForkBoundary, *, turn_items: bool = True
    ) -> PreparedFork:
        """The frozen boundary, holding the source's reservation; `turn_items=False`: the
        prefix's turns (the reply's) are reduced without their items."""
        # Reserve first, then read: a delete that wins the race makes the load fail cleanly.
        reservation = self.store.reserve(source_thread_id)
        try:
            with gc_paused():
                source = self.store.load(source_thread_id)
                reduced = (
                    None
                    if isinstance(boundary, Latest)
                    else self.store.turns(source, with_items=turn_items)
                )
                end, turns = _resolve(source, boundary, reduced)
                base = source.position_at(end)
                return PreparedFork(
                    source_thread_id=source_thread_id,
                    source=source,
                    end_ordinal_exclusive=end,
                    history_base=base,
                    reservation=reservation,
                    settled=turns is not None,
                    turns=turns or (),
                )
        except BaseException:
            reservation.release()
            raise

    def fork(self, source_thread_id: str, options: ForkOptions) -> ForkResult:
        """Prepare and materialize in the calling thread, holding the reservation until
        materialization ends. A caller that waits for the result cannot abandon it, so the
        detached thread of `fork_async` buys it nothing (starting one per fork, and
        handing the interpreter lock to it and back, costs the app-server's request loop
        milliseconds per fork on a loaded machine)."""
        prepared = self.prepare(source_thread_id, options.boundary, turn_items=options.turn_items)
        try:
            return self.materialize(prepared, options)
        finally:
            prepared.reservation.release()

    def fork_async(
        self, source_thread_id: str, options: ForkOptions
    ) -> concurrent.futures.Future[ForkResult]:
        """Prepare now; materialize on a detached thread that owns the reservation.

        Abandoning the returned future (a cancelled request) does not release the source:
        only the end of materialization does (seed 004 §10, §12.4)."""
        # Imported at the first fork: the logging it brings is no part of an app-server's start.
        import concurrent.futures

        prepared = self.prepare(source_thread_id, options.boundary, turn_items=options.turn_items)
        future: concurrent.futures.Future[ForkResult] = concurrent.futures.Future()

        def run() -> None:
            try:
                if not future.set_running_or_notify_cancel():
                    return  # cancelled before any child write: nothing to wait for
                result = self.materialize(prepared, options)
            except BaseException as exc:  # delivered to the waiter, never lost
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                prepared.reservation.release()

        # The thread is started only once the future exists, and marks it running first,
        # so a caller's cancel() either prevents materialization entirely or is refused.
        threading.Thread(target=run, name=f"fork-{source_thread_id}", daemon=True).start()
        return future

    def materialize(self, prepared: PreparedFork, options: ForkOptions) -> ForkResult:
        with gc_paused():
            return self._materialize(prepared, options)

    def _materialize(self, prepared: PreparedFork, options: ForkOptions) -> ForkResult:
        self.hooks.before_materialize(prepared)
        snapshot = options.snapshot
        n = prepared.end_ordinal_exclusive  # the prefix's items: `len(prepared.model_context)`
        # A settled prefix is its own Interrupted snapshot (no turn to close): the child is
        # the prefix (its items, read only where the child does not copy its bytes), and its
        # turns are the prefix's.
        as_is = prepared.settled and not isinstance(snapshot, TruncateBeforeNthUserMessage)
        forked: list[RolloutItem] | None = None
        if not as_is:
            forked = fork_history_from_snapshot(
                snapshot if snapshot is not None else Interrupted(),
                list(prepared.model_context),
                options.marker,
            )
            if isinstance(snapshot, TruncateBeforeNthUserMessage):
                forked = drop_empty_turn_shell(forked)
        settings = self.store.settings(prepared.source)  # kept with the source's parse
        cwd = options.cwd or settings.get("cwd")
        model = options.model or settings.get("model")
        child_id = uuid7()
        meta: dict[str, Any] = {
            "id": child_id,
            "session_id": child_id,
            "timestamp": now_iso(),
            "cwd": cwd,
            "originator": "tutti_agent",
            "cli_version": __version__,
            "source": "appServer",
            "model_provider": settings.get("model_provider"),
            "model": model,
            "forked_from_id": prepared.source_thread_id,
        }
        settings_item = RolloutItem(
            LineType.EVENT_MSG,
            {
                "type": "thread_settings_applied",
                "thread_id": child_id,
                "thread_settings": {"cwd": cwd, "model": model},
            },
        )
        child_settings = {"cwd": cwd, "model": model, "model_provider": meta["model_provider"]}
        copied = None
        if options.persistence == ForkPersistence.COPIED:
            first_ordinal = 0
            # The prefix's lines as the source's file holds them, where it can (one read of
            # their bytes, not an encode per line); else each item encoded again.
            if as_is:
                copied = self.store.copied_span(prepared.source, n)
            if copied is not None:
                lines = [settings_item]
            else:
                prefix = prepared.model_context if forked is None else forked
                body = [it for it in prefix if it.type != LineType.SESSION_META]
                # Settings after the copied prefix: a cold resume reads the child's own
                # settings.
                lines = [*body, settings_item]
        else:
            if forked is not None and isinstance(snapshot, TruncateBeforeNthUserMessage):
                end, appended = len(forked), []
            else:
                end, appended = n, [] if forked is None else forked[n:]
            base = prepared.source.position_at(end)
            first_ordinal = base.end_ordinal_exclusive if base is not None else 0
            meta["forked_from_ordinal_exclusive"] = first_ordinal
            meta["history_base"] = base.to_json() if base is not None else None
            # Referenced: the inherited prefix stays in the ancestor; only the child's own
            # settings and boundary items are written here.
            lines = [settings_item, *appended]
        # The whole child in one write and one fsync (plus its directory's), not one fsync
        # per line: it is durable before the response either way. A failed
        # creation leaves no file.
        # A child this server will not open, its prefix copied as bytes: none of its copied
        # lines is built (60,000 for a 10,000-Turn prefix); the answer is made from its head.
        unopened = copied is not None and not options.keep_child_parse
        try:
            path, written = self.store.create_child_lines(
                child_id,
                meta,
                first_ordinal=first_ordinal,
                items=lines,
                copied=copied,
                copied_lines=not unopened,
            )
        except AppServerError:
            raise
        except Exception as exc:
            raise ForkInitFailed(f"fork child initialization failed: {exc}") from exc
        try:
            self.hooks.after_child_write(child_id)
            # The child's history from the lines just written, checked as a load checks it
            # (identity, ordinals, history_base into the frozen source), not re-read from disk.
            parent = prepared.source if first_ordinal > 0 else None
            child: ThreadHistory | None = None
            head: ThreadHead | None = None
            if unopened:
                updated = self.store.adopt_unopened(child_id, path, written[-1].end_byte_offset)
                head = ThreadHead(
                    child_id,
                    path,
                    written[0].item.payload,
                    dict(child_settings),
                    self.store.preview_before(prepared.source, n),
                    updated,
                )
            else:
                child = self.store.adopt_created(
                    child_id, path, written, parent, remember=options.keep_child_parse
                )
        except BaseException as exc:
            # LiveThreadInitGuard: an uninitialized child must not survive as a rollout.
            remove_file_durably(path)
            if isinstance(exc, AppServerError):
                raise
            raise ForkInitFailed(f"fork child initialization failed: {exc}") from exc
        return ForkResult(
            child=child,
            prepared_end=prepared.end_ordinal_exclusive,
            turns=prepared.turns if as_is else None,
            settings=child_settings,
            head=head,
        )


def drop_empty_turn_shell(items: list[RolloutItem]) -> list[RolloutItem]:
    """Cut a trailing turn opening that holds no real user message.

    A cut strictly before the n-th user message keeps that turn's `task_started` (and any
    contextual items after it); the child would show a phantom in-progress turn, so the
    cut moves back to the turn's start. The pure truncation rule is unchanged."""
    state = snapshot_turn_state(items)
    start = state.active_turn_start_index
    if (
        state.ends_mid_turn
        and start is not None
        and not any(is_real_user_message(it) for it in items[start:])
    ):
        return items[:start]
    return items


def parse_snapshot(raw: object) -> ForkSnapshot | None:
    """Wire form: absent/"interrupted"/{type: "interrupted"} or
    {type: "truncateBeforeNthUserMessage", n}."""
    if raw is None:
        return None
    kind = raw if isinstance(raw, str) else raw.get("type") if isinstance(raw, Mapping) else None
    if kind == "interrupted":
        return Interrupted()
    if kind == "truncateBeforeNthUserMessage" and isinstance(raw, Mapping):
        n = raw.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return TruncateBeforeNthUserMessage(n)
    raise InvalidParams(f"invalid snapshot: {raw!r}")
