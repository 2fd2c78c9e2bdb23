"""Everything an actor needs from the outside, handed over by the composition root, and where a
Session's runtime lives: its key in a worker (`runtime_key`), its home on disk
(`HostContext.runtime_home`).

One `HostContext` per daemon; no module-level state, so tests can build many daemons.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from actors.checkpoints import CheckpointJanitor, TurnCheckpoints
from actors.dir_spread import skips_recent_deletes, spread_subdirs
from actors.home_uses import HomeUses
from actors.pool import ActorPool
from actors.ports import Failpoints, ProviderCatalog, RuntimeSlotsPort, WorkerPort
from actors.store_ports import ActorStore
from domain.model_limits import ModelLimits
from workspace.shadow import ShadowStore
from workspace.worktree import ForkTrees

# The worker's own limits for a fork's steps other than the provider's fork call: reading the
# source, listing the child's turns, binding, and proving the child readable (an app-server
# spawn and its reads). Each is bounded by the driver's `request_timeout_s` (30 s).
WORKER_FORK_STEPS_S = 5 * 30.0
# Slack so the worker's own typed timeout always reaches the host before the host's deadline.
FORK_DEADLINE_MARGIN_S = 30.0


def fork_deadline_s(provider_call_s: float) -> float:
    """The host's deadline for a fork request: longer than the worker's whole budget for it,
    so while the worker lives it is the worker, which knows whether the
    provider call started, that decides `not_started` or `unknown` — never the host's clock."""
    return provider_call_s + WORKER_FORK_STEPS_S + FORK_DEADLINE_MARGIN_S


SESSION_START_S = 120.0
"""The host's limit for one `session.start` (and `turn.start`, which may start the runtime)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    # Longer than the worker's own budget for starting a runtime (spawn, then `initialize`
    # and the thread's start/resume, each within the driver's `request_timeout_s`, 30 s): a
    # start slow under load ends with the worker's typed answer, not the host's clock. A
    # Turn's wait for a runtime slot or a start permit is not counted (`RuntimeSlots`, in
    # actors/session_runtime.py).
    session_start_s: float = SESSION_START_S
    turn_start_s: float = SESSION_START_S
    control_s: float = 30.0
    # The worker's limit for the provider's fork call, and the host's deadline for the whole
    # fork request (always longer than the worker's budget; see `fork_deadline_s`).
    fork_provider_call_s: float = 60.0
    fork_s: float = fork_deadline_s(60.0)
    # fork.create answers 202 `accepted` when the saga has not ended within this budget.
    fork_sync_budget_s: float = 2.0
    # A fork reuses its Session's runtime without `session.start` for at most this
    # long after that runtime's last start answered (and at most half the driver's idle
    # limit); 0 turns the reuse off.
    fork_warm_runtime_s: float = 10.0
    # A Turn's durable writes (its events, its settlement) are retried while the store is
    # busy or full; past this limit the Turn settles `failed` once the store is writable.
    store_retry_limit_s: float = 120.0
    # A Turn with no provider event for this long (and no pending interaction) is hung: its
    # runtime is stopped and the Turn settles `failed` with the reason.
    turn_inactivity_s: float = 1800.0
    # An interrupt the provider has not acknowledged within this budget means a hung
    # runtime: it is stopped and the Turn settles `interrupted` (never a 502 after 30 s).
    interrupt_s: float = 10.0
    # Per provider: its limits on the model (the host's backstop for a first byte that never
    # comes) and the endpoint a `model_timeout` names. A provider absent here gets defaults.
    model_limits: Mapping[str, ModelLimits] = field(default_factory=dict)
    model_endpoints: Mapping[str, str] = field(default_factory=dict)


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
    # The daemon passes `storage.Store`; each actor keeps to its own port of it.
    store: ActorStore
    workers: WorkerPort
    catalog: ProviderCatalog
    failpoints: Failpoints
    runtimes_dir: Path
    # Live provider runtimes per provider (actors/session_runtime `RuntimeSlots`, built by the
    # daemon with its stopper).
    runtime_slots: RuntimeSlotsPort
    timeouts: Timeouts = field(default_factory=Timeouts)
    live_operations: LiveOperations = field(default_factory=LiveOperations)
    # The bounded threads every Session actor runs on (not one thread each).
    actor_pool: ActorPool = field(default_factory=ActorPool)
    # Called with (workspace_id, session_id, busy) so the host knows which actors may idle out.
    on_busy_change: Callable[[str, str, bool], None] | None = None
    # The home's one shadow store of workspace checkpoints (`$AGENTHOST_HOME/checkpoints`,
    # docs/design/workspace.md): what Turns capture into and a fork or a restore reads.
    # None only where no daemon built one (in-process tests).
    checkpoints: ShadowStore | None = None
    # The captures at each Turn's start and end, over `checkpoints`; None when
    # `[workspace] checkpoints = false` (each Turn is then recorded `unavailable: disabled`).
    turn_checkpoints: TurnCheckpoints | None = None
    # Drops a deleted Session's checkpoint refs and collects what nothing keeps, on a
    # schedule; None where `checkpoints` is.
    checkpoint_janitor: CheckpointJanitor | None = None
    # Makes and removes `worktree` forks' trees from workspace checkpoints (None: this host
    # keeps no checkpoints, and a `worktree` fork is refused).
    fork_trees: ForkTrees | None = None
    # Hands a failed fork's tree git could not remove (workspace, operation, path, git's
    # error) to the daemon's live retries (`agenthost.worktree_delete.RemovalRetries`); None:
    # it waits for the next start's recovery.
    retry_failed_tree: Callable[[str, str, str, str], None] | None = None
    # The worker calls that may start an app-server in a Session's runtime folder (a
    # `fork.resolve`'s reads), and a delete's removal of it: never at once (actors/home_uses).
    home_uses: HomeUses = field(default_factory=HomeUses)
    # The workspaces whose runtime directory this daemon has spread (`_spread_workspace_dir`).
    _spread: set[str] = field(default_factory=set)

    def runtime_home(self, workspace_id: str, session_id: str, provider: str) -> Path:
        """`runtimes/<workspace>/<session>/<provider home>`; workspace ids are free text, so
        anything that is not a plain path segment is hashed."""
        segment = _path_segment(workspace_id)
        if segment not in self._spread:  # once a workspace (a set's lookup a fork)
            self._spread.add(segment)
            _spread_workspace_dir(self.runtimes_dir, segment)
        # One join (each `/` builds and parses a Path of its own: three a fork's dispatch).
        return self.runtimes_dir.joinpath(
            segment,
            session_id,
            self.catalog.driver_info(provider).home_dir_name,
        )


def _spread_workspace_dir(runtimes_dir: Path, segment: str) -> None:
    """Make `runtimes/<workspace>/` (0700) and flag it `FS_TOPDIR_FL`, once a workspace in a
    daemon (`HostContext._spread`), before any Session's directory is made in it: on ext4 each
    Session's and fork child's directory is then placed in a block group of its own (its
    name's hash picks where the search starts), so a fork's new inodes skip few recently freed ones
    (docs/design/drivers.md, "Where a runtime directory's inodes go"). Only on an ext4 without
    a journal, the one file system where that skipping happens. Best effort: an error leaves
    the directory to the worker, which makes it as before."""
    if not skips_recent_deletes(runtimes_dir):
        return  # elsewhere a spread directory only costs (~0.1 ms a `mkdir` measured here)
    path = runtimes_dir / segment
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass  # made before (by a worker, or an earlier daemon): flagged for what it gets next
    except OSError:
        return  # left to the worker, as before
    else:
        # Its entry durable before any Session directory in it is (the worker fsyncs only the
        # parents of what it creates itself); if that fails it is removed, for the worker.
        try:
            fd = os.open(runtimes_dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return
    spread_subdirs(path)


_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
_HASHED_SEGMENT = re.compile(r"ws-[0-9a-f]{24}")


@functools.lru_cache(maxsize=1024)
def _path_segment(text: str) -> str:
    """A workspace id as its runtimes/ directory's name (a pure function of the id, kept for
    the few workspaces a daemon serves: every fork's dispatch asks it)."""
    # Injective: a plain id that looks like a hashed one (`ws-` + 24 hex) is hashed too, so
    # two different workspace ids never share a runtimes/ directory.
    if _PLAIN_SEGMENT.fullmatch(text) and not _HASHED_SEGMENT.fullmatch(text):
        return text
    return "ws-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def runtime_key(workspace_id: str, session_id: str) -> str:
    """An opaque, workspace-unique key for a Session's runtime in a worker (session ids are
    only unique within a workspace)."""
    return f"{len(workspace_id)}:{workspace_id}:{session_id}"


def parse_runtime_key(key: str) -> tuple[str, str]:
    length, _, rest = key.partition(":")
    n = int(length)
    return rest[:n], rest[n + 1 :]
