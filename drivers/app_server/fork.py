"""The through-turn fork of the generic app-server driver (seed 000 §7, §7.1): the frozen
prefix checked on the source before any mutation, exactly one `thread/fork`, the child verified
against the prefix, the `host_copy` binder, and the proof that the bound child reads from its own
home alone (in the worker with the provider's reader, else a fresh app-server there). Every
provider outcome is a `ForkResult` disposition; nothing here raises for one.
`ForkThroughTurn` is the app-server driver's fork strategy, over its `Runtimes` and `Sessions`;
the large objects a fork built are released after its answer has left (`release_later`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from domain.enums import DeliveryDisposition
from domain.errors import HostError
from domain.worker_messages import ForkBinding, ForkChild, ForkRequest, ForkResult
from drivers import binder as binder_module
from drivers.app_server.items import thread_of, turn_ids
from drivers.app_server.process import (
    AppServerClosed,
    AppServerFailure,
    AppServerTimeout,
    JsonRpcError,
)
from drivers.app_server.provider import AppServerProvider
from drivers.app_server.runtimes import Runtimes, first_turns_page
from drivers.app_server.state import Runtime, Sessions, VerifiedTurns
from drivers.binder import BinderError, DirsAhead, ParsedRollout, RolloutBinder
from drivers.errors import FailpointError
from drivers.failpoints import Failpoints
from tutti_agent.rollout import file_holds, gc_paused, hold_collector

READABILITY_IN_WORKER = "in_worker"
"""The bound child is proven readable by the provider's own reader inside the worker."""
READABILITY_APP_SERVER = "app_server"
"""... by a fresh app-server spawned on the target home (the fallback)."""

# The in-worker proof (seed 000 §7, ARCHITECTURE.md: before a fork may be `accepted`, the child
# the binder copied is readable from the target home with nothing from the source home). A
# fresh app-server on the target home per fork would cost ~80 ms of interpreter start-up for
# tutti-agent, more for Codex, so the proof is made with the provider's own history reader, in
# the worker process, from the files of the target home only (`AppServerProvider.read_child`:
# tutti-agent's own store in `drivers.tutti_agent`, the strict Codex lineage reader in
# `drivers.codex.lineage`). Every reader requires: the child names the source as
# `forked_from_id`, its turns are exactly the frozen prefix (ids, in order) and none of them
# is in progress (`prefix_problem`). A problem is returned as text (the fork becomes
# `unknown`); a history the reader cannot judge raises `ReaderNotApplicable` and the fork
# falls back to the spawned app-server's proof. Seed 000 §10's idempotent re-bind at the
# child's first resume stays the second line of defence.


SOURCE_RECHECK_S = 0.05
"""How long a fork waits before it reads a source rollout it would refuse once more."""
TURN_END_RECHECKS_S = (0.05, 0.2, 0.75)
"""The waits before a Turn's end not found in a rollout is looked for again (about 1 s in
all): the app-server may write the Turn's last lines after it announced the Turn's end, the
more so on a loaded machine, and a refusal of a history that is whole would fail a Turn."""

HISTORY_MISSING = "provider_history_missing"
"""The reason a fork whose source's history lost its boundary Turn fails with."""

INTERNAL_ERROR = -32603
"""JSON-RPC's internal error: from `thread/fork`, a failure that may come after the child was
written, so the fork is `unknown`, not `rejected`."""


class ReaderNotApplicable(Exception):
    """The in-worker reader cannot judge this child (another provider version, a history
    format it does not know); the caller must prove readability another way."""


def prefix_problem(turns: Sequence[tuple[str | None, bool]], prefix: Sequence[str]) -> str | None:
    """The judgement every provider's in-worker reader ends with: `turns` as (id, in_progress)
    in history order; None when they are exactly `prefix` (ids, in order) and none is in
    progress, else the problem in words."""
    ids = [t for t, _ in turns]
    if ids != list(prefix):
        return f"target home shows turns {ids}, not the frozen prefix {list(prefix)}"
    busy = [t for t, in_progress in turns if in_progress]
    if busy:
        return f"target home shows turns {busy} still in progress"
    return None


def _attested(request: ForkRequest, generation: int) -> bool:
    """Whether the fork names `generation` as its source runtime's (`runtimeGeneration`,
    `<worker incarnation>:<generation>`): the worker let it through only after finding that
    runtime live, on this thread, a moment before (`WorkerServer._fork`); it is not asked
    again (its `waitid` and `/proc` read). A runtime that died since fails the fork's own
    call (`not_started` before the request is written, `unknown` after), as one dying just
    after a second look would; it is never replaced by a transient runtime, which a fork
    bound to that runtime's attestation must not run on."""
    named = request.runtime_generation
    return named is not None and named.rpartition(":")[2] == str(generation)


class ForkThroughTurn:
    """`fork(request) -> ForkResult` over the driver's app-servers."""

    def __init__(
        self,
        provider: AppServerProvider,
        runtimes: Runtimes,
        sessions: Sessions,
        binder: RolloutBinder,
        failpoints: Failpoints,
        *,
        fork_timeout: float,
        verify_bound_child: bool,
        readability_proof: str,
    ) -> None:
        self.provider = provider
        self.runtimes = runtimes
        self.sessions = sessions
        self.binder = binder
        self.failpoints = failpoints
        self.fork_timeout = fork_timeout
        self.verify_bound_child = verify_bound_child
        self.readability_proof = readability_proof

    def fork(self, request: ForkRequest) -> ForkResult:
        prefix = list(request.provider_turn_ids)
        source_id = request.source.provider_session_id
        if not prefix or not source_id:
            return ForkResult.not_started("fork needs a source thread and a provider turn prefix")
        if request.driver_kind != self.provider.kind:
            return ForkResult.not_started(
                f"driver kind {request.driver_kind!r} is not {self.provider.kind}"
            )
        live = self._fork_runtime(request)
        if live is not None:  # the warm path: no home held, no lock taken
            return self._fork_with(live, False, request, source_id, prefix)
        # The source home held across the transient's whole life (see `Runtimes.home`); a
        # Session runtime that started while this waited is the one forked on.
        with self.runtimes.home(request.source.home):
            live = self._fork_runtime(request)
            if live is not None:
                return self._fork_with(live, False, request, source_id, prefix)
            runtime = self._transient_source(request)
            if runtime is None:
                return ForkResult.not_started("source runtime could not be prepared")
            return self._fork_with(runtime, True, request, source_id, prefix)

    def _fork_with(
        self,
        runtime: Runtime,
        transient: bool,
        request: ForkRequest,
        source_id: str,
        prefix: list[str],
    ) -> ForkResult:
        litter: list[object] = []
        try:
            # The bind and the proof parse the whole rollout (a 10,000-Turn one is 60,000
            # lines): no collector walks over that parse while it is being built.
            with gc_paused():
                try:
                    return self._fork_on(runtime, request, source_id, prefix, litter)
                finally:
                    # The bind's decoded lines are freed once the verdict has been answered
                    # (handed over while the collector is still held off).
                    release_later(litter)
        finally:
            if transient:
                runtime.proc.close()

    def _fork_runtime(self, request: ForkRequest) -> Runtime | None:
        """The source Session's live app-server (or the one the request's attestation named),
        else None."""
        session = self.sessions.get(request.source.agent_session_id)
        # The home compared as a string first (the worker's generation check's way), a `Path`
        # parsed only for a request that spells it otherwise.
        if (
            session is not None
            and session.runtime is not None
            and (
                str(session.home) == request.source.home
                or session.home == Path(request.source.home)  # spelled otherwise: parsed
            )
            and (_attested(request, session.runtime.generation) or session.runtime.alive)
        ):
            return session.runtime
        return None

    def _transient_source(self, request: ForkRequest) -> Runtime | None:
        """A transient app-server on the source's home (its caller holds the home), or None.
        It first loads the source's ancestors: Codex lists a thread's inherited Turns only
        once it loaded them in that home, and a fork child that never ran was loaded by no
        app-server there (its readability is proven in the worker)."""
        home = Path(request.source.home)
        try:
            runtime = self.runtimes.spawn(home, request.source.cwd)
        except HostError:
            return None
        ancestors = self.provider.lineage(home, request.source.provider_session_id)[:-1]
        try:
            self.runtimes.project(runtime, ancestors)
        except AppServerFailure:
            runtime.proc.close()
            return None
        return runtime

    def _fork_on(
        self,
        runtime: Runtime,
        request: ForkRequest,
        source_id: str,
        prefix: list[str],
        litter: list[object],
    ) -> ForkResult:
        """The fork on `runtime`; what it decoded that is large (the bound rollouts' lines) is
        put in `litter`, for the caller to free after the verdict is answered."""
        # Exact driver identity: a runtime that changed since prepare must not be dispatched.
        if runtime.gate.version != request.driver_version:
            return ForkResult.not_started(
                f"driver version {runtime.gate.version!r} != frozen {request.driver_version!r}"
            )
        if not runtime.gate.fork_through_turn:
            return ForkResult.not_started(
                f"{self.provider.kind} {runtime.gate.version} cannot fork"
            )
        # The homes as the request's strings: the binder works on strings; one `Path` of the
        # target for the provider's hooks (each `Path` built parses the whole path).
        source_home, target_home = request.source.home, request.target.home
        target_path = Path(target_home)
        ahead = self._validate_ahead(source_home, source_id)
        # Before any mutation: the source must show the frozen ordered prefix, settled.
        try:
            source_turns = self._source_turns(runtime, request.source.agent_session_id, source_id)
        except AppServerFailure as exc:
            return ForkResult.not_started(f"source thread unreadable: {exc}")
        ids = list(map(itemgetter(0), source_turns[: len(prefix)]))
        if ids != prefix:
            return ForkResult.not_started("source thread does not show the frozen turn prefix")
        if source_turns[len(prefix) - 1][1] == "inProgress":
            return ForkResult.not_started("the boundary turn is still in progress")
        refused = self._source_refused(source_home, source_id)
        if refused is not None:
            return ForkResult.not_started(f"source rollout refused before thread/fork: {refused}")
        cut = self._source_cut(source_home, source_id, prefix[-1])
        if cut is not None:
            return ForkResult.not_started(cut)
        try:
            if self.failpoints.armed:
                self.failpoints.hit("worker.fork.before_provider_call")
        except FailpointError as exc:
            return ForkResult.not_started(str(exc))
        ahead_dir = self.provider.child_rollout_dir(target_path)
        dirs = None if ahead_dir is None else DirsAhead(ahead_dir)

        try:
            params: dict[str, Any] = {"threadId": source_id, "lastTurnId": prefix[-1]}
            if request.target.cwd:
                # A worktree fork: the child thread works in its own tree from its first Turn.
                params["cwd"] = request.target.cwd
            if self.provider.fork_exclude_turns:
                params["excludeTurns"] = True
            if self.provider.fork_unloaded:
                params["loaded"] = False
            if self.provider.turns_without_items:
                params["turnItems"] = False
            if self.provider.turn_columns:
                params["turnColumns"] = True
            deadline = time.monotonic() + self.fork_timeout
            pending = runtime.proc.request_async("thread/fork", params)
            if dirs is not None:
                # While the provider forks, this thread creates the child's target
                # directories and makes them durable (never raises: `ready()` judges it);
                # the binder then writes only the file.
                dirs.run()
            response = runtime.proc.answer(
                "thread/fork",
                pending,
                timeout=max(0.0, deadline - time.monotonic()),
                limit=self.fork_timeout,
            )
        except JsonRpcError as exc:
            if exc.code == INTERNAL_ERROR:
                # Not a refusal: Codex answers it when reading its child back fails after the
                # child was written, the Tutti Agent for any failure past its durable child.
                # `fork.resolve` looks for the child.
                return ForkResult.unknown(
                    f"thread/fork failed: {exc.rpc_message} (code {exc.code})"
                )
            return ForkResult.rejected(f"thread/fork rejected: {exc.rpc_message}")
        except AppServerClosed as exc:
            if not exc.sent:
                return ForkResult.not_started(f"thread/fork not sent: {exc}")
            return ForkResult.unknown(f"app-server lost after thread/fork was sent: {exc}")
        except AppServerTimeout as exc:
            # The provider may still be forking: its app-server is ended now, so whatever
            # child it wrote is on disk before the `unknown` is answered, and none comes
            # after (an abandon that found none would leave a later one no one's). A live
            # Session runtime is started again at its next use.
            runtime.proc.end(f"{exc}; the app-server was killed so that it forks no more")
            return ForkResult.unknown(str(exc))

        try:
            if self.failpoints.armed:
                self.failpoints.hit("worker.fork.after_provider_call")
        except FailpointError as exc:
            return ForkResult.unknown(str(exc))

        thread = thread_of(response)
        child_id = str(thread.get("id") or "")
        forked_from = str(thread.get("forkedFromId") or "")
        if not child_id or child_id == source_id:
            return ForkResult.unknown(f"unverifiable child id {child_id!r}")
        if forked_from != source_id:
            child = ForkChild(child_id, forked_from, ())
            return ForkResult.unknown(f"forkedFromId {forked_from!r} != source", child)
        column = thread.get("turnIds")
        answered = list(map(str, column)) if type(column) is list else turn_ids(thread.get("turns"))
        turns = _ChildTurns(self.runtimes, runtime, child_id, forked_from, prefix, answered)
        if answered:
            unlike = turns.refusal()
            if unlike is not None:
                return unlike

        # The binder runs before accepted; any failure now is unknown (law 1, seed §7).
        derived = _DeriveForProof(self.provider)
        try:
            if dirs is not None:
                dirs.ready()
            if ahead is not None:
                ahead.join()  # the source's lines validated: the bind takes those it copies
            receipt, names = self.binder.begin(
                source_home,
                target_home,
                child_id,
                planned=derived.start if self.verify_bound_child else None,
                # The homes' components `DirsAhead`'s walk found no link, or made, during the
                # provider's fork: not `lstat`ed a second time by the same fork.
                checked=None if dirs is None else dirs.checked(),
                # The child's Turns listed while the bind writes its bytes: nothing is named
                # in the target home before they are found to be the prefix.
                before_names=turns.verify,
            )
            turns.verify()  # a bind that wrote nothing did not call it
        except _ChildRefused as refused_child:
            return refused_child.result
        except (BinderError, FailpointError, OSError) as exc:
            unlike = turns.refusal()
            if unlike is not None:
                return unlike
            return ForkResult.unknown(f"provider-state binding failed: {exc}", turns.child)
        finally:
            derived.join()
        child = turns.child
        litter.extend(parsed.records for parsed in receipt.parsed.values())
        proof = "none"
        if self.verify_bound_child:
            # The proof reads the files back by name while their directories are fsynced.
            problem, proof = self._prove_readable(
                runtime,
                target_path,
                child_id,
                source_id,
                prefix,
                receipt.parsed,
                litter,
            )
            if problem is not None:
                return ForkResult.unknown(
                    f"bound child not readable from its home: {problem}", child
                )
        try:
            names.wait()  # nothing is accepted before the bound names are durable
        except BinderError as exc:
            return ForkResult.unknown(f"provider-state binding failed: {exc}", child)
        # A source server that loaded the child releases it, so a long-lived server does not
        # accumulate threads (and never writes to the child from the source home). Sent, not
        # awaited (one round trip less per fork): the outcome is already decided and
        # a failed unsubscribe changes nothing of it; the pipe keeps it ahead of later calls.
        # A child forked unloaded (`fork_unloaded`, answered `notLoaded`) has nothing to release.
        if _status_type(thread) != "notLoaded":
            self._release(runtime, child_id)
        wire = receipt.to_wire()
        wire["verifiedReadable"] = self.verify_bound_child
        wire["readabilityProof"] = proof
        wire["sourceCanonicalTurnId"] = request.source_turn_id
        return ForkResult(
            DeliveryDisposition.ACCEPTED,
            child=child,
            binding=ForkBinding(self.provider.binding_mode, wire),
        )

    def _validate_ahead(self, source_home: str, source_id: str) -> threading.Thread | None:
        """For a provider whose child copies the source's lines (`fork_copies_source`), the
        source's rollout validated into the binder's spans on a thread of its own while the
        source is read and forked (`RolloutBinder.start_ahead`: the one the fork's
        re-attestation started, if it is still running; the bind joins it): the bind then
        decodes only the child's own lines. None when there is nothing to do."""
        if not self.provider.fork_copies_source:
            return None
        return self.binder.start_ahead(source_home, source_id)

    def _source_refused(self, source_home: str, source_id: str) -> BinderError | None:
        """For a provider whose child references the source (not `fork_copies_source`: the
        bind then copies the source's rollout as the child's ancestor), the source's rollout
        read as the bind will read it, before the provider makes a child: a rollout the bind
        would refuse (torn, unreadable, gone, two) fails the fork now, where nothing was made,
        not after `thread/fork` as `unknown` with a child left for a resolve. A refusal is
        looked at once more a moment later: a live app-server may be writing its last line."""
        if self.provider.fork_copies_source:
            return None
        for again in (False, True):
            if again:
                time.sleep(SOURCE_RECHECK_S)
            try:
                self.binder.check_source(source_home, source_id)
                return None
            except BinderError as exc:
                refused = exc
        return refused

    def _source_cut(self, source_home: str, source_id: str, turn_id: str) -> str | None:
        """For a provider that checks it (`turn_end_missing`), whether the source's history
        in its home lacks the end of the fork's boundary Turn — its rollout cut back by hand
        to a valid prefix the bind takes, while a live server still shows the Turn from
        memory: the words of the refusal, else None. Looked at again over about a second
        (`TURN_END_RECHECKS_S`) before it is refused."""
        missing = getattr(self.provider, "turn_end_missing", None)
        if missing is None:
            return None
        home = Path(source_home)
        for wait in (0.0, *TURN_END_RECHECKS_S):
            if wait:
                time.sleep(wait)
            if not missing(home, source_id, turn_id, search=True):
                return None
        return (
            f"{HISTORY_MISSING}: source thread {source_id}'s history in {source_home} does not "
            f"hold the end of its boundary Turn {turn_id} (its rollout cut back?); refused "
            "before thread/fork"
        )

    def _source_turns(
        self, runtime: Runtime, agent_session_id: str, source_id: str
    ) -> list[tuple[str, str]]:
        """The source thread's turns as `(id, status)`, in order. Read with `thread/read`,
        except when the Session's live runtime already read them and nothing that could change
        them happened since (no turn call, no notification about the thread: its
        `history_generation` is unchanged, no turn is active): then the verified read is
        reused, one round trip and one history load in the app-server fewer per fork."""
        session = self.sessions.get(agent_session_id)
        if session is None or session.runtime is not runtime or session.thread_id != source_id:
            return self._read_statuses(runtime, source_id)
        with session.state_lock:
            verified = session.verified_turns
            generation = session.history_generation
            busy = bool(session.active) or session.awaiting_turn is not None
        if (
            verified is not None
            and not busy
            and verified.proc is runtime.proc
            and verified.generation == generation
        ):
            return list(verified.turns)
        turns = self._read_statuses(runtime, source_id)
        with session.state_lock:
            # Only if nothing happened during the read (its answer may predate a change).
            if session.history_generation == generation and not busy:
                session.verified_turns = VerifiedTurns(runtime.proc, generation, tuple(turns))
        return turns

    def _read_statuses(self, runtime: Runtime, thread_id: str) -> list[tuple[str, str]]:
        """The thread's turns as `(id, status)`: `thread/read` without their items where the
        provider can leave them out (`turns_without_items`), else listed page by page."""
        if not self.provider.turns_without_items:
            # A page at a time, as the history reads them: one `thread/read` with items is
            # one line, and a long history's passes the reader's bound (the server killed).
            return _statuses(self.runtimes.history_turns(runtime, thread_id))
        params: dict[str, Any] = {"threadId": thread_id, "includeTurns": True, "turnItems": False}
        if self.provider.turn_columns:
            params["turnColumns"] = True
        result = runtime.proc.request("thread/read", params, timeout=self.runtimes.request_timeout)
        thread = thread_of(result)
        columns = _column_statuses(thread)
        if columns:
            return columns
        turns = [t for t in thread.get("turns") or [] if isinstance(t, Mapping)]
        # A history without turns in the answer (paginated) is listed, as `thread_turns` does.
        return _statuses(turns or self.runtimes.list_turns(runtime, thread_id))

    def _release(self, runtime: Runtime, thread_id: str) -> None:
        """`thread/unsubscribe`, sent without waiting for its answer (a failure is ignored:
        at worst the server keeps the thread loaded until it exits)."""
        future = runtime.proc.request_async("thread/unsubscribe", {"threadId": thread_id})
        future.add_done_callback(lambda f: f.exception())  # observed, never raised

    def _prove_readable(
        self,
        runtime: Runtime,
        home: Path,
        child_id: str,
        source_id: str,
        prefix: list[str],
        known: Mapping[str, ParsedRollout] | None = None,
        litter: list[object] | None = None,
    ) -> tuple[str | None, str]:
        """(problem or None, how it was proven): the provider's own history reader in this
        worker (no process spawned) where it can judge the child, else a fresh app-server on
        the target home (`readability_proof = "app_server"` forces the latter)."""
        if self.readability_proof == READABILITY_IN_WORKER:
            try:
                return (
                    self._read_child_in_worker(
                        runtime, home, child_id, source_id, prefix, known, litter
                    ),
                    READABILITY_IN_WORKER,
                )
            except ReaderNotApplicable:
                pass
        for name, parsed in (known or {}).items():
            # What the fresh app-server will read is what the binder wrote (its `thread/read`
            # judges only the Turns: a file changed since would pass with the same ones).
            try:
                holds = file_holds(Path(name), parsed.data)
            except OSError as exc:
                return f"{name}: {exc}", READABILITY_APP_SERVER
            if not holds:
                return f"{name} no longer holds the bytes the binder wrote", READABILITY_APP_SERVER
        return self._verify_readable(home, child_id, prefix), READABILITY_APP_SERVER

    def _read_child_in_worker(
        self,
        runtime: Runtime,
        home: Path,
        child_id: str,
        source_id: str,
        prefix: list[str],
        known: Mapping[str, ParsedRollout] | None = None,
        litter: list[object] | None = None,
    ) -> str | None:
        """The child's readability from `home` alone, judged in this worker by the provider's
        own history reader (a problem, or None); `ReaderNotApplicable` where it cannot."""
        return self.provider.read_child(
            home, child_id, source_id, prefix, runtime.gate.version, known, litter=litter
        )

    def _verify_readable(self, home: Path, child_id: str, prefix: list[str]) -> str | None:
        """Prove the child reads from the target home alone (lineage included): a fresh
        app-server there lists exactly the frozen prefix, none of its Turns in progress (the
        judgement the in-worker readers make, `prefix_problem`)."""
        try:
            # The target home held (after the source's, when the source is a transient: a
            # fork's target is a new Session's home, never a source of a fork in flight).
            with self.runtimes.transient(home, None) as runtime:
                self.runtimes.load_lineage(runtime, home, child_id)
                turns = [
                    (str(t.get("id")), t.get("status") == "inProgress")
                    for t in self.runtimes.history_turns(runtime, child_id)
                ]
        except HostError as exc:
            return str(exc)
        except AppServerFailure as exc:
            return str(exc)
        return prefix_problem(turns, prefix)


class _ChildRefused(Exception):
    """The child's listed Turns are not the frozen prefix, or could not be listed: `result` is
    the fork's answer (raised out of the bind's `before_names`, so nothing is named)."""

    def __init__(self, result: ForkResult) -> None:
        super().__init__(result.error)
        self.result = result


class _ChildTurns:
    """The child's Turns, checked against the frozen prefix (seed 000 §7: exactly the prefix,
    in order, or the fork is `unknown`). Taken from the fork's answer where it holds them, else
    listed with `thread/turns/list`, whose first page is sent at once: the bind writes and
    syncs the child's bytes while the server lists (its names wait for `verify()`)."""

    def __init__(
        self,
        runtimes: Runtimes,
        runtime: Runtime,
        child_id: str,
        forked_from: str,
        prefix: list[str],
        answered: list[str],
    ) -> None:
        self._runtimes, self._runtime, self._prefix = runtimes, runtime, prefix
        self.child = ForkChild(child_id, forked_from, tuple(answered))
        self._first = None if answered else first_turns_page(runtime.proc, child_id)
        self._judged = False
        self._refused: ForkResult | None = None

    def refusal(self) -> ForkResult | None:
        """The fork's `unknown` answer when the child's Turns are not the prefix (waiting for
        the listing once), else None; `child` then holds its Turns."""
        if not self._judged:
            self._refused = self._judge()
            self._judged = True
        return self._refused

    def verify(self) -> None:
        """`refusal()` raised as `_ChildRefused`."""
        refused = self.refusal()
        if refused is not None:
            raise _ChildRefused(refused)

    def _judge(self) -> ForkResult | None:
        child = self.child
        turns = list(child.provider_turn_ids)
        if self._first is not None:
            try:
                listed = self._runtimes.list_turns(
                    self._runtime, child.provider_session_id, self._first
                )
            except AppServerFailure as exc:
                return ForkResult.unknown(f"child turns unreadable: {exc}", child)
            turns = [str(t.get("id")) for t in listed]
            self.child = child = ForkChild(
                child.provider_session_id, child.forked_from_id, tuple(turns)
            )
        if turns != self._prefix:
            return ForkResult.unknown(
                f"child turns {turns} are not exactly the frozen prefix {self._prefix}", child
            )
        return None


class _DeriveForProof:
    """The provider's `derive_for_proof` on the bind's parse, on a thread of its own while the
    bind writes the files (`RolloutBinder.begin`'s `planned`), for rollouts of
    `AHEAD_MIN_BYTES` or more (a small one is derived by the proof itself); `join()` before the
    proof (the bind's answer waits for it: nothing derives while the proof reads)."""

    def __init__(self, provider: AppServerProvider) -> None:
        self._provider = provider
        self._thread: threading.Thread | None = None

    def start(self, known: Mapping[str, ParsedRollout]) -> None:
        if sum(len(parsed.data) for parsed in known.values()) < binder_module.AHEAD_MIN_BYTES:
            return
        self._thread = threading.Thread(
            target=self._derive, args=(dict(known),), name="derive-for-proof", daemon=True
        )
        self._thread.start()

    def _derive(self, known: Mapping[str, ParsedRollout]) -> None:
        # Only a cache: whatever fails here, the proof derives and judges everything itself.
        with contextlib.suppress(Exception):
            self._provider.derive_for_proof(known)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _status_type(thread: Mapping[str, Any]) -> str:
    status = thread.get("status")
    return str(status.get("type") or "") if isinstance(status, Mapping) else ""


def _statuses(turns: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(str(t.get("id")), str(t.get("status") or "")) for t in turns]


def _column_statuses(thread: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """The turns' `(id, status)` from an answer's columns (`turnColumns`: `thread.turnIds`,
    `thread.turnStatuses`), strings as `_statuses` makes them; None when it has none. Columns
    of different lengths are a malformed answer (`AppServerFailure`: the source is unreadable)."""
    ids, statuses = thread.get("turnIds"), thread.get("turnStatuses")
    if type(ids) is not list or type(statuses) is not list:
        return None
    if len(ids) != len(statuses):
        raise AppServerFailure(f"thread/read: {len(ids)} turnIds but {len(statuses)} turnStatuses")
    return list(zip(map(str, ids), map(str, statuses), strict=True))


# ------------------------------------------------------------------ releasing a fork's litter
# Large objects a fork built, released after its answer has left: on a thread of
# their own, a slice at a time.
#
# A fork of a 10,000-Turn thread ends holding the binder's decoded rollout (60,000 line objects
# and their payloads, about a million containers). Dropping it where the fork returns frees them
# all in one uninterrupted C-level deallocation (tens of milliseconds) between the fork's verdict
# and its answer reaching the host. Handed here instead, they are freed shortly after, in slices
# between which the interpreter may switch threads, so a later request is never held up by more
# than a slice. The cyclic collector stays held off (`hold_collector`) from the hand-over until
# they are freed: a collection in between would walk every one of them (they were built while
# the fork held it off). Nothing here changes what is kept or answered: only when the memory is
# returned.

SETTLE_SECONDS = 0.05
"""How long a batch waits before it is freed: long enough for the answer it followed to be
encoded and sent by the link thread."""
SLICE = 256
"""Elements of a list freed per step (a decoded rollout line is some tens of objects)."""
INLINE_ELEMENTS = SLICE
"""A batch of fewer elements (each list's counted by its length, anything else as one) is
freed where it is handed over: a small fork's few dozen lines free in microseconds, less than
the hand-over to the release thread and its wake-ups cost."""

_queue: SimpleQueue[tuple[list[object], Callable[[], None], float]] = SimpleQueue()
_started = False
_start_lock = threading.Lock()


def release_later(objects: list[object]) -> None:
    """Take over `objects` (the caller keeps no reference to them): each is dropped after
    `SETTLE_SECONDS`, a list's elements `SLICE` at a time; the collector is held off until
    then. Call it while the objects' builder still holds the collector off. A batch under
    `INLINE_ELEMENTS` is dropped now, on the calling thread."""
    global _started
    if not objects:
        return
    if _elements(objects) < INLINE_ELEMENTS:
        objects.clear()
        return
    with _start_lock:
        if not _started:
            threading.Thread(target=_run, name="deferred-release", daemon=True).start()
            _started = True
    _queue.put((objects, hold_collector(), time.monotonic() + SETTLE_SECONDS))


def _elements(objects: list[object]) -> int:
    return sum(len(obj) if isinstance(obj, list) else 1 for obj in objects)


def _run() -> None:
    while True:
        batch, resume, due = _queue.get()
        try:
            # Each batch waits from its own hand-over, not from the previous batch's end:
            # batches handed over faster than one per `SETTLE_SECONDS` do not queue up (nor
            # keep the collector held off) behind each other's waits.
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            drain(batch)
        finally:
            del batch
            resume()


def drain(batch: list[object]) -> None:
    """Drop every object of `batch`, emptying lists slice by slice first."""
    while batch:
        obj = batch.pop()
        if isinstance(obj, list):
            while obj:
                del obj[-SLICE:]
        del obj
