"""Everything an actor needs from the outside, handed over by the composition root.

One `HostContext` per daemon; no module-level state, so tests can build many daemons.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from actors.pool import ActorPool
from actors.ports import Failpoints, ProviderCatalog, WorkerPort
from actors.runtime_slots import RuntimeSlots
from storage import Store


@dataclass(frozen=True, slots=True)
class Timeouts:
    session_start_s: float = 60.0
    turn_start_s: float = 60.0
    control_s: float = 30.0
    fork_s: float = 60.0
    # fork.create answers 202 `accepted` when the saga has not ended within this budget.
    fork_sync_budget_s: float = 2.0


@dataclass(eq=False)
class LiveOperations:
    """Operation ids whose saga runs in *this* process: `fork.get` must never reclassify them
    (a live `dispatching` is not a leftover)."""

    _ids: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op_id: str) -> None:
        with self._lock:
            self._ids.add(op_id)

    def discard(self, op_id: str) -> None:
        with self._lock:
            self._ids.discard(op_id)

    def __contains__(self, op_id: object) -> bool:
        with self._lock:
            return op_id in self._ids


@dataclass(eq=False)
class HostContext:
    store: Store
    workers: WorkerPort
    catalog: ProviderCatalog
    failpoints: Failpoints
    runtimes_dir: Path
    timeouts: Timeouts = field(default_factory=Timeouts)
    live_operations: LiveOperations = field(default_factory=LiveOperations)
    # The bounded threads every Session actor runs on (issue 15 #5: not one thread each).
    actor_pool: ActorPool = field(default_factory=ActorPool)
    # Live provider runtimes per provider (issue 14 §6); the daemon wires its stopper.
    runtime_slots: RuntimeSlots = field(default_factory=RuntimeSlots)
    # Called with (workspace_id, session_id, busy) so the host knows which actors may idle out.
    on_busy_change: Callable[[str, str, bool], None] | None = None

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path:
        """`runtimes/<workspace>/<session>/<provider home>`; workspace ids are free text, so
        anything that is not a plain path segment is hashed."""
        ws = _path_segment(workspace_id)
        home = self.catalog.driver_info(provider).home_dir_name
        return self.runtimes_dir / ws / session_id / home


def _path_segment(text: str) -> str:
    import hashlib
    import re

    if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}", text):
        return text
    return "ws-" + hashlib.sha256(text.encode()).hexdigest()[:24]
