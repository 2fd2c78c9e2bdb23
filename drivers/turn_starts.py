"""The `turn.start`s a worker received, per Session, until each has *ended*: what lets the
worker call a Session's provider history final again once every start of it this worker got
is over (`WorkerServer._read_history`, design/store.md "Final").

A start is recorded on the link thread in the link's order, before it is dispatched, so every
start the host sent before a history request is counted when that request is judged. It ends
when it is answered and its provider turn is over — the driver sent the Turn's `turn.completed`
(completed, failed or interrupted), before or after the answer — or when its start was refused:
answered with an error before the driver was handed it (a failpoint, `RuntimeChanged`), or with
one a driver raises only before the provider gets anything (`REFUSALS`). Anything else stays
open for good: an error answer from a driver that had the start (a timeout, a provider failure)
may leave the provider running it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.errors import ProviderNotCalled, SessionBusy

REFUSALS = (ProviderNotCalled, SessionBusy)
"""A driver's answers to a start it refused before its provider got anything: the provider was
never called (Claude Code's CLI could not start or ended before the prompt, a bound history
gone), or the Session already has a Turn (each driver checks that before it writes the start)."""


@dataclass(slots=True)
class _Start:
    session: str
    turn_id: str
    handed: bool = False
    """The driver was handed the start (it may have written it to the provider)."""
    answered: bool = False
    ended_at_provider: bool = False
    """The driver sent the Turn's `turn.completed`."""


class TurnStarts:
    """Each open `turn.start` by its link request id, and the Sessions that have one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: dict[int, _Start] = {}
        self._open: dict[str, int] = {}
        """How many open starts each Session has (a Session with none is not here)."""
        self._unsure: set[str] = set()
        """Sessions with a start that can never be told ended (no request id to answer it
        by): their histories are never final in this worker."""

    def received(self, req_id: object, params: Mapping[str, Any]) -> None:
        """A `turn.start` reached the link thread (before it is dispatched)."""
        session = str(params.get("agentSessionId") or "")
        with self._lock:
            if not isinstance(req_id, int) or req_id in self._starts:
                self._unsure.add(session)
                return
            self._starts[req_id] = _Start(session, str(params.get("turnId") or ""))
            self._open[session] = self._open.get(session, 0) + 1

    def handed(self, req_id: int, handed: bool = True) -> None:
        """The driver is about to be handed the start (or, `handed=False`, declined it having
        sent nothing: the lane hands it again)."""
        with self._lock:
            start = self._starts.get(req_id)
            if start is not None:
                start.handed = handed

    def answered(self, req_id: int, error: BaseException | None) -> None:
        """The start's one answer is being sent."""
        with self._lock:
            start = self._starts.get(req_id)
            if start is None:
                return
            start.answered = True
            refused = error is not None and (not start.handed or isinstance(error, REFUSALS))
            if refused or start.ended_at_provider:
                self._close(req_id, start)

    def ended(self, session: str, turn_id: str) -> None:
        """The driver sent `turn.completed` for the Session's Turn `turn_id`: the open start of
        it ends once answered. Two open starts of one Turn: which one ended is not known, so
        neither does."""
        with self._lock:
            found = [
                (req_id, start)
                for req_id, start in self._starts.items()
                if start.session == session
                and start.turn_id == turn_id
                and not start.ended_at_provider
            ]
            if len(found) != 1:
                return
            req_id, start = found[0]
            start.ended_at_provider = True
            if start.answered:
                self._close(req_id, start)

    def open(self, session: str) -> bool:
        """Whether a start of `session` this worker received has not ended (or never can be
        told to have)."""
        with self._lock:
            return session in self._open or session in self._unsure

    def _close(self, req_id: int, start: _Start) -> None:
        del self._starts[req_id]
        left = self._open[start.session] - 1
        if left:
            self._open[start.session] = left
        else:
            del self._open[start.session]
