"""The composition root of the daemon: opens the store, recovers fork operations, starts the
worker supervisor, the actors and the API server, and wires store changes to events.

`Daemon` is an ordinary object (no global state), so a test can run several in one process.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actors import runtime_dirs
from actors.checkpoints import (
    CheckpointJanitor,
    DirectoryLocks,
    TurnCheckpoints,
    checkpoint_pool,
)
from actors.context import (
    SESSION_START_S,
    HostContext,
    Timeouts,
    fork_deadline_s,
    parse_runtime_key,
)
from actors.fork_workspace import remove_failed_trees
from actors.host_actor import HostActor, SessionRoutes, driver_event, route
from actors.messages import DriverEvent, RuntimeLost
from actors.pool import ActorPool
from actors.recovery import (
    COMMITS_BEFORE_READY,
    DeferredCommits,
    RecoveryReport,
    StoreDiskFull,
    recover_fork_operations,
    recover_resolutions,
    settle_orphaned_turns,
    start_write,
)
from actors.session_runtime import RuntimeSlots
from agenthost import __version__, activity, log_queue, provider_install, providers_info
from agenthost.api import Api
from agenthost.catalog import Catalog
from agenthost.config import IPC_PATH_MAX, Config, check_home_paths
from agenthost.home import (
    HomeInUse,
    HomeLock,
    HomeUnsafe,
    check_data_dir,
    check_ipc_endpoint,
    check_private_dir,
    check_store_files,
    make_private_dir,
    prepare_home,
    prepare_ipc_dir,
)
from agenthost.home import acquire as acquire_home
from agenthost.keys import KeyStore
from agenthost.publisher import EventPublisher, StreamDelta
from agenthost.workers import SupervisorPort, providers_ahead
from agenthost.worktree_delete import GIT_FAILED, RemovalRetries, Waiting, finish_removals
from domain.errors import InvalidArgument, StoreCorrupt
from domain.home_layout import API_SOCKET, EVENTS_EXACT_SOCKET, EVENTS_SOCKET
from domain.model_limits import ModelLimits
from domain.providers import PROVIDERS, TUTTI_AGENT
from domain.redaction import redact_userinfo
from domain.turn_events import ACTIVITY_PROGRESS, ACTIVITY_STREAM, PROGRESS, TurnActivity
from domain.worker_messages import SessionStop
from drivers.errors import FailpointError
from drivers.failpoints import ENV_POINTS, Failpoints, format_points, parse_points
from drivers.supervisor import WorkerSupervisor
from protocol.methods import HostStatusResult
from storage.sqlite import CORRUPT_ERRORS
from storage.store import Store
from transport import accept_shim
from transport.connections import ConnectionGuard, raise_fd_limit
from transport.security import needs_curve
from transport.server import ApiServer
from workspace.git import LeftGits, kill_left_gits
from workspace.shadow import ShadowStore
from workspace.worktree import ForkTrees

log = logging.getLogger(__name__)

ENABLE_FAILPOINTS_ENV = "AGENTHOST_ENABLE_FAILPOINTS"


STREAM_ACTIVITY_EVERY_S = 1.0
KEYS_KEPT = 4096
"""Parsed runtime keys the worker events' sink keeps (a host with more parses again)."""
RUN_DIR_CHECK_S = 0.5
"""How often the daemon looks for its `run/` (removed under it: made again) and its home."""
STOP_GIT_WAIT_S = 2.0
"""How long a stop waits for the gits it killed to be gone (`Daemon._kill_gits`)."""
STATUS_PART_WAIT_S = 1.0
"""How long `host.status` waits for a part that can take long (the checkpoint store's size
walk, a provider's `--version`) before answering it as last known and naming it in `late`."""


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        listen: tuple[str, ...] = (),
        events_listen: tuple[str, ...] = (),
        events_exact_listen: tuple[str, ...] = (),
        failpoints_enabled: bool | None = None,
        catalog: Catalog | None = None,
        default_cwd: Path | None = None,
        commits_before_ready: int | None = COMMITS_BEFORE_READY,
    ) -> None:
        self.config = config
        # The `cwd` of a Session created without one (default: where the daemon runs).
        self.default_cwd = default_cwd
        # The provider tables with what `agenthost providers install` put under the home
        # (read once: the workers, `host.status` and `session.create` see the same programs).
        self.providers = provider_install.with_installed(config.home, config.providers)
        self.catalog = catalog or Catalog()
        self.listen = tuple(config.listen) + tuple(listen)
        self.events_listen = tuple(config.events_listen) + tuple(events_listen)
        self.events_exact_listen = tuple(config.events_exact_listen) + tuple(events_exact_listen)
        if failpoints_enabled is None:
            failpoints_enabled = os.environ.get(ENABLE_FAILPOINTS_ENV) == "1"
        self.failpoints_enabled = failpoints_enabled
        self.recovery: RecoveryReport | None = None
        self.commits_before_ready = commits_before_ready
        self.deferred_commits: DeferredCommits | None = None
        self.tree_retries: RemovalRetries | None = None
        # Why each tree start-up's `finish_removals` left `removing` is still there.
        self._trees_left: dict[str, Waiting] = {}
        self._started = time.monotonic()
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.publisher: EventPublisher | None = None
        self._stream_activity: dict[str, float] = {}  # turn id → last activity forwarded
        self._keys: dict[str, tuple[str, str]] = {}
        """Runtime key → (workspace, Session), parsed once per key (the supervisor's thread, per
        streamed delta: `_on_worker_event`); cleared past `KEYS_KEPT`."""
        self._backstopped: frozenset[str] = frozenset()
        """Providers whose Turns the Session actor's model backstops watch (`model_limits`):
        their first delta of a stretch tells the actor at once."""
        self._event_thread: threading.Thread | None = None
        self.store: Store | None = None
        self.server: ApiServer | None = None
        self.fd_limit = 0
        self._home_lock: HomeLock | None = None
        self.stop_requested = threading.Event()
        """Set when the daemon cannot go on serving its home (`serve` then stops it)."""
        self.run_dir_restored = 0
        self.left_gits = LeftGits()
        """The gits a previous daemon on the home left that outlived their kill at start,
        watched until gone (`host.status` → `leftGits`)."""
        self._closing = threading.Event()
        self._keeper: threading.Thread | None = None
        self._run_id: tuple[int, int] | None = None
        self._restoring_id: tuple[int, int] | None = None  # `run/` as a restore made it
        self._server_keys: dict[str, bytes] = {}

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.config
        # Private data: the home and its run dir must be ours alone (refused otherwise), and
        # one daemon per home: the lock is taken before the store is opened or anything in the
        # home is written, so a second `serve` on a live home changes nothing (HomeInUse).
        check_home_paths(cfg)  # a too-long home is refused before anything is created
        # Every descriptor the hard limit allows: the listeners' caps and the reserve kept for
        # the store, workers and providers are derived from it (`transport.connections`).
        self.fd_limit = raise_fd_limit()
        for endpoint in (*self.listen, *self.events_listen, *self.events_exact_listen):
            check_ipc_endpoint(endpoint)  # no abstract sockets, no foreign socket dirs
        prepare_home(cfg.home)
        self._home_lock = acquire_home(cfg.home)
        # A git a killed daemon left (its own session: not killed with it) may still hold
        # lock files and write in a shadow repository: it dies before any git runs here, so
        # `clear_stale_once` removes only lock files nothing writes behind. One that outlives
        # the wait (in the kernel on a stalled disk) keeps its repository's lock files until
        # its pidfd says it is gone: that folder's checkpoints are `unavailable` meanwhile.
        killed, self.left_gits = kill_left_gits(cfg.checkpoints_dir, cfg.checkpoint_long_timeout_s)
        if killed:
            alive = self.left_gits.alive()
            log.warning(
                "killed %d git process(es) a previous daemon left (%d still alive%s)",
                killed,
                len(alive),
                f": pids {[g.pid for g in alive]}, their lock files kept" if alive else "",
            )
        check_data_dir(cfg.runtimes_dir, "runtimes directory")
        check_data_dir(cfg.checkpoints_dir, "checkpoints directory")
        check_store_files(cfg.store_path)
        make_private_dir(cfg.runtimes_dir)
        for endpoint in (*self.listen, *self.events_listen, *self.events_exact_listen):
            prepare_ipc_dir(endpoint)

        fp_state = cfg.run_dir / "failpoints-host"
        fp_state.mkdir(mode=0o700, exist_ok=True)
        # Armed before recovery, which has a point of its own (`host.recovery.before_commits`).
        # The state dir makes a fired `once:` point survive the SIGKILL it causes, so the
        # restarted daemon is not killed again by the same armed point.
        # PROTOCOL.md: AGENTHOST_FAILPOINTS arms points at start (setting it is the opt-in);
        # only the run-time `debug.failpoints` method needs AGENTHOST_ENABLE_FAILPOINTS=1.
        env_points = os.environ.get(ENV_POINTS, "")
        if env_points:
            log.warning("failpoints armed from %s: %s", ENV_POINTS, env_points)
        self.failpoints = Failpoints(
            {k: v for k, v in parse_points(env_points).items() if k.startswith("host.")},
            state_dir=fp_state,
        )
        try:
            store, shadow, fork_trees, deferred = self._open_and_recover(cfg)
        except StoreDiskFull as exc:
            # Not another process's lock: the start fails at once, naming the store's path.
            raise exc.at(cfg.store_path) from exc.__cause__
        except CORRUPT_ERRORS as exc:
            # A damaged store file (not a database, a damaged schema page): the start says
            # which file and how to recover it, as a running daemon tells each request.
            raise StoreCorrupt(
                f"the store file {cfg.store_path} is damaged (SQLite: {exc}): copy"
                " store.sqlite3* aside and recover them (`sqlite3 store.sqlite3 .recover`,"
                " docs/user-guide.md), then start again"
            ) from exc

        self.supervisor = WorkerSupervisor(
            cfg.run_dir / "workers",
            provider_config=_provider_config(cfg, self.providers),
            failpoints=format_points(
                {k: v for k, v in parse_points(env_points).items() if not k.startswith("host.")}
            ),
        )
        port = SupervisorPort(self.supervisor)
        slots = RuntimeSlots(
            cfg.max_runtimes_per_provider,
            # The worker's stop waits for a start of that runtime still in progress (so
            # none outlives its slot); the grant waits for the stop, within the start budget.
            stop=lambda provider, key: port.stop_session(
                provider, SessionStop(key), SESSION_START_S
            ),
            start_limit=cfg.max_runtime_starts_per_provider,
        )
        self._checkpoint_pool = pool = checkpoint_pool()
        locks = DirectoryLocks()
        janitor = CheckpointJanitor(
            shadow,
            store,
            pool,
            locks,
            cfg.checkpoint_gc_interval_s,
            max_bytes=cfg.checkpoint_max_store_bytes,
        )
        self.ctx = HostContext(
            store=store,
            workers=port,
            catalog=self.catalog,
            failpoints=self.failpoints,
            runtimes_dir=cfg.runtimes_dir,
            runtime_slots=slots,
            timeouts=Timeouts(
                fork_sync_budget_s=cfg.fork_sync_budget_s,
                store_retry_limit_s=cfg.store_retry_limit_s,
                turn_inactivity_s=cfg.turn_inactivity_s,
                interrupt_s=cfg.turn_interrupt_s,
                fork_provider_call_s=cfg.fork_provider_call_s,
                fork_s=fork_deadline_s(cfg.fork_provider_call_s),
                model_limits=_model_limits(cfg),
                model_endpoints={  # as the host's messages name them: no user, no password
                    provider: redact_userinfo(str(table["model_base_url"]))
                    for provider, table in cfg.providers.items()
                    if table.get("model_base_url")
                },
            ),
            actor_pool=ActorPool(cfg.actor_threads, name="session"),
            fork_trees=fork_trees,
            checkpoints=shadow,
            turn_checkpoints=(
                TurnCheckpoints(shadow, pool, locks, self.failpoints) if cfg.checkpoints else None
            ),
            checkpoint_janitor=janitor,
        )
        self._backstopped = frozenset(self.ctx.timeouts.model_limits)
        janitor.start(self.ctx.actor_pool.call_later)
        # The live Session actors, shared with the API and the worker events: a message for
        # a live one goes straight to it, not through the HostActor's thread.
        self.routes = SessionRoutes()
        self.host = HostActor.start(
            self.ctx, idle_after_s=cfg.idle_actor_seconds, routes=self.routes
        )
        host = self.host

        def _lifecycle(provider: str, event: dict[str, Any]) -> None:
            if event.get("type") == "worker.lost":
                slots.reset(provider)  # its runtimes died with it
                host.tell(RuntimeLost(provider, str(event.get("reason") or "")))

        self.supervisor.set_lifecycle_sink(_lifecycle)
        # Before the worker events' sink is set: a streamed delta goes to the publisher.
        self.publisher = EventPublisher(store, self.catalog, self._events)
        self.supervisor.set_event_sink(self._on_worker_event)
        self._event_thread = threading.Thread(
            target=self.publisher.run, name="agenthost-events", daemon=True
        )
        self._event_thread.start()
        store.db.subscribe_batches(self.publisher.offer_many)
        if activity.enabled():
            # `serve -v` lines (decided before the daemon is built): a quiet daemon subscribes
            # nothing, so no store change runs anything of `agenthost.activity`.
            store.db.subscribe(activity.Transitions(store))

        # The trees git could not remove, at start-up or in a delete, tried again while the
        # daemon runs (from the ready line: `retry_left` below).
        self.tree_retries = tree_retries = RemovalRetries(
            store, fork_trees.trees, shadow, locks, first_s=cfg.tree_retry_s
        )
        # A failed fork's tree git could not remove, handed on by its Session's actor.
        self.ctx.retry_failed_tree = tree_retries.retry_failed
        self.api = Api(
            store=store,
            host=self.host,
            routes=self.routes,
            catalog=self.catalog,
            status=self._status,
            set_failpoints=self._set_failpoints if self.failpoints_enabled else None,
            default_cwd=str(self.default_cwd or Path.cwd()),
            checkpoints=shadow,
            checkpoint_locks=locks,
            hit=self.failpoints.hit,
            retry_tree=tree_retries.retry,
            tree_user_gone=tree_retries.user_gone,
            check_provider=lambda provider: providers_info.check_installed(
                provider, self.providers.get(provider, {})
            ),
        )
        api_endpoints = [f"ipc://{cfg.run_dir / API_SOCKET}", *self.listen]
        # Every non-ipc endpoint is a CURVE server admitting only run/keys/authorized/ (the
        # keys are made at first start); ipc stays NULL, guarded by its 0600 file mode.
        self.keys = KeyStore(cfg.run_dir)
        self.keys.ensure()
        self.server = ApiServer(
            api_endpoints,
            f"ipc://{cfg.run_dir / EVENTS_SOCKET}",
            self.api,
            events_listen=list(self.events_listen),
            curve=self.keys.server_curve(),
            events_exact_endpoint=_exact_ipc(cfg),
            events_exact_listen=list(self.events_exact_listen),
        )
        # The publisher (running since before the server existed) publishes to it from now.
        self.publisher.sink = self.server
        self.server.start()
        self.connection_file = self.keys.write_connection_file(
            _first_network(self.server.endpoints),
            _first_network(self.server.events_endpoints),
            _first_network(self.server.events_exact_endpoints),
        )
        if any(
            needs_curve(e) for e in (*self.listen, *self.events_listen, *self.events_exact_listen)
        ):
            log.info("TCP endpoints require CURVE; connection file: %s", self.connection_file)
        self._server_keys = self.keys.server_files()
        self._run_id = _dir_id(cfg.run_dir)
        self._keeper = threading.Thread(target=self._keep_home, name="agenthost-home", daemon=True)
        self._keeper.start()
        tree_retries.retry_left(self._trees_left)
        # Last: the commits' thread must not slow the start it was deferred out of.
        deferred.start()

    def _open_and_recover(
        self, cfg: Config
    ) -> tuple[Store, ShadowStore, ForkTrees, DeferredCommits]:
        """The store opened and every leftover of a previous process settled, before any
        request is served. A write the store refuses is retried while it is busy (another
        process's lock, `start_write`); one its disk refuses fails the start at once."""
        # Its migration's `BEGIN IMMEDIATE` (a write, even when there is nothing to migrate)
        # waits for a store another process keeps busy, as start-up's other writes do.
        store = self.store = start_write(
            lambda: Store.open(
                cfg.store_path,
                busy_timeout_ms=cfg.store_busy_timeout_ms,
                max_connections=cfg.store_connections,
            ),
            "opening the store",
        )
        # A failed fsync of the store's log refuses every later write and stops the daemon
        # (docs/design/store.md "A failed sync stops the writes").
        store.db.on_sync_failed(self._store_sync_failed)
        if self.failpoints_enabled or self.failpoints.armed:
            store.db.before_sync = self._store_sync_point  # none on a daemon without points
        # Recovery settles every leftover before any request is served; the commits of
        # `provider_accepted` ones past a bound are made after the ready line
        # (`DeferredCommits`: until then each is an operation awaiting its commit, which a
        # `fork.get` of it makes at once).
        self.recovery = recover_fork_operations(
            store, commit_before_ready=self.commits_before_ready, hit=self.failpoints.hit
        )
        self.deferred_commits = deferred = DeferredCommits(store, self.recovery.deferred)
        # Then fork.resolve: finish or roll back a half-done resolution.
        self.resolutions_recovered = recover_resolutions(store)
        self.orphaned_turns = settle_orphaned_turns(store)
        # One shadow store of workspace checkpoints per home, shared by every Session.
        shadow = ShadowStore(
            cfg.checkpoints_dir,
            excludes=cfg.checkpoint_excludes,
            size_limit=cfg.checkpoint_max_file_bytes,
            timeout_s=cfg.checkpoint_timeout_s,
            long_timeout_s=cfg.checkpoint_long_timeout_s,
            left_gits=self.left_gits,
            private=(cfg.home,),
        )
        # A failed fork's tree (whole, or half-made by a crash before its record) goes now.
        fork_trees = ForkTrees(shadow, cfg.worktrees_dir)
        failed_left: dict[str, str] = {}
        self.worktrees_removed = remove_failed_trees(store, fork_trees, failed_left)
        self._trees_left.update(
            (op_id, Waiting(GIT_FAILED, error=error)) for op_id, error in failed_left.items()
        )
        # And the tree a delete was removing when it stopped.
        self.worktrees_removed += finish_removals(store, fork_trees.trees, self._trees_left)
        # Deletes a killed daemon did not finish: their runtime dirs go now.
        runtime_dirs.sweep(store, cfg.runtimes_dir)
        return store, shadow, fork_trees, deferred

    def start_workers_ahead(self) -> threading.Thread | None:
        """Called once the ready line is out (`agenthost serve`): the configured, installed
        providers' workers (`providers_ahead`) are spawned now rather than by their first
        request, so the first Turn or fork after a start does not wait for a worker's
        interpreter, imports and driver (each worker loads its driver as it starts). Never
        before ready, and never beside start-up recovery: it waits until the commits deferred
        past the ready line are made. Each worker is then the supervisor's as if a request
        had spawned it (restarted on death, ended by `close`). Off with `workers_ahead =
        false`."""
        if not self.config.workers_ahead or getattr(self, "supervisor", None) is None:
            return None
        supervisor, deferred = self.supervisor, self.deferred_commits

        def run() -> None:
            while deferred is not None and not deferred.wait(0.25):
                if self._closing.is_set():
                    return
            if self._closing.is_set():
                return
            for provider in providers_ahead(self.providers):
                supervisor.start_ahead(provider)
                log.info("worker of %s started ahead of its first use", provider)

        thread = threading.Thread(target=run, name="agenthost-workers-ahead", daemon=True)
        thread.start()
        return thread

    # -- the home under the live daemon -----------------------------------------------------

    def _keep_home(self) -> None:
        """`run/` removed under the live daemon (a cleaner of old files may do it): made again
        with everything in it, so the daemon keeps serving new clients too. The home itself
        removed or replaced: nothing the daemon writes can be found there any more, so it
        stops (`stop_requested`). The home's lock is held all along either way."""
        while not self._closing.wait(RUN_DIR_CHECK_S):
            try:
                lock = self._home_lock
                if lock is not None and lock.home_replaced():
                    self._must_stop(
                        f"the home {self.config.home} was removed or replaced under the live "
                        "daemon; its store is out of reach, so the daemon stops"
                    )
                    return
                if _dir_id(self.config.run_dir) != self._run_id or self._run_incomplete():
                    self._restore_run_dir()
            except (HomeUnsafe, HomeInUse) as exc:
                self._must_stop(
                    f"{self.config.run_dir} was removed and cannot be made again: {exc}"
                )
                return
            except Exception as exc:  # noqa: BLE001 - the keeper must outlive one failed attempt
                if self._removed_again(exc):
                    # A cleaner's `rm -r` still at work (or run again) under the restore: an
                    # expected race; the next check makes the directory again from the start.
                    log.warning(
                        "%s was removed again while being made again (%s: %s); trying again",
                        self.config.run_dir,
                        type(exc).__name__,
                        exc,
                    )
                else:
                    log.exception("restoring %s failed; trying again", self.config.run_dir)

    def _removed_again(self, exc: BaseException) -> bool:
        """Whether a failed restore failed because `run/` (or a file in it) was removed again
        meanwhile: a file gone under it, or the directory no longer the one it made."""
        return isinstance(exc, FileNotFoundError) or _dir_id(self.config.run_dir) != (
            self._restoring_id
        )

    def _run_incomplete(self) -> bool:
        """The same `run/`, but its lock file or API socket gone: a removal that raced our
        restoring (`rm -r` unlinking what we had just made again) leaves such a directory."""
        lock = self._home_lock
        api = self.config.run_dir / API_SOCKET
        return (lock is not None and not lock.path.exists()) or not api.exists()

    def _restore_run_dir(self) -> None:
        cfg = self.config
        run = cfg.run_dir
        _tighten_own_dir(run)
        if not check_private_dir(run, "run directory", exact_0700=True):
            make_private_dir(run)
            check_private_dir(run, "run directory", exact_0700=True)
        self._restoring_id = _dir_id(run)
        if self._closing.is_set():
            return
        assert self._home_lock is not None and self.server is not None
        self._home_lock.renew()
        (run / "failpoints-host").mkdir(mode=0o700, exist_ok=True)
        self.supervisor.restore_dirs()
        self.keys.restore_server(self._server_keys)
        minted = not (self.keys.dir / "client.key_secret").exists()
        self.keys.ensure()
        again = self.server.rebind_missing_ipc().result(timeout=10)
        self.connection_file = self.keys.write_connection_file(
            _first_network(self.server.endpoints),
            _first_network(self.server.events_endpoints),
            _first_network(self.server.events_exact_endpoints),
        )
        self._run_id = _dir_id(run)
        self.run_dir_restored += 1
        log.warning(
            "%s was removed under the live daemon: made it again (lock and pid; sockets bound "
            "again: %s)%s",
            run,
            ", ".join(again) or "none",
            "; a new first client key is in connection.json, and other TCP client keys must be"
            " added again with `agenthost keys add`"
            if minted
            else "",
        )

    def _store_sync_point(self) -> None:
        """`host.store.wal_sync`, before a durable group's fsync of the store's log: `error`
        fails the sync as a disk's I/O error would (`kill`: a crash between a COMMIT and its
        fsync)."""
        try:
            self.failpoints.hit("host.store.wal_sync")
        except FailpointError as exc:
            raise OSError(errno.EIO, str(exc)) from exc

    def _store_sync_failed(self, exc: OSError) -> None:
        self._must_stop(
            f"the disk failed to sync the store's log ({exc}): writes since the last good sync "
            "may not be on the disk, so no write is taken from now on and the daemon stops; "
            f"check the disk holding {self.config.store_path}, then start the daemon again"
        )

    def _must_stop(self, why: str) -> None:
        log.error("%s", why)
        self.stop_requested.set()

    def _on_worker_event(self, provider: str, key: str, event: dict[str, Any]) -> None:
        parsed = self._keys.get(key)
        if parsed is None:
            try:
                parsed = parse_runtime_key(key)
            except ValueError:
                log.warning("worker event for an unreadable session key %r", key)
                return
            if len(self._keys) >= KEYS_KEPT:
                self._keys.clear()
            self._keys[key] = parsed
        ws, sid = parsed
        turn_id = str(event.get("turnId") or "")
        if event.get("type") == "message.delta":
            # Not durable and never stored: to the transport now, or onto the events queue
            # behind what is there; after every change offered earlier and ahead of the
            # settlement the same worker reports after it (design/internals.md).
            publisher = self.publisher
            assert publisher is not None  # built before this sink was set
            publisher.offer_delta(StreamDelta(ws, sid, event))
            if event.get("kind") == PROGRESS:
                # The provider retries its model request: the Session actor's first-byte
                # backstop keeps running (a retry is not an answer) and its stream-idle one
                # stops (the provider noticed the silence itself). Rare: each one is told.
                activity_kind = ACTIVITY_PROGRESS
            elif self._activity_told(provider, turn_id):
                activity_kind = ACTIVITY_STREAM
            else:
                return
            route(
                self.routes, self.host, ws, sid, DriverEvent(TurnActivity(turn_id, activity_kind))
            )
            return
        if event.get("type") == TurnActivity.TYPE and provider not in self._backstopped:
            # A driver's note that a started item runs (the reply's own, a tool): with no model
            # backstop only the inactivity watchdog reads it, on the stream's clock.
            if not self._activity_told(provider, turn_id):
                return
        else:
            # Any other event ends a stretch of streaming (an item completed, a tool started,
            # an approval asked): the next delta is told at once, so the actor knows the model
            # streams again.
            self._stream_activity.pop(turn_id, None)
        if event.get("type") == "item" and _is_user_item(event):
            # The provider's copy of the Turn's user Message: the submit's claim wrote the
            # canonical one, so the actor has nothing to store for it (nor is it the model
            # answering). Not routed: no actor message in the window where the provider is
            # sending the model its request.
            return
        typed = driver_event(key, event)
        if typed is not None:
            route(self.routes, self.host, ws, sid, typed)

    def _activity_told(self, provider: str, turn_id: str) -> bool:
        """Whether a Turn's streaming (or running item) is told to its Session actor now: the
        watchdogs live there, so it hears at most every second that the Turn is not hung (a
        long reply is not a hung provider; the stream-idle backstop's grace exceeds this lag).
        For a provider the model backstops watch, the first note of a stretch is told at once
        (it ends the first-byte wait, arms the stream-idle one); for one they do not, only the
        inactivity watchdog (minutes) reads it, which the Turn's last routed event fed: the
        clock starts at the first note, and one a second later is told."""
        now = time.monotonic()
        told = self._stream_activity.get(turn_id)
        if len(self._stream_activity) > 4096:
            self._stream_activity.clear()
        if told is None and provider not in self._backstopped:
            self._stream_activity[turn_id] = now
            return False
        if told is not None and now - told < STREAM_ACTIVITY_EVERY_S:
            return False
        self._stream_activity[turn_id] = now
        return True

    def publish_state(self, state: str | None) -> None:
        """What clients are told this daemon does while it does not answer (`run/daemon.state`,
        `HomeLock.publish`); None once it serves."""
        if self._home_lock is not None:
            self._home_lock.publish(state)

    def close(self) -> None:
        self._closing.set()
        self.publish_state("stopping")
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(15)
        if self.server is not None:
            self.server.close()
        if self.deferred_commits is not None:
            self.deferred_commits.close()
        if self.tree_retries is not None:
            self.tree_retries.stop()  # joined once the gits are killed
        # A git still running (a stalled capture, a `gc`, a restore's checkout) would hold the
        # stop for its whole bound — a thread of the checkpoint pool waits on it and the
        # process exits only once that thread does: killed now, as a killed daemon's are at
        # the next start (their lock files are `clear_stale_once`'s then). Again once the
        # actors are gone, for one a Turn's end started meanwhile.
        self._kill_gits()
        if self.tree_retries is not None:
            self.tree_retries.close()
        if getattr(self, "host", None) is not None:
            try:
                self.host.stop(timeout=15)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                log.exception("host actor did not stop cleanly")
        if getattr(self, "api", None) is not None:
            self.api.close()
        if getattr(self, "supervisor", None) is not None:
            self.supervisor.close()
        self.left_gits.close()
        self._events.put(None)
        if self._event_thread is not None:
            self._event_thread.join(5)
        if getattr(self, "ctx", None) is not None:
            self.ctx.actor_pool.close()
            self._kill_gits()
            if self.ctx.checkpoint_janitor is not None:
                self.ctx.checkpoint_janitor.close()
            self._checkpoint_pool.shutdown(wait=False, cancel_futures=True)
        if self.store is not None:
            self.store.close()
        if self._home_lock is not None:
            self._home_lock.release()
            self._home_lock = None

    def _kill_gits(self) -> None:
        """Kill every git this home runs (`kill_left_gits`), waiting `STOP_GIT_WAIT_S` at
        most for them to go (one in the kernel on a stalled disk is left to the next start).
        Only while this daemon holds the home: a start refused before it took the home (a bad
        endpoint) must not kill the gits of the daemon that holds it."""
        if self._home_lock is None:
            return
        killed, left = kill_left_gits(self.config.checkpoints_dir, STOP_GIT_WAIT_S)
        alive = len(left.alive())
        left.close()
        if killed:
            log.info("stop: killed %d running git process(es) (%d still alive)", killed, alive)

    @property
    def api_endpoint(self) -> str:
        assert self.server is not None
        return self.server.endpoints[0]

    @property
    def events_endpoint(self) -> str:
        assert self.server is not None
        return self.server.events_endpoint

    @property
    def events_exact_endpoint(self) -> str | None:
        """The home's terminated-topic events socket (None if its path would not fit)."""
        assert self.server is not None
        exact = self.server.events_exact_endpoints
        return exact[0] if exact and exact[0].startswith("ipc://") else None

    def ready_line(self) -> dict[str, Any]:
        return {
            "ready": True,
            "api": self.api_endpoint,
            "events": self.events_endpoint,
            "pid": os.getpid(),
            "endpoints": self.server.endpoints if self.server else [],
            "eventsEndpoints": self.server.events_endpoints if self.server else [],
            # Extension: the same events under `workspaceId + "\0"` topics.
            "eventsExact": self.events_exact_endpoint,
            "eventsExactEndpoints": self.server.events_exact_endpoints if self.server else [],
            "connectionFile": str(self.connection_file),
        }

    # -- host.status, failpoints ------------------------------------------------------------

    def _status(self) -> HostStatusResult:
        """`host.status`: answered within its bound whatever part is stuck
        (docs/reliability.md). Every part is read in memory under a short lock, but for the
        two that can take long — the checkpoint store's size walk and a provider's
        `--version` — which are waited for `STATUS_PART_WAIT_S` at most and then answered as
        last known (named in `late`). No part goes through an actor's inbox: the live Session
        actors are counted from the routes themselves, not asked of a HostActor that may be
        busy (a worker's death, a fork's recovery)."""
        late: list[str] = []
        janitor = self.ctx.checkpoint_janitor
        if janitor is not None:
            # The size walk started (or the cached size read) before the versions are waited
            # for: the two slow parts' waits overlap, one `STATUS_PART_WAIT_S` in all.
            janitor.size_bytes(wait=0.0)
        providers = providers_info.describe_all(
            [(name, self.providers.get(name, {})) for name in self.catalog.providers()],
            version_wait=STATUS_PART_WAIT_S,
        )
        late += [f"providers.{p['provider']}.version" for p in providers if p["versionPending"]]
        checkpoints = self._checkpoint_status(late)
        return {
            "version": __version__,
            "protocol": 1,
            "home": str(self.config.home),
            "workers": self.supervisor.status(),
            "uptimeMs": int((time.monotonic() - self._started) * 1000),
            # Extensions: live Session actors and daemon threads (idle actors are stopped).
            "sessionActors": len(self.routes),
            "threads": threading.active_count(),
            "storeConnections": self.store.db.open_connections() if self.store else 0,
            # Delayed messages pending on the shared timer thread (watchdogs, retries, fork
            # budgets): bounded by the live ones, whatever the number of Turns run.
            "timers": len(self.ctx.actor_pool.timers),
            # Requests taken and not yet answered, this one included: 1 once every other
            # request has been answered (sent, kept for its client, or dropped).
            "requestsInFlight": self.server.in_flight if self.server is not None else 0,
            # Live provider runtimes per provider: {live, busy, queued, limit}.
            "runtimes": self.ctx.runtime_slots.status(),
            # The workspace checkpoint store (docs/design/workspace.md): its size on disk.
            "checkpoints": checkpoints,
            # What the listeners hold, refused and shed, and the descriptor limit and reserve.
            "connections": (
                guard.stats() | {"acceptShim": accept_shim.status()}
                if (guard := self._connections())
                else None
            ),
            # Each provider's program, endpoint, model and credential source (never a key).
            "providers": providers,
            # The parts answered as last known (or null) because they did not answer in time.
            "late": late,
            # The log's queue (`agenthost serve`): lines dropped because it was full (a stderr
            # nobody reads), queued now, its capacity; null when the daemon logs otherwise.
            "log": log_queue.status(),
            # The gits a killed daemon left that outlived their kill at this start, still
            # alive: their shadow repositories' lock files are kept until they are gone.
            "leftGits": self.left_gits.status(),
            # Deleted Sessions' runtime folders whose removal is asked for and not ended: it
            # waits for the worker calls that may start an app-server there (actors/home_uses).
            "homeRemovals": [
                {
                    "workspaceId": r.key[0],
                    "agentSessionId": r.key[1],
                    "calls": r.calls,
                    "held": r.held,
                    "waitingMs": int(r.waiting_s * 1000),
                }
                for r in self.ctx.home_uses.removals()
            ],
            # The trees git could not remove (`removing`) that the daemon tries again.
            "worktreeRemovals": (
                self.tree_retries.status() if self.tree_retries is not None else None
            ),
        }

    def _checkpoint_status(self, late: list[str]) -> dict[str, Any]:
        janitor = self.ctx.checkpoint_janitor
        size: int | None = 0
        if janitor is not None:
            size = janitor.size_bytes(wait=STATUS_PART_WAIT_S)
            if janitor.size_late:
                late.append("checkpoints.bytes")
        return {
            "enabled": self.ctx.turn_checkpoints is not None,
            "path": str(self.config.checkpoints_dir),
            "bytes": size,
            "sweeps": janitor.sweeps if janitor is not None else 0,
            "maxBytes": self.config.checkpoint_max_store_bytes,
            "droppedForCap": janitor.capped if janitor is not None else 0,
        }

    def _connections(self) -> ConnectionGuard | None:
        return self.server.connections if self.server is not None else None

    def _set_failpoints(self, points: dict[str, str]) -> dict[str, str]:
        host_points = {k: v for k, v in points.items() if k.startswith("host.")}
        worker_points = {k: v for k, v in points.items() if not k.startswith("host.")}
        try:
            merged = dict(self.failpoints.set(host_points)) if host_points else {}
            if worker_points:
                merged.update(self.supervisor.set_failpoints(worker_points))
        except ValueError as exc:
            raise InvalidArgument("points", str(exc)) from exc
        return merged


def _tighten_own_dir(path: Path) -> None:
    """A `run/` made again by one of our own writers racing the restore (a worker's socket
    directory, `mkdir(parents=True)` under the umask) may be 0755: a real directory of ours
    under our held home lock is set back to 0700 rather than stopping the daemon. A symlink,
    another owner's directory or a file is left for the check to refuse."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, 0o700)


def _dir_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a directory, None when it is missing: a new one is another id."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _model_limits(cfg: Config) -> dict[str, ModelLimits]:
    """The limits the host's first-byte backstop applies, per provider that talks to a model
    endpoint (every one but tutti-agent on its built-in model, which is not a network call)."""
    return {
        provider: ModelLimits.from_mapping(cfg.providers.get(provider, {}))
        for provider in PROVIDERS
        if provider != TUTTI_AGENT or cfg.providers.get(provider, {}).get("model_base_url")
    }


def _provider_config(
    cfg: Config, providers: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each provider's table (with the home's installs), plus the worker's limit for a provider
    fork call (the host's fork deadline is derived from it, so the worker always decides
    first), how long a provider process may stay stopped (or silent) during a Turn, and how
    long an app-server's write may take no byte."""
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in providers.items()}
    for provider in ("tutti-agent", "codex"):
        table = out.setdefault(provider, {})
        table.setdefault("fork_timeout_s", cfg.fork_provider_call_s)
        table.setdefault("stopped_limit_s", cfg.provider_stopped_s)
        table.setdefault("write_limit_s", cfg.provider_write_s)
    out.setdefault("claude-code", {}).setdefault("stopped_limit_s", cfg.provider_stopped_s)
    return out


def _exact_ipc(cfg: Config) -> str | None:
    """The ipc endpoint of the terminated-topic events socket, beside `events.sock`; None when
    its (longer) path would not fit a Unix socket address: a home that starts today keeps
    starting, its clients fall back to `events.sock` and filter exactly."""
    path = cfg.run_dir / EVENTS_EXACT_SOCKET
    if len(os.fsencode(str(path))) > IPC_PATH_MAX:
        log.warning("%s is too long for a Unix socket: no terminated-topic events socket", path)
        return None
    return f"ipc://{path}"


def _first_network(endpoints: list[str]) -> str | None:
    """The first CURVE (tcp) endpoint, as a client on this machine reaches it: a wildcard bind
    is written as loopback (a remote client puts the host's name there)."""
    for endpoint in endpoints:
        if needs_curve(endpoint):
            return endpoint.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace(
                "tcp://[::]:", "tcp://[::1]:"
            )
    return None


def _is_user_item(event: Mapping[str, Any]) -> bool:
    """A worker's `item` event of kind `user` (the wire map of internals.md)."""
    item = event.get("item")
    return isinstance(item, Mapping) and item.get("kind") == "user"
