"""The invariant checker of the reliability suite: reads a daemon's store file and the provider
homes under `$AGENTHOST_HOME/runtimes` and lists every broken law of ARCHITECTURE.md.

It never trusts what the daemon says: the store is copied with SQLite's backup API (so a live
or crashed daemon is never written to) and provider children are counted in the providers' own
files. `check_invariants(home)` returns a report; `assert_invariants(home)` fails on violations.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import apsw

from actors.checkpoints import checkpoint_ref, commit_ref, ref_segment
from actors.context import Timeouts, _path_segment
from domain.errors import ForkInProgress, ForkSnapshotCorrupt, HostError
from domain.procfs import environs_holding
from drivers.worker_spawn import SOCKET_DIR_MARKER, SOCKET_DIR_PREFIX, fallback_socket_dir
from storage.fork_child import OrdinalPrefixes, ordinal_id
from storage.fork_snapshot import decode_frozen, load_snapshot
from storage.history_links import (
    FEW_SPECIAL,
    digest_pass,
    history_digest,
    history_link,
    linked_message,
    visible_rows,
)
from storage.schema import migrate, user_version
from storage.store import Store
from transport.client import ClientClosed, ClientTimeout
from transport.server import MAX_EVENT_BYTES
from workspace.shadow import ShadowStore

ACTIVE = ("prepared", "dispatching", "provider_accepted")
# Statuses whose operation may have sent the provider fork (law 1: the marker is durable first).
DISPATCHED = ("dispatching", "provider_accepted", "committed", "unknown", "abandoned")
# Statuses that released their target reservation (`abandoned`: by fork.resolve).
RELEASED = ("failed", "abandoned")

HOME_DIRS: Mapping[str, str] = {
    "tutti-agent": "tutti-agent-home",
    "codex": "codex-home",
    "claude-code": "claude-config",
}
PROVIDER_OF_HOME: Mapping[str, str] = {v: k for k, v in HOME_DIRS.items()}


class Law(StrEnum):
    """The invariant each violation breaks (the names double as the summary table's rows)."""

    STORE_INTEGRITY = "store_integrity"
    """`PRAGMA integrity_check` is not `ok` or `foreign_key_check` reports rows."""
    STORE_SCHEMA = "store_schema"
    """The store lacks a table, a trigger or an index that its schema version has, or holds one
    changed or unknown to it (a table's SQL holds the CHECKs of v22's barrier, v23's stage,
    v24's `host_only`): the fence's witness counts by triggers, the rows a history link reads are
    frozen by triggers, the barrier is a unique index (law 2, law 3, law 8,
    docs/design/store.md). What the migrations make is the reference: a fresh store migrated to
    the same version."""
    CHILD_IFF_COMMITTED = "child_iff_committed"
    """A committed operation lacks its child/lineage, or a non-committed one has some, or the
    frozen snapshot its child is projected from no longer loads — bytes unlike its hash, or no
    readable version's shape (snapshot version 5: each Turn an array of `turn_fields`) (law 2,
    law 4)."""
    CHILD_HISTORY_COPIED = "child_history_copied"
    """A committed child's cloned Messages — the history it shows: its own rows and, for a
    linked child, the rows it reads through its history link — are not, row by row, its
    source's boundary as prepare froze it (snapshot version 4 or 5: each id rule v2's — the
    operation's prefix and the row's position, its Turn's prefix and sequence —, a payload
    holding a reference as frozen rewritten, every other column the source's) (law 2)."""
    HISTORY_LINK_INTACT = "history_link_intact"
    """A child's history link points at a Session that is gone, at other bounds than its
    operation froze, or at rows that are missing or changed: the history the child shows,
    read back into the source's ids, is not the count and digest prepare froze (law 2)."""
    FENCE_WITNESS = "fence_witness"
    """The fence's witness (schema v13 `history_fences`) is wrong: a witness row names no active
    operation of its Session (a released fence still counting, or one counting for another
    operation), an active operation prepared with the witness (its snapshot records the
    boundary's highest position) has none, or the witness counted no change of the source's
    history while its boundary's count and digest are no longer what prepare froze — the commit
    would link a changed boundary on the witness's word (law 2)."""
    HISTORY_DIGEST_KEPT = "history_digest_kept"
    """A boundary digest prepare kept (schema v17 `history_digests`) is not what a pass over the
    Session's rows gives now — its count, digest, highest position or the positions prepare
    must look at differ (a change of the history its triggers did not delete it for: the next
    prepare would freeze a boundary it never digested) — or it is kept for a Session that reads
    rows through a history link (never kept: the link's rows are another Session's)."""
    ONE_PROVIDER_CHILD = "one_provider_child"
    """A source has more provider children than operations that may have dispatched (law 1)."""
    RESERVATION = "reservation"
    """A failed operation still holds its target reservation, or a live one lost it."""
    FENCE = "fence"
    """A fenced write succeeds on a fenced source or fails on an unfenced one (law 3)."""
    SINGLE_ACTIVE = "single_active"
    """Two active operations on one source, or two barrier holders on one boundary."""
    BOUNDARY_BARRIER = "boundary_barrier"
    """Two operations hold the barrier of one boundary (source + Turn), whatever point kinds
    asked for them (law 8): a boundary was dispatched twice."""
    BARRIER_FLAG = "barrier_flag"
    """An operation's `barrier` flag (schema v22) is not the barrier rule over its status and
    ACK time (`domain.fork_states.holds_barrier`): the barrier's index, whose WHERE is the flag,
    would answer a prepare with a holder that released it or miss one that holds it (law 8)."""
    STAGE_COLUMN = "stage_column"
    """An operation's `stage` (schema v23) is not its status's (`domain.fork_states.stage_of`:
    2 active, 1 committed or `unknown`, 0 failed or abandoned): `fork_operations_by_source`,
    keyed on it, would let a fenced write past an active operation or fence a settled source
    (law 3), or miscount the source's forks (the child's title, the provider child's owners)."""
    DELETED_TREE_PATH = "deleted_tree_path"
    """A committed fork's tree recorded `removing`/`removed` (its child deleted with it) whose
    `deleted_tree_path` (schema v25) is not its plan's `path`, or any other operation with
    one: `session.create` finds a deleted child's tree only through that column's index
    (`deleted_tree_at`), so a Session could start in a tree the daemon removes or removed (the
    worktree law), or be refused where no tree was deleted."""
    SNAPSHOT_KEPT = "snapshot_kept"
    """An operation that is not `failed` or `abandoned` has no frozen snapshot (its commit, or
    its committed child's projection, would fail `ForkSnapshotCorrupt`), or a `failed` or
    `abandoned` one still keeps one (schema v27: nothing reads it again, and the store grew by
    a whole boundary's document with every fork that ended without a child)."""
    CHILD_OWNED = "child_owned"
    """A provider child in a provider home belongs to no operation that may own it, or its
    Turns are no such operation's frozen prefix (law 9)."""
    UNKNOWN_EVIDENCE = "unknown_evidence"
    """An `unknown` operation's source Session was deleted or its provider home is gone: the
    evidence a person must decide on is lost (law 9, seed 000 §10)."""
    CHILD_READABLE = "child_readable"
    """A committed child's provider state cannot be read from its own home alone."""
    PROVIDER_LOGS_BOUNDED = "provider_logs_bounded"
    """An app-server's stderr log in a provider home (`.app-server.log`, `.app-server.log.1`)
    is longer than its bound (`STDERR_LOG_BYTES` and the one closing line saying how much
    was dropped)."""
    QUARANTINE = "quarantine"
    """A quarantined provider file belongs to no `abandoned` operation nor an `unknown` one an
    abandon of it began, or was emptied, or a file a finished abandon moved aside is gone
    (abandon moves a child aside, never deletes or truncates it)."""
    SPARE_HOME_EMPTY = "spare_home_empty"
    """A Claude child's home made ahead (`runtimes/<ws>/.claude-spare-*`, drivers/claude/homes.py)
    holds anything but its empty directories: a spare is renamed into a child's place before the
    child's transcript moves in, so no provider state ever lands in one, and one left unused is
    removed by the worker's close or the daemon's start-up sweep (docs/design/drivers.md)."""
    COMPLETED_TURN_RECORDED = "completed_turn_recorded"
    """A settled `completed` Turn lacks its provider binding or its final assistant Message
    (a dropped driver event)."""
    CODEX_TURN_IN_ROLLOUT = "codex_turn_in_rollout"
    """A settled `completed` Turn of a live Codex Session has no end in the Session's logical
    history read from its own home (its thread's rollout and, for a fork child, the
    ancestors' it references): no `task_complete` or `turn_aborted` event names its provider
    turn id — the rollout cut back before it, say — so the store holds a Turn the provider's
    history lost (docs/design/drivers.md, "A bound history must still hold its last
    completed Turn")."""
    TUTTI_TURN_IN_ROLLOUT = "tutti_turn_in_rollout"
    """A settled `completed` Turn of a live Tutti Agent Session has no end in its thread's
    rollout in its own home (a fork child's is a whole copy): no `task_complete` or
    `turn_aborted` event names its provider turn id — the rollout cut back before it, say
    (docs/design/drivers.md, "A bound history must still hold its last completed Turn")."""
    CLAUDE_TURN_IN_TRANSCRIPT = "claude_turn_in_transcript"
    """A settled `completed` Turn of a live Claude Code Session is not in the Session's
    transcript (`projects/*/<provider session>.jsonl` in its own provider home): no Turn there
    is rooted at its provider turn id (the root user message the host bound it to), that
    Turn holds no assistant message (the provider's reply), or the Turn's binding names a
    checkpoint that is no message of that Turn (docs/design/drivers.md): the next resume, or
    a fork through it, would find a Turn the provider never kept."""
    HOST_ONLY_TURN = "host_only_turn"
    """A Turn marked host-only (schema v24: its `turn.start` provably never sent, so its
    provider's thread holds no Turn for it) has a provider turn id, is not settled, or is settled
    `completed` (only the provider completes a Turn); or a committed child's copy of a boundary
    Turn is host-only when its source Turn is not, or the other way round (the fork's provider
    prefix left out exactly the source's host-only Turns, so the child's are the same ones)."""
    PROVIDER_TURN_ONCE = "provider_turn_once"
    """Two Turns of one Session are bound to the same provider turn: a Turn's bind, or the
    re-bind from the provider's history (actors/rebind.py: only a provider turn no Turn holds
    is matched), claimed one twice — a fork's prefix would name one provider turn for two
    Turns, and `prove_absent` would prove nothing of that Session again."""
    TURN_CLAIM = "turn_claim"
    """A Session has two `active` Turns (the submit claim reads the active Turn inside its own
    write: a second would be a claim that raced past it), a deleted Session has an `active`
    Turn (the delete refuses one in its own write; start-up recovery settles any an older
    daemon left), or a submit claim is `active` while its Turn is settled or bound (the
    provider's bind and the settlement finish it in their own write): a claim left `active`
    refuses every fork of its Session (`source_submit_claim_active`) for good."""
    ACTIVE_TURN_WORKED = "active_turn_worked"
    """A Turn is `active` with nothing written for it past the grace period and no pending
    interaction: no live runtime works on it (checked on a live, quiescent daemon only)."""
    CHECKPOINT_KEPT = "checkpoint_kept"
    """A settled Turn of a live Session names a workspace checkpoint (`before`/`after` tree)
    that no ref in the home's shadow store keeps (its Session's ref of that tree, or the
    Turn's own ref of an older store), or its record is neither
    `unavailable` nor has an `after` (a fork through it would find nothing)."""
    WORKTREE = "worktree"
    """A `worktree` fork's tree breaks its laws (docs/design/workspace.md): a tree on disk
    that its operation does not record (a failed fork's kept, a removed one still there), a
    recorded tree missing or incomplete, a half-made (`.partial-`) tree of an operation no
    saga is making, a dispatch before the record, or two trees / two branches for one
    operation (law 10)."""
    FENCE_WINDOW = "fence_window"
    """A source's Turn ran inside a fence window of one of its operations (law 3): claimed
    after the operation's prepare (or the adopt that took the fence again) and before its end,
    or still active when that window opened (the times are each write's own transaction's); or
    a fenced control landed inside one: a goal control recorded in it (or active when it
    opened), an Interaction's answer recorded in it."""
    STEP_ORDER = "step_order"
    """An operation's durable steps are not each their own, in their order: a
    `provider_accepted` or `committed` one without its `dispatching` or `provider_accepted` time
    (a commit landed without the write before it: the crash matrix's cell between the two
    relies on `provider_accepted` being committed before the commit's transaction begins,
    docs/design/fork-saga.md), or the step times out of order (prepared ≤ dispatching ≤
    provider_accepted ≤ a commit's completion; each is its own transaction's time)."""
    FENCE_HAS_SAGA = "fence_has_saga"
    """An active operation (holding its source's fence) has not moved past the grace period:
    its saga is gone (checked on a live, quiescent daemon only)."""
    REPOSITORY_KEPT = "repository_kept"
    """The person's repository changed beyond what worktree forks add to it (their worktrees
    and `agenthost/` branches): HEAD, the commit it names, the index, another ref, the config
    or the stash differ from their state when the caller took it (`repository_state`; law 10,
    docs/design/workspace.md: a checkpoint only reads the working tree, a worktree fork adds a
    worktree and a branch and touches nothing else). Checked for the repositories the caller
    names."""
    PROCESS_OWNED = "process_owned"
    """A process of the home (its environment names the home: a worker, an app-server, a
    Claude CLI, a git of the shadow store by its HOME) runs outside the live daemon's tree, or
    after the daemon stopped: an orphan (docs/design/drivers.md "No orphans"; the workers
    started ahead included; a git a killed daemon left, which its next start kills:
    docs/design/workspace.md "no git outlives its daemon's next start"); or the daemon
    has two workers of one provider (a worker started ahead and one spawned by a request:
    `WorkerSupervisor` keeps one per provider). A process carrying the marker of a runtime
    that runs under the live daemon (a process carrying the same marker is a live worker's
    child, the worker the daemon's: `live_runtime_processes`) is that runtime's, wherever it
    was reparented — a tool's `setsid … &` — and its runtime's stop ends it
    (`stopped_runtime_left`); one with no marker, or a marker no running runtime holds, is
    not. `check_processes`, on a live or stopped daemon, by the soaks."""
    RUNTIME_PROCESSES_ENDED = "runtime_processes_ended"
    """A process whose environment's `HOME` is an app-server runtime's private home
    (`runtimes/.../<provider home>/.home`, `process.private_env`) lives while its runtime does
    not: processes of more runtimes of a provider live than the daemon holds live runtimes of
    it (`host.status` `runtimes.<provider>.live`: a runtime closed, evicted, deleted with its
    Session or lost with its killed worker, whose app-server or a child of it lives on), or a
    process of a runtime is not its app-server (a live child of a live worker of the daemon,
    leader of its own process group) nor in that app-server's tree or group (a launcher's
    native child left once the launcher was killed alone) nor carries the marker of a runtime
    running under the live daemon (`live_runtime_processes`: a tool's process that left the
    server's tree and group, `setsid … &`, which the runtime's stop ends).
    `check_runtime_processes`, on a live quiescent daemon, by the soaks."""
    FORK_EVENTS_HEARD = "fork_events_heard"
    """A subscriber connected all along did not hear a fork operation's last state, heard its
    states out of order (a later one, then an earlier one: an event published stale), or did
    not hear a committed fork's child announced (`session.upserted`): an event the fork saga
    held for its burst was never published (docs/design/fork-saga.md step 6;
    `check_fork_events`, over what a soak's subscriber heard)."""
    SESSION_EVENTS_HEARD = "session_events_heard"
    """A subscriber connected all along heard a Session's writes out of the order one writer
    made them (its titles `<writer>:<n>`, a lower n after a higher one: an event published
    stale, such as a carried row delivered after a newer state), or its last `session.upserted`
    is not the Session's state at the end (docs/design/store.md, "Change events that carry
    their row"; `check_session_events`, over what a soak's subscriber heard)."""
    TURN_EVENTS_HEARD = "turn_events_heard"
    """A subscriber connected all along heard a Turn's `message.delta` before the Turn's first
    `turn.updated` or after the one that settled it, or its assistant deltas do not make up
    the settled Turn's assistant text (a delta lost, repeated or reordered): a delta went past
    an event offered before it, or an event offered after it went past the delta
    (docs/design/internals.md, "A delta's way to the transport"; `check_turn_events`, over
    what a soak's subscriber heard); or a Turn's `turn.updated` went back to `active` after
    one that settled it, or its settling event does not show the Turn as it was committed
    (its outcome, error, times, provider turn, Messages and Interactions as the store holds
    them): an event published stale or built from a row that is not the committed one
    (docs/design/store.md, "Change events that carry their row")."""
    CHECKPOINT_CHANGES = "checkpoint_changes"
    """A settled Turn's workspace record lists `changedFiles` that are not the difference
    between its own `before` and `after` trees (git's `diff-tree` in the home's shadow
    store), e.g. another Turn's changes of the same folder (docs/design/workspace.md,
    "Laws")."""
    RESTORE_UNDO_KEPT = "restore_undo_kept"
    """A `workspace.restore`'s undo is not kept (docs/design/workspace.md, "Laws"): a
    `refs/agenthost/<session>/restore-<ns>/before` ref of a live Session, in the shadow store
    of a folder it works in, names a tree the store does not hold; or (`check_workspace_answers`,
    over what a soak's clients were answered) the `undo.tree` a restore of a Session still live
    answered is named by no such ref of that Session. The ref is written before the restore
    touches a file, so this holds after any kill."""
    WORKSPACE_ANSWER = "workspace_answer"
    """A `workspace.restore` or `session.workspaceDiff` answer's `changedFiles` is not git's
    `diff-tree` of the two trees it names (a restore's `undo.tree` → `restored`, a diff's
    `from` → `to`), or a restore's `restored` is not the tree it was asked for
    (`check_workspace_answers`, over what a soak's clients were answered)."""
    DESCRIPTOR_RESERVE = "descriptor_reserve"
    """The live daemon holds as many descriptors as its soft limit allows, or one of its top
    `acceptReserve` descriptor numbers holds a connection accepted on one of its ipc endpoints
    in `run/` (a worker link, `w-*`, excepted: the reserve is theirs) or on one of its TCP
    ports, on two looks in a row: a flood took the reserve the accept shim keeps for the
    store, the workers and the logs (docs/design/connections.md, *The descriptor reserve at
    accept*). `check_descriptor_reserve`, on a live daemon, by the contention soak."""
    STATUS_BOUNDS = "status_bounds"
    """A queue or count the live daemon's `host.status` reports is past the capacity it
    reports beside it: `log.queued` > `log.capacity` (the log queue, `agenthost/log_queue.py`),
    or for a provider's runtime slots `live` > `limit` or `starting` > `startLimit`
    (`actors/session_runtime.py`: at most `limit` live runtimes, `startLimit` starting): a
    queue grown past its bound, e.g. under clients that never read (docs/reliability.md,
    "Clients that never read, in the soak"). `check_status_bounds`, over each look, by the
    contention soak."""
    EVENTS_BOUNDED = "events_bounded"
    """An event a subscriber heard encodes past `MAX_EVENT_BYTES` (256 KiB): a Turn's
    Interactions or a Session's settings carried whole where they do not fit (they are carried
    `omitted` / `settingsOmitted`), or a streamed delta too long for one event published whole
    (it goes as several `message.delta` events of its item), so a subscriber that does not
    read holds more than its 1,000-event queue of capped events (docs/protocol.md, "Size
    cap"). `check_event_bounds`, over the largest event of each type a soak's reading
    subscriber heard."""

    INTERACTION_STATE = "interaction_state"
    """An Interaction's record is not one its Turn can leave: `pending` on a settled Turn (the
    settlement supersedes pending Interactions in its own transaction) or with an answer or an
    end time; `resolved` without its answer or end time, or ended before it was opened;
    `superseded` with an answer, without an end time, or on a Turn still active
    (docs/design/internals.md, "Interactions and interrupts: their laws")."""
    INTERACTION_ANSWERED = "interaction_answered"
    """Over what the soak's clients were answered (`check_interaction_answers`): an
    Interaction answered 200 twice, or one whose recorded answer (its `output`, `by` aside)
    is not the answer its 200 carried or not the one the provider took (what its reply says;
    one the provider took is recorded `resolved` however its request was answered), or a
    `resolved` one whose output is no answer that was sent and not refused
    (docs/design/internals.md, "Interactions and interrupts: their laws")."""
    INTERRUPT_ANSWERED = "interrupt_answered"
    """Over what the soak's clients were answered (`check_interrupts`): a Turn whose
    `turn.interrupt` answered 200 still active once the clients are quiet, or settled with
    another outcome than that answer showed as settled (a settlement is final: an interrupt of
    a settled Turn answers it unchanged) (docs/design/internals.md, "Interactions and
    interrupts")."""
    DELETED_HOME_GONE = "deleted_home_gone"
    """On a live daemon (`live_grace_s`): a Session deleted longer ago than its delete's bound
    still has its runtime folder `runtimes/<workspace>/<session>/`, or a process working in it
    (its environment names a path there: a provider's CLI or app-server, what it started)
    (`_check_deleted_homes`).
    The delete removes it once the Session's runtime has stopped, or its stop's bound has
    passed and what still ran in it was killed (`DELETE_STOP_S`, `DELETE_END_S`), or, beside
    a runtime start of a Turn interrupted before its provider got it, once that start has
    answered (`DELETE_START_S`), or, while the daemon lists its removal as waiting for a worker
    call in flight once its runtime stopped (`homeRemovals`, `waiting_homes`), once that call
    has ended (`DELETE_CALLS_S`); a daemon killed in between finishes it in its start-up
    sweep. A folder left, or made again by a preparation that started for a Session that is
    gone, breaks it (docs/design/fork-saga.md, "Delete")."""
    STOPPED_RUNTIME_LEFT = "stopped_runtime_left"
    """On a live daemon (`live_grace_s`): a process working under its `runtimes/` (its
    environment names a path there) carries a runtime's marker (`AGENTHOST_RUNTIME`) whose
    runtime is no longer running — no process carrying that marker is a child of a live worker
    (the provider process the worker started with it) — and stays so past the stop's bound
    (`END_LEFT_WAIT_S`) (`_check_stopped_runtimes`). A stop (session.stop, an eviction, an idle
    stop, a worker's shutdown) ends what its runtime left before it is answered; a killed
    worker's supervisor ends what carries its incarnation's marker before a successor starts;
    a daemon's start ends what a previous run's runtimes left (docs/design/drivers.md, "What
    a stop ends"). A Claude Session's runtime lives from its first start to its stop, but is
    seen running only while a CLI of it is: a tool's process left between its Turns with no
    CLI parked is reported too (the soaks' Codex Turns leave some; none of their Claude Turns
    does)."""
    PROVIDER_FAULT_SETTLES = "provider_fault_settles"
    """Over what a soak saw of a provider that misbehaved on its stdout (`check_provider_faults`,
    `tests/reliability/provider_chaos.py`): its Turn still `active` past the fault's bound or
    once the clients are quiet; `failed` with no typed reason of the protocol's
    (docs/protocol.md, "Turn errors"); a fault that breaks the pipe (an endless line, a stdout
    closed) leaving its Turn `completed` or its runtime running once the Turn settled, or the
    Session's next Turn on the same runtime, not `completed` or refused; a fault the reader skips
    (garbage, a notification whose params are no object) failing its Turn; or the worker's
    peak RSS grown past `FAULT_RSS_BOUND_KIB` over the round (docs/reliability.md, "A
    misbehaving provider in the soaks")."""

    # The reads' laws: what a page or a lineage answer promises a GUI, read while
    # other clients write (`check_read_answers`, over what the soaks' readers were answered).
    LIST_PAGES = "list_pages"
    """Paging `session.list` to its end (`nextCursor` until null) showed a Session twice,
    missed one live for the whole paging (live in the store before the first page and after
    the last), showed one deleted before the paging began, ended a page with `nextCursor` set
    and no Session, or gave a page more than its `limit` (docs/protocol.md, "session.list")."""
    TIMELINE_PAGES = "timeline_pages"
    """Paging `session.timeline` (`afterSequence` = the last page's `nextSequence`) showed a
    Turn twice or out of sequence order, left out a Turn settled before the paging began (a
    gap among settled Turns), showed a Turn at another sequence than the store's, or gave a
    page more than `limit` Turns or none with `nextSequence` set (a page may end before `limit`
    at its byte bound: docs/protocol.md)."""
    LINEAGE_ANSWER = "lineage_answer"
    """A `session.lineage` answer disagrees with the store: its ancestors are not the
    Session's `forkedFrom` chain, a descendant is no committed fork of the node it is listed
    under (or its `lineage` names another source), a node's children are not in operation
    order with rising ordinals (or an ordinal is not the store's while no fork of that source
    committed meanwhile), a committed fork of the tree before the read is missing from an
    answer with `truncated` null, or one shown live (`session` set, `deleted` false) was
    deleted before the read, or one shown deleted is live after it; or a Session's forks
    paged by `afterOrdinal` went back, missed one committed before the paging, or showed one
    twice while none committed meanwhile (docs/protocol.md, "session.lineage")."""
    SOCKET_DIR_BOUNDED = "socket_dir_bounded"
    """A home's daemon keeps more than one directory for its workers' sockets outside its home
    (`<tmp>/ahw-*`, made when the home's path is too long for an ipc path: named for its run
    dir, so a SIGKILLed daemon's next start takes the same one again), or any after a clean
    stop, which removes it (docs/design/drivers.md, "The workers' socket directory"). Part of
    every `check_invariants`; `check_socket_dirs(home, stopped_cleanly=True)` after a clean
    stop."""


STORE_LAWS = frozenset(
    {
        Law.STORE_INTEGRITY,
        Law.STORE_SCHEMA,
        Law.CHILD_IFF_COMMITTED,
        Law.CHILD_HISTORY_COPIED,
        Law.HISTORY_LINK_INTACT,
        Law.FENCE_WITNESS,
        Law.HISTORY_DIGEST_KEPT,
        Law.RESERVATION,
        Law.FENCE,
        Law.FENCE_WINDOW,
        Law.SINGLE_ACTIVE,
        Law.BOUNDARY_BARRIER,
        Law.BARRIER_FLAG,
        Law.STAGE_COLUMN,
        Law.DELETED_TREE_PATH,
        Law.SNAPSHOT_KEPT,
        Law.HOST_ONLY_TURN,
        Law.TURN_CLAIM,
        Law.PROVIDER_TURN_ONCE,
        Law.UNKNOWN_EVIDENCE,
        Law.WORKTREE,
    }
)
"""The laws the store alone decides: what a test over a store without real provider homes
checks (the provider-file laws — one child, readable, owned, quarantine — are the soaks')."""


@dataclass(frozen=True, slots=True)
class Violation:
    law: Law
    detail: str

    def __str__(self) -> str:
        return f"[{self.law}] {self.detail}"


@dataclass(frozen=True, slots=True)
class ProviderChild:
    """A fork child found in a provider's own files (a rollout with `forked_from_id`, or a
    Claude transcript whose entries carry `forkedFrom`)."""

    provider: str
    child_id: str
    source_provider_session_id: str
    path: Path


@dataclass(frozen=True, slots=True)
class InvariantReport:
    violations: tuple[Violation, ...]
    operations: Mapping[str, int]
    """Fork operations by internal status."""
    sessions: int
    provider_children: int
    """Distinct provider child sessions counted in the provider homes."""
    readable_children: int
    """Committed, live children whose provider state was read from their own home."""
    readable_by_provider: Mapping[str, int] = field(default_factory=dict)
    """`readable_children` by the child's provider (a soak proves its Claude children read)."""
    spare_homes: int = 0
    """Claude spare homes the `spare_home_empty` law walked (a soak proves it met some)."""
    claude_turns_read: int = 0
    """Completed Claude Code Turns `claude_turn_in_transcript` read in their transcripts (a
    soak proves it met some)."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        ops = ", ".join(f"{k}={v}" for k, v in sorted(self.operations.items())) or "none"
        return (
            f"sessions={self.sessions} operations[{ops}] provider_children="
            f"{self.provider_children} readable_children={self.readable_children} "
            f"violations={len(self.violations)}"
        )


@dataclass
class _Ctx:
    home: Path
    violations: list[Violation] = field(default_factory=list)

    def fail(self, law: Law, detail: str) -> None:
        self.violations.append(Violation(law, detail))


# -- provider homes -------------------------------------------------------------------------


def provider_home(home: Path, ws: str, sid: str, provider: str) -> Path:
    """Where the daemon keeps one Session's provider state (actors/context.py's layout)."""
    return home / "runtimes" / _path_segment(ws) / sid / HOME_DIRS[provider]


def _first_json_line(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as f:
            line = f.readline()
    except OSError:
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None  # torn first line: the rollout was never created as far as anyone knows
    return value if isinstance(value, dict) else None


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """Complete JSON lines of a JSONL file; a torn last line is skipped (writers may die)."""
    try:
        data = path.read_bytes()
    except OSError:
        return
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def _glob(base: Path, pattern: str) -> list[Path]:
    """`base.glob(pattern)`, sorted, over a tree that may lose directories while it is walked
    (a deleted Session's runtime emptied from `runtimes/.trash` by the daemon): a walk that
    met a vanishing directory is walked again."""
    for _ in range(5):
        try:
            return sorted(base.glob(pattern))
        except FileNotFoundError:
            continue
    return sorted(base.glob(pattern))


def _rollout_children(provider: str, home_dir: Path) -> Iterator[ProviderChild]:
    for path in _glob(home_dir, "sessions/**/rollout-*.jsonl"):
        meta = _first_json_line(path)
        payload = (meta or {}).get("payload") or {}
        if not isinstance(payload, dict):
            continue
        source = payload.get("forked_from_id")
        child = payload.get("id")
        if isinstance(source, str) and source and isinstance(child, str):
            yield ProviderChild(provider, child, source, path)


def _claude_children(home_dir: Path) -> Iterator[ProviderChild]:
    for path in _glob(home_dir, "projects/*/*.jsonl"):
        try:
            if b'"forkedFrom"' not in path.read_bytes():
                continue
        except OSError:
            continue
        for entry in _json_lines(path):
            forked = entry.get("forkedFrom")
            if isinstance(forked, dict) and isinstance(forked.get("sessionId"), str):
                yield ProviderChild("claude-code", path.stem, forked["sessionId"], path)
                break


def provider_children(home: Path) -> list[ProviderChild]:
    """Every provider fork child in every provider home under `home/runtimes` (a child copied
    into its own home by the binder is listed once per copy; callers count distinct ids)."""
    out: list[ProviderChild] = []
    runtimes = home / "runtimes"
    for home_dir in _glob(runtimes, "*/*/*"):
        provider = PROVIDER_OF_HOME.get(home_dir.name)
        if provider is None or not home_dir.is_dir():
            continue
        if provider == "claude-code":
            out.extend(_claude_children(home_dir))
        else:
            out.extend(_rollout_children(provider, home_dir))
    return out


# -- readability of a committed child from its own home -------------------------------------


def _tutti_readable(
    home_dir: Path, child_id: str, prefix: Sequence[str], source_id: str | None = None
) -> str | None:
    """Why the Tutti Agent child is not what its fork committed, read from its own home by
    tutti_agent's own store, or None: its history loads, names `source_id` (the fork's source
    thread) as the thread it was forked from, and its Turns start with the frozen prefix,
    each of those ended (none still in progress: the app-server would show the boundary Turn
    running and close it as interrupted at the child's next Turn)."""
    from tutti_agent.history import TurnStatus, build_turns
    from tutti_agent.store import ThreadStore

    try:
        history = ThreadStore(home_dir).load(child_id)
        turns = build_turns(history.items, with_items=False)
    except Exception as exc:  # noqa: BLE001 - any failure to read is the finding
        return f"{type(exc).__name__}: {exc}"
    if source_id is not None and history.forked_from_id != source_id:
        return f"names source {history.forked_from_id!r}, not the fork's source {source_id!r}"
    turn_ids: list[str] = []
    for line in history.lines:
        payload = line.item.payload
        if line.item.type == "event_msg" and payload.get("type") == "task_started":
            turn_ids.append(str(payload.get("turn_id")))
    if list(prefix) != turn_ids[: len(prefix)]:
        return f"turns {turn_ids} do not start with the frozen prefix {list(prefix)}"
    running = [t.id for t in turns[: len(prefix)] if t.status is TurnStatus.IN_PROGRESS]
    if running:
        return f"the frozen prefix's turns {running} are still in progress"
    return None


def _codex_history(home_dir: Path, thread: str, seen: set[str]) -> list[dict[str, Any]] | str:
    """The records of `thread`'s logical history read from `home_dir` alone: its one rollout
    (its complete JSON lines, the first the session_meta of `thread`) and, for a Referenced
    child (`forked_from_ordinal_exclusive`), its parent's history up to that ordinal first;
    else why it cannot be read."""
    if thread in seen or len(seen) >= 64:
        return f"lineage loops at {thread}"
    seen.add(thread)
    matches = sorted(home_dir.glob(f"sessions/**/rollout-*-{thread}.jsonl"))
    if len(matches) != 1:
        return f"{len(matches)} rollouts for thread {thread} in {home_dir}"
    # Its complete JSON lines: a line torn by a crash while the child's own Codex appended
    # (which Codex reads past) is no finding; a missing record of the history is one below.
    records = list(_json_lines(matches[0]))
    payload = (records[0].get("payload") if records else None) or {}
    if not isinstance(payload, dict) or payload.get("id") != thread:
        return f"rollout {matches[0].name} does not start with session_meta of {thread}"
    end = payload.get("forked_from_ordinal_exclusive")
    if end is None:
        return records
    parent = _codex_history(home_dir, str(payload.get("forked_from_id") or ""), seen)
    if isinstance(parent, str):
        return parent
    head = [r for r in parent if isinstance(r.get("ordinal"), int) and r["ordinal"] < end]
    if len(head) != end:
        return f"{thread} reads {end} records of its parent, which holds {len(head)} of them"
    return head + records


def _codex_readable(home_dir: Path, child_id: str, prefix: Sequence[str]) -> str | None:
    """The child rollout and every rollout it references (Codex children are Referenced) are
    in the child's own home, and its logical history's Turns (`task_started` events) start
    with the Turns the fork recorded for it (`prefix`)."""
    history = _codex_history(home_dir, child_id, set())
    if isinstance(history, str):
        return history
    turn_ids = [
        str(r["payload"].get("turn_id"))
        for r in history
        if r.get("type") == "event_msg"
        and isinstance(r.get("payload"), dict)
        and r["payload"].get("type") == "task_started"
    ]
    if turn_ids[: len(prefix)] != list(prefix):
        return f"turns {turn_ids} do not start with the recorded prefix {list(prefix)}"
    return None


def _claude_readable(home_dir: Path, child_id: str, prefix: Sequence[str]) -> str | None:
    """The child's one transcript in its own home names its session and holds the Turns the
    fork recorded for it (`prefix`: their root user messages), first and in order."""
    from drivers.claude_transcript import parse_entry_bytes, split_turns

    matches = sorted(home_dir.glob(f"projects/*/{child_id}.jsonl"))
    if len(matches) != 1:
        return f"{len(matches)} transcripts for {child_id} in {home_dir}"
    entries = list(_json_lines(matches[0]))
    if not any(e.get("sessionId") == child_id for e in entries):
        return f"transcript {matches[0]} holds no entry of session {child_id}"
    try:
        roots = [t.root_uuid for t in split_turns(parse_entry_bytes(matches[0].read_bytes()))]
    except OSError as exc:
        return f"transcript {matches[0]} unreadable: {exc}"
    if roots[: len(prefix)] != list(prefix):
        return f"turns {roots} do not start with the recorded prefix {list(prefix)}"
    return None


PROVIDER_LOG_SLACK = 200
"""The closing line an app-server's stderr log may hold past its bound."""


def provider_log_problems(home: Path) -> list[str]:
    """Every app-server stderr log under `home/runtimes` longer than its bound."""
    from drivers.app_server.process import STDERR_LOG_BYTES

    out = []
    for name in (".app-server.log", ".app-server.log.1"):
        for path in _glob(home / "runtimes", f"*/*/*/{name}"):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size > STDERR_LOG_BYTES + PROVIDER_LOG_SLACK:
                out.append(f"{path}: {size} bytes, past the bound {STDERR_LOG_BYTES}")
    return out


def _check_provider_logs(ctx: _Ctx, home: Path) -> None:
    for problem in provider_log_problems(home):
        ctx.fail(Law.PROVIDER_LOGS_BOUNDED, problem)


def child_readable_problem(
    home: Path,
    ws: str,
    sid: str,
    provider: str,
    provider_session_id: str,
    prefix: Sequence[str],
    source_provider_session_id: str | None = None,
) -> str | None:
    """Why the child's provider state cannot be read from its own home, or None
    (`source_provider_session_id`: the thread the child must name as its source; Tutti
    Agent's children are judged by it)."""
    home_dir = provider_home(home, ws, sid, provider)
    if provider == "tutti-agent":
        return _tutti_readable(home_dir, provider_session_id, prefix, source_provider_session_id)
    if provider == "codex":
        return _codex_readable(home_dir, provider_session_id, prefix)
    if provider == "claude-code":
        return _claude_readable(home_dir, provider_session_id, prefix)
    return f"unknown provider {provider!r}"


# -- the store ------------------------------------------------------------------------------


def snapshot_store(store_path: Path, dest: Path) -> None:
    """Copy a (possibly live, possibly crashed) store into `dest` with the backup API: the
    copy is one consistent read transaction and the original is opened read-only."""
    src = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        src.set_busy_timeout(10_000)
        dst = apsw.Connection(str(dest))
        try:
            with dst.backup("main", src, "main") as backup:
                while not backup.done:
                    backup.step(-1)
        finally:
            dst.close()
    finally:
        src.close()


def _rows(conn: apsw.Connection, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cur = conn.execute(sql, params)
    try:
        names = [d[0] for d in cur.getdescription()]
    except apsw.ExecutionCompleteError:
        return []
    return [dict(zip(names, row, strict=True)) for row in cur]


def _check_integrity(ctx: _Ctx, conn: apsw.Connection) -> None:
    result = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    if result != ["ok"]:
        ctx.fail(Law.STORE_INTEGRITY, f"integrity_check: {result[:5]}")
    fk = list(conn.execute("PRAGMA foreign_key_check"))
    if fk:
        ctx.fail(Law.STORE_INTEGRITY, f"foreign_key_check: {fk[:5]}")


_SCHEMA_OBJECTS = (
    "SELECT type, name, sql FROM sqlite_master WHERE type IN ('trigger', 'index')"
    " AND name NOT LIKE 'sqlite_autoindex_%'"
)
_schemas: dict[int, dict[tuple[str, str], str]] = {}


def _schema_objects(conn: apsw.Connection) -> dict[tuple[str, str], str]:
    return {
        (str(t), str(n)): " ".join(str(sql).split()) for t, n, sql in conn.execute(_SCHEMA_OBJECTS)
    }


def _check_schema(ctx: _Ctx, conn: apsw.Connection) -> None:
    version = user_version(conn)
    if version not in _schemas:
        fresh = apsw.Connection(":memory:")
        try:
            migrate(fresh, version)
            _schemas[version] = _schema_objects(fresh)
        finally:
            fresh.close()
    expected, found = _schemas[version], _schema_objects(conn)
    for key in sorted(expected.keys() | found.keys()):
        if key not in found:
            ctx.fail(
                Law.STORE_SCHEMA, f"schema v{version} has {key[0]} {key[1]}; the store lacks it"
            )
        elif key not in expected:
            ctx.fail(Law.STORE_SCHEMA, f"{key[0]} {key[1]} is no part of schema v{version}")
        elif found[key] != expected[key]:
            ctx.fail(Law.STORE_SCHEMA, f"{key[0]} {key[1]} differs from schema v{version}'s")


_TABLE_SQL = "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
_table_schemas: dict[int, dict[str, str]] = {}


def _tables(conn: apsw.Connection) -> dict[str, str]:
    return {str(n): " ".join(str(sql).split()) for n, sql in conn.execute(_TABLE_SQL)}


def _check_tables(ctx: _Ctx, conn: apsw.Connection) -> None:
    """`store_schema` over the tables: each as a fresh store migrated to the same version makes
    it (same SQL). The CHECKs that hold a column to its law (v4's statuses, v14–v16, v22's
    barrier, v23's stage, v24's `host_only`) are in a table's SQL and nowhere else, and the
    migrations add them by editing that text (`storage.schema._edit_tables`: an edit that
    matches nothing changes nothing and says nothing)."""
    version = user_version(conn)
    if version not in _table_schemas:
        fresh = apsw.Connection(":memory:")
        try:
            migrate(fresh, version)
            _table_schemas[version] = _tables(fresh)
        finally:
            fresh.close()
    expected, found = _table_schemas[version], _tables(conn)
    for name in sorted(expected.keys() | found.keys()):
        if name not in found:
            ctx.fail(Law.STORE_SCHEMA, f"schema v{version} has table {name}; the store lacks it")
        elif name not in expected:
            ctx.fail(Law.STORE_SCHEMA, f"table {name} is no part of schema v{version}")
        elif found[name] != expected[name]:
            ctx.fail(Law.STORE_SCHEMA, f"table {name} differs from schema v{version}'s")


def _check_children(
    ctx: _Ctx, conn: apsw.Connection, ops: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Law 2 from both sides; returns the committed operations whose child is alive."""
    sessions = {
        (r["workspace_id"], r["session_id"]): r for r in _rows(conn, "SELECT * FROM sessions")
    }
    lineage = {
        (r["workspace_id"], r["target_session_id"]): r
        for r in _rows(conn, "SELECT * FROM fork_lineage")
    }
    ops_by_id = {(o["workspace_id"], o["operation_id"]): o for o in ops}
    clone_turns = Counter(
        (r["workspace_id"], r["session_id"])
        for r in _rows(
            conn,
            "SELECT workspace_id, session_id FROM turns WHERE sequence_provenance = 'fork_clone'",
        )
    )
    alive: list[dict[str, Any]] = []
    for op in ops:
        key = (op["workspace_id"], op["target_session_id"])
        name = f"operation {op['operation_id']} ({op['status']})"
        row = lineage.get(key)
        mine = row is not None and row["operation_id"] == op["operation_id"]
        if op["status"] == "committed":
            session = sessions.get(key)
            if session is None or not mine:
                ctx.fail(Law.CHILD_IFF_COMMITTED, f"{name}: child {key[1]} or its lineage missing")
                continue
            assert row is not None
            if (row["source_session_id"], row["source_turn_id"], row["target_turn_id"]) != (
                op["source_session_id"],
                op["source_turn_id"],
                op["target_turn_id"],
            ):
                ctx.fail(Law.CHILD_IFF_COMMITTED, f"{name}: lineage row {row} disagrees")
            document = decode_frozen(op["snapshot_json"])
            try:  # what the committed projection rebuilds the child from (law 4)
                load_snapshot(op["snapshot_json"], op["snapshot_hash"])
            except ForkSnapshotCorrupt as exc:
                ctx.fail(
                    Law.CHILD_IFF_COMMITTED, f"{name}: its frozen snapshot does not load: {exc}"
                )
            n_snapshot = len(document.get("turns") or [])
            if clone_turns.get(key, 0) != n_snapshot:
                ctx.fail(
                    Law.CHILD_IFF_COMMITTED,
                    f"{name}: child has {clone_turns.get(key, 0)} cloned turns, snapshot "
                    f"{n_snapshot}",
                )
            if session["provider_session_id"] != op["target_provider_session_id"]:
                ctx.fail(
                    Law.CHILD_IFF_COMMITTED,
                    f"{name}: child provider session {session['provider_session_id']} is not "
                    f"the accepted {op['target_provider_session_id']}",
                )
            problem = history_copy_problem(conn, op["workspace_id"], op, document)
            if problem is not None:
                ctx.fail(Law.CHILD_HISTORY_COPIED, f"{name}: {problem}")
            problem = history_link_problem(conn, op["workspace_id"], op, document)
            if problem is not None:
                ctx.fail(Law.HISTORY_LINK_INTACT, f"{name}: {problem}")
            if not session["deleted"]:
                alive.append(op)
        elif mine:
            ctx.fail(Law.CHILD_IFF_COMMITTED, f"{name}: has a lineage row but is not committed")
    for key, row in lineage.items():
        op = ops_by_id.get((key[0], row["operation_id"]))
        if op is None or op["status"] != "committed" or op["target_session_id"] != key[1]:
            ctx.fail(Law.CHILD_IFF_COMMITTED, f"lineage of {key[1]} without a committed operation")
    for key, n in clone_turns.items():
        if key not in lineage:
            ctx.fail(Law.CHILD_IFF_COMMITTED, f"session {key[1]} has {n} cloned turns, no lineage")
    return alive


def frozen_message_count(document: Mapping[str, Any]) -> int:
    """How many Messages a snapshot document froze: versions 4 and 5 count them in `history`, older
    versions hold them in their Turns."""
    history = document.get("history")
    if history is not None:
        return int(history["count"])
    return sum(len(t["messages"]) for t in document.get("turns") or [])


def history_copy_problem(
    conn: apsw.Connection, ws: str, op: Mapping[str, Any], document: Mapping[str, Any]
) -> str | None:
    """Law 2 for a version 4 child, row by row: the child's cloned Messages are the source's
    boundary with rule v2 ids, the payloads prepare rewrote as frozen, every other column
    copied. None when it holds, or when it cannot be decided: an older snapshot (its Messages
    are in it, counted elsewhere), or a source whose boundary is no longer what prepare froze
    (cleared or deleted after the commit released the fence)."""
    history = document.get("history")
    if history is None:
        return None
    source, target = op["source_session_id"], op["target_session_id"]
    through = int(history["through"])
    if history_digest(conn, ws, source, through) != (history["count"], history["digest"]):
        return None
    prefixes = OrdinalPrefixes.of(op["operation_id"], ws, source, target)
    rewritten = {int(p): text for p, text in history["rewritten"]}
    # What each Session shows (its own rows and, linked, the rows it reads through its link).
    src = visible_rows(conn, ws, source, through)
    clones = {
        int(r[0])
        for r in conn.execute(
            "SELECT sequence FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND sequence_provenance = 'fork_clone'",
            (ws, target),
        )
    }
    child = [r for r in visible_rows(conn, ws, target, through) if r[7] in clones]
    if len(child) != len(src):
        return f"child has {len(child)} cloned Messages, the source's boundary {len(src)}"
    for s_row, c_row in zip(src, child, strict=True):
        _, _, kind, text, payload, version, position, sequence = s_row
        expected = (
            ordinal_id(prefixes.message, position),
            ordinal_id(prefixes.turn, sequence),
            kind,
            text,
            rewritten.get(position, payload),
            version,
            position,
            sequence,
        )
        if tuple(c_row) != expected:
            return f"cloned Message at position {position} is {tuple(c_row)}, not {expected}"
    return None


def history_link_problem(
    conn: apsw.Connection, ws: str, op: Mapping[str, Any], document: Mapping[str, Any]
) -> str | None:
    """The history link of a version 4 child, whatever its source became since: it names the
    source and the boundary the operation froze, and the history the child shows through it,
    read back into the source's ids (each Message's id and Turn id are the source's for life),
    has the count and digest prepare froze. None when it holds, for a child with no link (its
    rows are its own), or when it cannot be decided: the child holds rows of its own for
    linked positions other than the rewritten payloads (it, or its source, changed one since),
    or a rewritten payload's source row has changed since (the frozen original is then
    nowhere)."""
    history = document.get("history")
    source, target = op["source_session_id"], op["target_session_id"]
    link = None if history is None else history_link(conn, ws, target)
    if link is None or history is None:
        return None
    through = int(history["through"])
    first = link.levels[0]
    if (first.workspace_id, first.session_id) != (ws, source):
        return f"links to {first.session_id}, not its source {source}"
    if first.through_sequence != through:
        return f"links through Turn {first.through_sequence}, the operation froze {through}"
    rewritten = {int(p) for p, _ in history["rewritten"]}
    own = {
        int(r[0])
        for r in conn.execute(
            "SELECT position FROM messages WHERE workspace_id = ? AND session_id = ?"
            " AND position <= ?",
            (ws, target, link.through_position),
        )
    }
    if own - rewritten:
        # Rows the child holds for positions it read through its link: written when the child
        # or its source changed one (the frozen original may be nowhere any more).
        return None
    clones = {
        int(r[0])
        for r in conn.execute(
            "SELECT sequence FROM turns WHERE workspace_id = ? AND session_id = ?"
            " AND sequence_provenance = 'fork_clone'",
            (ws, target),
        )
    }
    now = {r[6]: r for r in visible_rows(conn, ws, source, through)}
    lines: list[str] = []
    for _, _, kind, text, payload, version, position, sequence in visible_rows(
        conn, ws, target, through
    ):
        if sequence not in clones:
            continue
        src = now.get(position)
        if src is None:
            return f"reads position {position}, which its source no longer shows"
        if position in rewritten:
            if src[5] != version:
                return None
            payload = src[4]
        body = "-1:" if text is None else f"{len(text.encode())}:{text}"
        tail = f"{len(payload.encode())}:{payload}"
        lines.append(f"{position},{version},{src[1]},{src[0]},{kind},{body},{tail}")
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    if (len(lines), digest) != (history["count"], history["digest"]):
        return (
            f"shows {len(lines)} cloned Messages not as prepare froze them"
            f" ({history['count']} frozen): a linked row is missing or changed"
        )
    return None


def _check_fence_witness(ctx: _Ctx, conn: apsw.Connection, ops: list[dict[str, Any]]) -> None:
    """The fence's witness: one row per fenced source for its active operation, and a witness
    that counted nothing vouches only for a boundary that is still what prepare digested."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'history_fences'").fetchone() is None:
        return  # a store before schema v13
    witnesses = _rows(
        conn,
        "SELECT f.op_seq, f.changes, k.workspace_id, k.session_id FROM history_fences f"
        " LEFT JOIN session_keys k ON k.session_key = f.session_key",
    )
    by_seq = {int(o["op_seq"]): o for o in ops}
    mine: dict[int, dict[str, Any]] = {}
    for w in witnesses:
        op = by_seq.get(int(w["op_seq"]))
        if (
            op is None
            or op["status"] not in ACTIVE
            or (op["workspace_id"], op["source_session_id"]) != (w["workspace_id"], w["session_id"])
        ):
            ctx.fail(
                Law.FENCE_WITNESS,
                f"the witness of session {w['session_id']} counts for operation seq"
                f" {w['op_seq']}, no active operation of it",
            )
            continue
        mine[int(w["op_seq"])] = w
    for op in ops:
        if op["status"] not in ACTIVE or op["snapshot_json"] is None:
            continue
        history = decode_frozen(op["snapshot_json"]).get("history")
        if not isinstance(history, Mapping) or "through_position" not in history:
            continue  # prepared before the witness: its commit re-proves the digest
        name = f"operation {op['operation_id']} ({op['status']})"
        witness = mine.get(int(op["op_seq"]))
        if witness is None:
            ctx.fail(
                Law.FENCE_WITNESS, f"{name}: its source {op['source_session_id']} has no witness"
            )
            continue
        if int(witness["changes"]) != 0:
            continue  # the commit re-proves the digest
        now = history_digest(
            conn, op["workspace_id"], op["source_session_id"], int(history["through"])
        )
        if now != (history["count"], history["digest"]):
            ctx.fail(
                Law.FENCE_WITNESS,
                f"{name}: the witness counted no change, yet the boundary holds {now[0]} Messages"
                f" unlike the {history['count']} prepare digested",
            )


def kept_digest_problems(conn: apsw.Connection) -> list[str]:
    """What breaks the kept digest's law (schema v17, docs/design/store.md "The kept digest"):
    every `history_digests` row is the pass over its Session's rows it saves — count, digest,
    highest position, the positions prepare looks at — and no row is kept for a Session with a
    history link."""
    kept_table = "SELECT 1 FROM sqlite_master WHERE name = 'history_digests'"
    if conn.execute(kept_table).fetchone() is None:
        return []  # a store before schema v17
    kept = _rows(
        conn,
        "SELECT d.*, k.workspace_id, k.session_id FROM history_digests d"
        " LEFT JOIN session_keys k ON k.session_key = d.session_key",
    )
    problems: list[str] = []
    for row in kept:
        ws, sid, through = row["workspace_id"], row["session_id"], int(row["through"])
        name = f"the digest kept of session {sid} through Turn {through}"
        if ws is None:
            problems.append(f"{name}: no Session has key {row['session_key']}")
            continue
        if history_link(conn, ws, sid) is not None:
            problems.append(f"{name}: the Session reads through a history link")
            continue
        count, digest, top, special = digest_pass(conn, ws, sid, through)
        few = special if len(special) * FEW_SPECIAL <= count else None
        text = str(row["special"])
        kept_special = None if text == "*" else [int(p) for p in text.split(",") if p]
        if (int(row["count"]), str(row["digest"]), int(row["top"]), kept_special) != (
            count,
            digest,
            top,
            few,
        ):
            problems.append(
                f"{name}: kept {row['count']} Messages up to position {row['top']}, the rows now"
                f" {count} up to {top}{'' if digest == row['digest'] else ', another digest'}"
            )
    return problems


def _check_kept_digests(ctx: _Ctx, conn: apsw.Connection) -> None:
    for problem in kept_digest_problems(conn):
        ctx.fail(Law.HISTORY_DIGEST_KEPT, problem)


def _check_reservations(ctx: _Ctx, conn: apsw.Connection, ops: list[dict[str, Any]]) -> None:
    held = {
        (r["workspace_id"], r["session_id"]): r["operation_id"]
        for r in _rows(conn, "SELECT * FROM session_reservations")
    }
    for op in ops:
        key = (op["workspace_id"], op["target_session_id"])
        holds = held.get(key) == op["operation_id"]
        if op["status"] in RELEASED and holds:
            ctx.fail(
                Law.RESERVATION, f"{op['status']} operation {op['operation_id']} holds {key[1]}"
            )
        if op["status"] not in RELEASED and not holds:
            ctx.fail(
                Law.RESERVATION, f"{op['status']} operation {op['operation_id']} lost {key[1]}"
            )


def _check_step_order(ctx: _Ctx, ops: list[dict[str, Any]]) -> None:
    for op in ops:
        name = f"{op['status']} operation {op['operation_id']}"
        if op["status"] in ("provider_accepted", "committed") and (
            op["dispatched_at_ms"] is None or op["accepted_at_ms"] is None
        ):
            ctx.fail(Law.STEP_ORDER, f"{name} lacks its dispatching or provider_accepted time")
            continue
        times = [op["created_at_ms"], op["dispatched_at_ms"], op["accepted_at_ms"]]
        if op["status"] == "committed":
            times.append(op["completed_at_ms"])
        stamped = [t for t in times if t is not None]
        if stamped != sorted(stamped):
            ctx.fail(Law.STEP_ORDER, f"{name}: step times out of order {times}")


def _check_single_holders(ctx: _Ctx, ops: list[dict[str, Any]]) -> None:
    active = Counter(
        (o["workspace_id"], o["source_session_id"]) for o in ops if o["status"] in ACTIVE
    )
    for key, n in active.items():
        if n > 1:
            ctx.fail(Law.SINGLE_ACTIVE, f"{n} active operations on source {key[1]}")
    # Law 8: keyed on the resolved boundary, not the point kind.
    barrier = Counter(
        (o["workspace_id"], o["source_session_id"], o["source_turn_id"])
        for o in ops
        if o["status"] in (*ACTIVE, "unknown")
        or (o["status"] == "committed" and o["client_observed_at_ms"] is None)
    )
    for key, n in barrier.items():
        if n > 1:
            ctx.fail(Law.BOUNDARY_BARRIER, f"{n} barrier holders on {key[1]} turn {key[2]}")
    # Schema v22: the flag the barrier's index selects by is the rule, row by row.
    for o in ops:
        if "barrier" not in o:  # a store before v22
            continue
        held = o["status"] in (*ACTIVE, "unknown") or (
            o["status"] == "committed" and o["client_observed_at_ms"] is None
        )
        if o["barrier"] != int(held):
            ctx.fail(
                Law.BARRIER_FLAG,
                f"operation {o['operation_id']} ({o['status']}, ACKed"
                f" {o['client_observed_at_ms'] is not None}): barrier {o['barrier']!r},"
                f" the rule {int(held)}",
            )
    # Schema v23: the stage the source's index keys on is the status's, row by row.
    for o in ops:
        if "stage" not in o:  # a store before v23
            continue
        stage = 2 if o["status"] in ACTIVE else 0 if o["status"] in ("failed", "abandoned") else 1
        if o["stage"] != stage:
            ctx.fail(
                Law.STAGE_COLUMN,
                f"operation {o['operation_id']} ({o['status']}): stage {o['stage']!r},"
                f" the status's {stage}",
            )

    # Schema v25: the deleted trees' paths `session.create` probes are exactly theirs.
    for o in ops:
        if "deleted_tree_path" not in o:  # a store before v25
            continue
        deleted = o["status"] == "committed" and o.get("workspace_state") in (
            "removing",
            "removed",
        )
        plan = json.loads(o["workspace_json"]) if o.get("workspace_json") else {}
        want = plan.get("path") if deleted and isinstance(plan, dict) else None
        if o["deleted_tree_path"] != want:
            ctx.fail(
                Law.DELETED_TREE_PATH,
                f"operation {o['operation_id']} ({o['status']}, tree"
                f" {o.get('workspace_state')}): deleted_tree_path {o['deleted_tree_path']!r},"
                f" its deleted tree's path {want!r}",
            )


ENDED_SNAPSHOTS_DROPPED_SINCE = 27
"""The schema version from which a fork that ended without a child keeps no snapshot."""


def _check_ended_snapshots(ctx: _Ctx, conn: apsw.Connection, ops: list[dict[str, Any]]) -> None:
    """`snapshot_kept`: a snapshot row (the `LEFT JOIN`'s `snapshot_json`, never NULL in its
    table) for exactly the operations not `failed` or `abandoned`."""
    if user_version(conn) < ENDED_SNAPSHOTS_DROPPED_SINCE:
        return  # a store from before v27 kept every snapshot
    for o in ops:
        ended = o["status"] in ("failed", "abandoned")
        if ended and o["snapshot_json"] is not None:
            ctx.fail(
                Law.SNAPSHOT_KEPT,
                f"operation {o['operation_id']} ({o['status']}) still keeps its snapshot",
            )
        elif not ended and o["snapshot_json"] is None:
            ctx.fail(
                Law.SNAPSHOT_KEPT,
                f"operation {o['operation_id']} ({o['status']}) has no snapshot",
            )


def _check_fence(ctx: _Ctx, copy_path: Path, ops: list[dict[str, Any]]) -> None:
    """A real fenced write on the copy: refused exactly on sources with an active operation."""
    fenced = {(o["workspace_id"], o["source_session_id"]) for o in ops if o["status"] in ACTIVE}
    store = Store.open(copy_path)
    try:
        conn = apsw.Connection(str(copy_path))
        try:
            live = [
                (r["workspace_id"], r["session_id"], r["settings_json"])
                for r in _rows(conn, "SELECT * FROM sessions WHERE deleted = 0")
            ]
        finally:
            conn.close()
        for ws, sid, settings_json in live:
            try:
                store.sessions.update_settings(ws, sid, json.loads(settings_json))
                refused = False
            except ForkInProgress:
                refused = True
            except HostError as exc:
                ctx.fail(Law.FENCE, f"fenced write on {sid} failed untyped-ly: {exc!r}")
                continue
            if refused != ((ws, sid) in fenced):
                ctx.fail(
                    Law.FENCE,
                    f"source {sid}: fenced write {'refused' if refused else 'accepted'} with "
                    f"{'an' if (ws, sid) in fenced else 'no'} active operation",
                )
    finally:
        store.close()


def fence_windows(
    conn: apsw.Connection, ops: list[dict[str, Any]], now_ms: int
) -> list[tuple[dict[str, Any], int, int]]:
    """(operation, start, end) of each window in which an operation held its source's fence,
    as far as its row's times tell: prepare → its end (`committed`, `failed`, or `unknown`,
    when the fence was released), or for one a `fork.resolve` adopted, its accept → its commit
    (the time it spent `unknown` before is not on the row). An active operation's window is
    open (`now_ms`); an `abandoned` one's first end is not kept, so it has none."""
    adopted = {
        (r["workspace_id"], r["operation_id"])
        for r in _rows(
            conn, "SELECT workspace_id, operation_id FROM fork_resolutions WHERE action = 'adopt'"
        )
    }
    windows = []
    for o in ops:
        status = o["status"]
        end = o["completed_at_ms"] if status not in ACTIVE else now_ms
        if (
            status in ("provider_accepted", "committed")
            and (
                o["workspace_id"],
                o["operation_id"],
            )
            in adopted
        ):
            start = o["accepted_at_ms"]
        elif status == "abandoned":
            continue
        else:
            start = o["created_at_ms"]
        if start is not None and end is not None:
            windows.append((o, int(start), int(end)))
    return windows


def _check_fence_window(ctx: _Ctx, conn: apsw.Connection, ops: list[dict[str, Any]]) -> None:
    """No Turn of a source claimed inside one of its operations' fence windows, none active
    when one opened; no goal control or Interaction answer of it recorded inside one."""
    now = int(conn.execute("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)").fetchone()[0])
    for o, start, end in fence_windows(conn, ops, now):
        for t in _rows(
            conn,
            "SELECT turn_id, sequence, created_at_ms, settled_at_ms FROM turns"
            " WHERE workspace_id = ? AND session_id = ? AND ((created_at_ms > ?"
            " AND created_at_ms < ?) OR (created_at_ms < ? AND (settled_at_ms IS NULL"
            " OR settled_at_ms > ?)))",
            (o["workspace_id"], o["source_session_id"], start, end, start, start),
        ):
            ctx.fail(
                Law.FENCE_WINDOW,
                f"source {o['source_session_id']} turn {t['turn_id']} (seq {t['sequence']},"
                f" created {t['created_at_ms']}, settled {t['settled_at_ms']}) ran inside the"
                f" fence window {start}..{end} of operation {o['operation_id']} ({o['status']})",
            )
        # The fenced controls' own rows: a goal control recorded (or one still active) and an
        # Interaction's answer recorded inside the window would be a fenced write that landed.
        source = (o["workspace_id"], o["source_session_id"])
        for g in _rows(
            conn,
            "SELECT control_id, created_at_ms, finished_at_ms FROM goal_controls"
            " WHERE workspace_id = ? AND session_id = ? AND ((created_at_ms > ?"
            " AND created_at_ms < ?) OR (created_at_ms < ? AND (finished_at_ms IS NULL"
            " OR finished_at_ms > ?)))",
            (*source, start, end, start, start),
        ):
            ctx.fail(
                Law.FENCE_WINDOW,
                f"source {o['source_session_id']} goal control {g['control_id']} (created"
                f" {g['created_at_ms']}, finished {g['finished_at_ms']}) inside the fence window"
                f" {start}..{end} of operation {o['operation_id']} ({o['status']})",
            )
        for i in _rows(
            conn,
            "SELECT turn_id, request_id, resolved_at_ms FROM interactions WHERE workspace_id = ?"
            " AND session_id = ? AND status = 'resolved' AND resolved_at_ms > ?"
            " AND resolved_at_ms < ?",
            (*source, start, end),
        ):
            ctx.fail(
                Law.FENCE_WINDOW,
                f"source {o['source_session_id']} turn {i['turn_id']} interaction"
                f" {i['request_id']} answered at {i['resolved_at_ms']}, inside the fence window"
                f" {start}..{end} of operation {o['operation_id']} ({o['status']})",
            )


def _check_delete_fence_window(ctx: _Ctx, conn: apsw.Connection, ops: list[dict[str, Any]]) -> None:
    """No source deleted inside one of its operations' fence windows: `session.delete` is a
    fenced write (law 3), and its row's `updated_at_ms` is its own transaction's time (a
    deleted Session's row is not written again: no Turn of it is active)."""
    now = int(conn.execute("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)").fetchone()[0])
    for o, start, end in fence_windows(conn, ops, now):
        for s in _rows(
            conn,
            "SELECT session_id, updated_at_ms FROM sessions WHERE workspace_id = ?"
            " AND session_id = ? AND deleted = 1 AND updated_at_ms > ? AND updated_at_ms < ?",
            (o["workspace_id"], o["source_session_id"], start, end),
        ):
            ctx.fail(
                Law.FENCE_WINDOW,
                f"source {s['session_id']} deleted at {s['updated_at_ms']}, inside the fence"
                f" window {start}..{end} of operation {o['operation_id']} ({o['status']})",
            )


def _check_provider_children(
    ctx: _Ctx,
    children: list[ProviderChild],
    ops: list[dict[str, Any]],
    alive: list[dict[str, Any]],
    *,
    after_copy: Sequence[ProviderChild] = (),
) -> int:
    by_source: dict[str, set[str]] = defaultdict(set)
    for child in children:
        by_source[child.source_provider_session_id].add(child.child_id)
    # Where a child may be found for the presence law: either scan (see check_invariants).
    present: dict[str, set[str]] = defaultdict(set)
    for child in [*children, *after_copy]:
        present[child.source_provider_session_id].add(child.child_id)
    dispatched = Counter(o["source_provider_session_id"] for o in ops if o["status"] in DISPATCHED)
    for source, ids in by_source.items():
        if len(ids) > dispatched.get(source, 0):
            ctx.fail(
                Law.ONE_PROVIDER_CHILD,
                f"source provider session {source}: {len(ids)} provider children "
                f"{sorted(ids)} for {dispatched.get(source, 0)} dispatched operations",
            )
    claimed = Counter(
        o["target_provider_session_id"]
        for o in ops
        if o["status"] in ("provider_accepted", "committed") and o["target_provider_session_id"]
    )
    for child_id, n in claimed.items():
        if n > 1:
            ctx.fail(
                Law.ONE_PROVIDER_CHILD, f"provider child {child_id} accepted by {n} operations"
            )
    live = {o["operation_id"] for o in alive}
    for op in ops:
        if op["status"] == "committed" and op["operation_id"] not in live:
            # Its child Session was deleted with its home: a provider that moves the child
            # there (Claude) keeps no other copy, and the user asked for it to go.
            continue
        if op["status"] in ("provider_accepted", "committed"):
            ids = present.get(op["source_provider_session_id"], set())
            if op["target_provider_session_id"] not in ids:
                ctx.fail(
                    Law.ONE_PROVIDER_CHILD,
                    f"operation {op['operation_id']}: accepted child "
                    f"{op['target_provider_session_id']} is not in any provider home",
                )
    return sum(len(ids) for ids in by_source.values())


def quarantined_files(home: Path) -> list[tuple[str, Path]]:
    """(operation id, file) for every file `fork.resolve` abandon moved aside:
    `runtimes/<ws>/<sid>/<provider home>/quarantine/<operation id>/...`, and where a deleted
    source's quarantine is kept, `runtimes/.evidence/<ws>/<sid>/<provider home>/quarantine/`."""
    out = []
    runtimes = home / "runtimes"
    qdirs = [*runtimes.glob("*/*/*/quarantine/*"), *runtimes.glob(".evidence/*/*/*/quarantine/*")]
    for qdir in sorted(qdirs):
        if qdir.parts[len(runtimes.parts)] == ".trash":
            continue
        for path in sorted(qdir.rglob("*")):
            if path.is_file():
                out.append((qdir.name, path))
    return out


def _tutti_turns(path: Path) -> tuple[str, ...] | None:
    """The Turn ids a Tutti Agent rollout shows (`task_started` events), or None if unreadable.
    A Tutti Agent fork child holds its whole history, so until it runs a Turn of its own (only
    a committed child does) these are exactly its operation's frozen prefix."""
    turns = [
        str((e.get("payload") or {}).get("turn_id"))
        for e in _json_lines(path)
        if e.get("type") == "event_msg" and (e.get("payload") or {}).get("type") == "task_started"
    ]
    return tuple(turns) if turns else None


def _quarantined_lineage(path: Path) -> str | None:
    """The source a quarantined child names (rollout `forked_from_id` / Claude `forkedFrom`)."""
    if path.suffix != ".jsonl":
        return None
    if path.name.startswith("rollout-"):
        payload = (_first_json_line(path) or {}).get("payload") or {}
        found = payload.get("forked_from_id") if isinstance(payload, dict) else None
        return found if isinstance(found, str) else None
    for entry in _json_lines(path):
        forked = entry.get("forkedFrom")
        if isinstance(forked, dict) and isinstance(forked.get("sessionId"), str):
            return str(forked["sessionId"])
    return None


SPARE_HOME_PREFIX = ".claude-spare-"  # drivers/claude/homes.py's PREFIX


def _check_spare_homes(ctx: _Ctx, home: Path) -> int:
    """Every spare home made ahead holds directories only (law `SPARE_HOME_EMPTY`). An entry
    gone by the time it is looked at (the spare renamed into a child's place meanwhile) is no
    finding. Returns how many spares it walked."""
    spares = _glob(home / "runtimes", f"*/{SPARE_HOME_PREFIX}*")
    for spare in spares:
        if spare.is_symlink() or (spare.exists() and not spare.is_dir()):
            ctx.fail(Law.SPARE_HOME_EMPTY, f"{spare} is no directory")
            continue
        for dirpath, dirnames, filenames in os.walk(spare):
            for name in filenames:
                if os.path.lexists(os.path.join(dirpath, name)):
                    ctx.fail(Law.SPARE_HOME_EMPTY, f"{dirpath}/{name} in a spare home")
            for name in dirnames:
                if os.path.islink(os.path.join(dirpath, name)):
                    ctx.fail(Law.SPARE_HOME_EMPTY, f"{dirpath}/{name} is a link in a spare home")
    return len(spares)


QUARANTINE_DIR = "quarantine"  # drivers/quarantine.py's folder name


def _quarantine_file_kept(home: Path, recorded: str) -> bool:
    """Whether a file an abandon recorded moving into quarantine is still there: at its place
    (`runtimes/<ws>/<sid>/<provider home>/quarantine/<op>/…`, read under this `home`, which
    may be a copy), else, its source deleted, under `runtimes/.evidence/` (the folder renamed
    `<op>-<suffix>` when the name was taken). The place is looked at first: a delete moving
    the folder meanwhile moves it into the second. A path of no such shape is not judged."""
    parts = Path(recorded).parts
    if QUARANTINE_DIR not in parts:
        return True
    q = len(parts) - 1 - parts[::-1].index(QUARANTINE_DIR)
    if q < 3 or q + 2 >= len(parts):
        return True
    ws, sid, provider_home = parts[q - 3 : q]
    op_id, rel = parts[q + 1], Path(*parts[q + 2 :])
    runtimes = home / "runtimes"
    if (runtimes / ws / sid / provider_home / QUARANTINE_DIR / op_id / rel).is_file():
        return True
    kept = runtimes / ".evidence" / ws / sid / provider_home / QUARANTINE_DIR
    return any((folder / rel).is_file() for folder in _glob(kept, f"{op_id}*"))


def _check_quarantine(
    ctx: _Ctx, home: Path, ops: list[dict[str, Any]], resolutions: list[dict[str, Any]]
) -> None:
    by_id = {o["operation_id"]: o for o in ops}
    abandons = {r["operation_id"]: r for r in resolutions if r["action"] == "abandon"}
    for op_id, path in quarantined_files(home):
        op = by_id.get(op_id)
        status = None if op is None else op["status"]
        # `unknown`: an abandon that moved the child and then died is rolled back at start-up
        # (its resolution row says so); nothing else moves a child of an `unknown` operation.
        if (
            op is None
            or status not in ("abandoned", "unknown")
            or (status == "unknown" and op_id not in abandons)
        ):
            ctx.fail(Law.QUARANTINE, f"{path} quarantined for {status or 'no'} operation")
            continue
        if path.stat().st_size == 0:
            ctx.fail(Law.QUARANTINE, f"{path} was emptied in quarantine")
            continue
        # Law 9: an operation's quarantine holds its own child only.
        source = _quarantined_lineage(path)
        if source is not None and source != op["source_provider_session_id"]:
            ctx.fail(Law.QUARANTINE, f"{path} is a child of {source}, not of {op_id}'s source")
        if "tutti-agent-home" in path.parts and path.name.startswith("rollout-"):
            prefix = tuple(json.loads(op["source_provider_turn_ids"] or "[]"))
            turns = _tutti_turns(path)
            if turns is not None and turns != prefix:
                ctx.fail(
                    Law.QUARANTINE,
                    f"{path} in {op_id}'s quarantine shows turns {list(turns)}, not its frozen "
                    f"prefix {list(prefix)}: another operation's child",
                )

    # Moved aside, never deleted (law 9): every file a finished abandon recorded moving (or
    # found already moved by a resolve a kill cut) is still in quarantine.
    for op_id, r in abandons.items():
        if r["state"] != "done":
            continue
        result = json.loads(r["result_json"]) if r["result_json"] else None
        evidence = (result.get("evidence") if isinstance(result, dict) else None) or {}
        for recorded in [*evidence.get("quarantined", ()), *evidence.get("quarantinedNow", ())]:
            if not _quarantine_file_kept(home, str(recorded)):
                ctx.fail(Law.QUARANTINE, f"{recorded}, quarantined by {op_id}, was removed")


# Operations that may own a provider child no operation recorded: the request may have left,
# and no resolve has moved its child aside yet.
MAY_OWN_UNRECORDED = ("dispatching", "unknown")


def _check_child_owners(
    ctx: _Ctx, children: list[ProviderChild], ops: list[dict[str, Any]]
) -> None:
    """Law 9: every provider child on disk (outside quarantine) is recorded by one operation,
    or may be owned by a dispatched, unrecorded one of its source whose frozen prefix its Turns
    show (read for Tutti Agent, whose children hold their whole history)."""
    recorded = {o["target_provider_session_id"] for o in ops if o["target_provider_session_id"]}
    owners: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in ops:
        if o["status"] in MAY_OWN_UNRECORDED:
            owners[o["source_provider_session_id"]].append(o)
    unrecorded: dict[str, dict[str, ProviderChild]] = defaultdict(dict)
    for child in children:
        if child.child_id not in recorded:
            unrecorded[child.source_provider_session_id][child.child_id] = child
    for source, found in unrecorded.items():
        candidates = owners.get(source, [])
        if len(found) > len(candidates):
            ctx.fail(
                Law.CHILD_OWNED,
                f"source provider session {source}: {len(found)} unrecorded provider children "
                f"{sorted(found)} for {len(candidates)} dispatched, unresolved operations",
            )
            continue
        prefixes = Counter(
            tuple(json.loads(o["source_provider_turn_ids"] or "[]")) for o in candidates
        )
        shown: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for child in found.values():
            if child.provider != "tutti-agent":
                continue
            turns = _tutti_turns(child.path)
            if turns is not None and turns not in prefixes:
                ctx.fail(
                    Law.CHILD_OWNED,
                    f"provider child {child.child_id} at {child.path} shows turns {list(turns)}:"
                    " no dispatched, unresolved operation of its source froze that prefix",
                )
            elif turns is not None:
                shown[turns].append(child.child_id)
        # One child per operation: more children showing a prefix than operations froze it
        # is a prefix forked twice, however many other operations could own a child.
        for turns, ids in shown.items():
            if len(ids) > prefixes[turns]:
                ctx.fail(
                    Law.CHILD_OWNED,
                    f"provider children {sorted(ids)} show turns {list(turns)}: "
                    f"{prefixes[turns]} dispatched, unresolved operation(s) froze that prefix",
                )


def _check_unknown_evidence(
    ctx: _Ctx, home: Path, ops: list[dict[str, Any]], sessions: list[dict[str, Any]]
) -> None:
    """Law 9 / seed 000 §10: an `unknown` operation keeps its evidence until resolved: its
    source Session is not deleted and the source's provider home is still there."""
    by_key = {(s["workspace_id"], s["session_id"]): s for s in sessions}
    for op in ops:
        if op["status"] != "unknown":
            continue
        ws, source = op["workspace_id"], op["source_session_id"]
        session = by_key.get((ws, source))
        if session is None or session["deleted"]:
            ctx.fail(
                Law.UNKNOWN_EVIDENCE,
                f"unknown operation {op['operation_id']}: its source {source} was deleted",
            )
            continue
        provider = session["provider"]
        if provider in HOME_DIRS and not provider_home(home, ws, source, provider).is_dir():
            ctx.fail(
                Law.UNKNOWN_EVIDENCE,
                f"unknown operation {op['operation_id']}: source {source}'s provider home is gone",
            )


def _check_completed_turns(ctx: _Ctx, conn: apsw.Connection) -> None:
    """Every provider here is bound-capable: a completed Turn has its provider turn id and a
    final assistant Message of its own."""
    for t in _rows(
        conn,
        "SELECT t.workspace_id, t.session_id, t.turn_id, t.root_provider_turn_id,"
        " t.final_assistant_message_id, m.kind AS final_kind, m.turn_id AS final_turn"
        " FROM turns t JOIN session_keys k USING (workspace_id, session_id)"
        " LEFT JOIN messages m ON m.session_key = k.session_key"
        " AND m.message_id = t.final_assistant_message_id"
        " WHERE t.phase = 'settled' AND t.outcome = 'completed'",
    ):
        where = f"session {t['session_id']} turn {t['turn_id']}"
        if t["final_kind"] is None and t["final_assistant_message_id"]:
            # A linked child's cloned Turn: its final Message is read through its link.
            linked = linked_message(
                conn, t["workspace_id"], t["session_id"], t["final_assistant_message_id"]
            )
            if linked is not None:
                t["final_kind"], t["final_turn"] = linked[2], linked[1]
        if not t["root_provider_turn_id"]:
            ctx.fail(Law.COMPLETED_TURN_RECORDED, f"{where}: completed with no provider binding")
        if not t["final_assistant_message_id"]:
            ctx.fail(Law.COMPLETED_TURN_RECORDED, f"{where}: completed with no assistant message")
        elif t["final_kind"] != "assistant" or t["final_turn"] != t["turn_id"]:
            ctx.fail(
                Law.COMPLETED_TURN_RECORDED,
                f"{where}: final message is not an assistant message of this turn",
            )


def claude_transcript_problem(
    home_dir: Path, provider_session_id: str, root: str, binding_json: str | None
) -> str | None:
    """Why the Claude Turn rooted at `root` (its binding `binding_json`) is not in the
    transcript of `provider_session_id` in `home_dir`, or None: that transcript has a Turn
    rooted there (`split_turns`' boundaries: each root user message up to the next one), with
    an assistant message, and the binding's checkpoint is one of its messages."""
    from drivers.claude_transcript import decode_binding, parse_entry_bytes

    matches = sorted(home_dir.glob(f"projects/*/{provider_session_id}.jsonl"))
    if len(matches) != 1:
        return f"{len(matches)} transcripts for {provider_session_id} in {home_dir}"
    try:
        entries = parse_entry_bytes(matches[0].read_bytes())
    except OSError as exc:
        return f"transcript {matches[0]} unreadable: {exc}"
    span: list[tuple[str, str]] | None = None
    for entry in entries:
        if entry.is_root_user:
            if span is not None:
                break
            if entry.uuid == root:
                span = []
        if span is not None:
            span.append((entry.type, entry.uuid))
    if span is None:
        return f"no Turn rooted at {root} in {matches[0]}"
    if not any(kind == "assistant" for kind, _ in span):
        return f"its Turn {root} in {matches[0]} holds no assistant message"
    checkpoint = decode_binding(binding_json)
    if checkpoint is not None and checkpoint not in {uuid for _, uuid in span}:
        return f"its checkpoint {checkpoint} is no message of its Turn {root} in {matches[0]}"
    return None


def codex_turn_end_problem(home_dir: Path, thread: str, turn_ids: Sequence[str]) -> list[str]:
    """Of `turn_ids` (provider turn ids of a Codex thread's completed Turns), why each one
    whose end is not in the thread's logical history in `home_dir` (`_codex_history`) is
    missing: one problem for a history that cannot be read."""
    history = _codex_history(home_dir, thread, set())
    if isinstance(history, str):
        return [history] if turn_ids else []
    ended = _ended_turns(history)
    return [f"no end of Turn {t} in thread {thread}'s history" for t in turn_ids if t not in ended]


def _codex_turn_misses(ctx: _Ctx, conn: apsw.Connection) -> list[tuple[str, str, str]]:
    """`codex_turn_in_rollout`: the completed Turns of each live Codex Session looked for in
    its home. (workspace, Session, detail) of each miss: the caller rechecks the Session's
    deletion as `claude_turn_in_transcript` does."""
    return _turn_end_misses(ctx, conn, "codex", codex_turn_end_problem)


def _turn_end_misses(
    ctx: _Ctx,
    conn: apsw.Connection,
    provider: str,
    problem: Callable[[Path, str, Sequence[str]], list[str]],
) -> list[tuple[str, str, str]]:
    """The completed, bound Turns of each live Session of `provider` (a Codex or a Tutti
    Agent one: a thread whose Turns end in `task_complete`/`turn_aborted` lines), each
    Session's looked for in its home by `problem`."""
    by_session: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for t in _rows(
        conn,
        "SELECT t.workspace_id, t.session_id, t.root_provider_turn_id, s.provider_session_id"
        " FROM turns t JOIN sessions s USING (workspace_id, session_id)"
        " WHERE s.provider = ? AND s.deleted = 0 AND s.provider_session_id IS NOT NULL"
        " AND t.phase = 'settled' AND t.outcome = 'completed'"
        " AND t.root_provider_turn_id IS NOT NULL ORDER BY t.sequence",
        (provider,),
    ):
        key = (t["workspace_id"], t["session_id"], str(t["provider_session_id"]))
        by_session[key].append(str(t["root_provider_turn_id"]))
    misses: list[tuple[str, str, str]] = []
    for (ws, sid, thread), turn_ids in by_session.items():
        home_dir = provider_home(ctx.home, ws, sid, provider)
        for found in problem(home_dir, thread, turn_ids):
            misses.append((ws, sid, f"session {sid}: {found}"))
    return misses


def _ended_turns(records: Iterable[Mapping[str, Any]]) -> set[Any]:
    """The turn ids a thread's records end (`task_complete` or `turn_aborted` events)."""
    return {
        r["payload"].get("turn_id")
        for r in records
        if r.get("type") == "event_msg"
        and isinstance(r.get("payload"), dict)
        and r["payload"].get("type") in ("task_complete", "turn_aborted")
    }


def tutti_turn_end_problem(home_dir: Path, thread: str, turn_ids: Sequence[str]) -> list[str]:
    """Of `turn_ids` (provider turn ids of a Tutti Agent thread's completed Turns), why each
    one whose end is not in the thread's one rollout in `home_dir` is missing: one problem
    when there is not exactly one such rollout."""
    matches = sorted(home_dir.glob(f"sessions/**/rollout-*-{thread}.jsonl"))
    if len(matches) != 1:
        return [f"{len(matches)} rollouts for thread {thread} in {home_dir}"] if turn_ids else []
    ended = _ended_turns(_json_lines(matches[0]))
    return [f"no end of Turn {t} in thread {thread}'s rollout" for t in turn_ids if t not in ended]


def _tutti_turn_misses(ctx: _Ctx, conn: apsw.Connection) -> list[tuple[str, str, str]]:
    """`tutti_turn_in_rollout`: the completed Turns of each live Tutti Agent Session looked
    for in its home. (workspace, Session, detail) of each miss: the caller rechecks the
    Session's deletion as `codex_turn_in_rollout` does."""
    return _turn_end_misses(ctx, conn, "tutti-agent", tutti_turn_end_problem)


def _claude_transcript_misses(
    ctx: _Ctx, conn: apsw.Connection
) -> tuple[int, list[tuple[str, str, str]]]:
    """`claude_turn_in_transcript`: each completed Turn of a live Claude Code Session, read in
    its Session's transcript. Returns how many were read, and (workspace, Session, detail) of
    each miss: a Session deleted since the copy (its home swept) is none, which the caller
    rechecks in the store as it is then."""
    by_session: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for t in _rows(
        conn,
        "SELECT t.workspace_id, t.session_id, t.turn_id, t.root_provider_turn_id,"
        " t.provider_turn_binding_json, s.provider_session_id FROM turns t JOIN sessions s"
        " USING (workspace_id, session_id) WHERE s.provider = 'claude-code' AND s.deleted = 0"
        " AND t.phase = 'settled' AND t.outcome = 'completed'"
        " AND t.root_provider_turn_id IS NOT NULL",
    ):
        by_session[(t["workspace_id"], t["session_id"])].append(t)
    misses: list[tuple[str, str, str]] = []
    read = 0
    for (ws, sid), turns in by_session.items():
        home_dir = provider_home(ctx.home, ws, sid, "claude-code")
        for t in turns:
            problem = claude_transcript_problem(
                home_dir,
                str(t["provider_session_id"]),
                str(t["root_provider_turn_id"]),
                t["provider_turn_binding_json"],
            )
            read += 1
            if problem:
                misses.append((ws, sid, f"session {sid} turn {t['turn_id']}: {problem}"))
    return read, misses


def _deleted_now(home: Path) -> set[tuple[str, str]]:
    """The Sessions the store of `home` holds deleted now (read-only, beside a live daemon)."""
    now = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        now.set_busy_timeout(10_000)
        return {
            (r["workspace_id"], r["session_id"])
            for r in _rows(now, "SELECT workspace_id, session_id FROM sessions WHERE deleted = 1")
        }
    finally:
        now.close()


def _check_host_only_turns(ctx: _Ctx, conn: apsw.Connection) -> None:
    """`host_only_turn`: a Turn its provider never got is settled, not `completed`, unbound;
    a committed child's copy of a boundary Turn is marked exactly when its source Turn is."""
    if "host_only" not in {str(r[1]) for r in conn.execute("PRAGMA table_info(turns)")}:
        return  # a store before v24
    for t in _rows(
        conn,
        "SELECT session_id, turn_id, phase, outcome, root_provider_turn_id FROM turns"
        " WHERE host_only <> 0",
    ):
        if t["phase"] != "settled" or t["outcome"] == "completed" or t["root_provider_turn_id"]:
            ctx.fail(
                Law.HOST_ONLY_TURN,
                f"session {t['session_id']} turn {t['turn_id']}: host-only but {t['phase']}"
                f" {t['outcome']}, provider turn {t['root_provider_turn_id']!r}",
            )
    # The child's Turns through the boundary carry the source's sequences (fork_clone).
    for t in _rows(
        conn,
        "SELECT l.target_session_id, c.sequence, c.host_only AS child, s.host_only AS source"
        " FROM fork_lineage l JOIN turns b ON b.workspace_id = l.workspace_id"
        " AND b.session_id = l.source_session_id AND b.turn_id = l.source_turn_id"
        " JOIN turns c ON c.workspace_id = l.workspace_id AND c.session_id = l.target_session_id"
        " AND c.sequence <= b.sequence"
        " JOIN turns s ON s.workspace_id = l.workspace_id AND s.session_id = l.source_session_id"
        " AND s.sequence = c.sequence WHERE c.host_only <> s.host_only",
    ):
        ctx.fail(
            Law.HOST_ONLY_TURN,
            f"child {t['target_session_id']} turn {t['sequence']}: host_only {t['child']},"
            f" its source Turn's {t['source']}",
        )


def _check_turn_claims(ctx: _Ctx, conn: apsw.Connection) -> None:
    """`turn_claim`: at most one active Turn per Session, none on a deleted Session, a
    submit claim `active` only while its Turn is active and unbound, and each claim's text its
    Turn's user Message's (what a replay is compared with). Holds after any kill: each
    is decided inside one write (the claim, the delete, the bind, the settlement)."""
    for t in _rows(
        conn,
        "SELECT session_id, COUNT(*) AS n, group_concat(turn_id) AS turns FROM turns"
        " WHERE phase = 'active' GROUP BY workspace_id, session_id HAVING COUNT(*) > 1",
    ):
        ctx.fail(Law.TURN_CLAIM, f"session {t['session_id']}: {t['n']} active turns ({t['turns']})")
    for t in _rows(
        conn,
        "SELECT t.session_id, t.turn_id FROM turns t JOIN sessions s"
        " USING (workspace_id, session_id) WHERE t.phase = 'active' AND s.deleted <> 0",
    ):
        ctx.fail(
            Law.TURN_CLAIM,
            f"session {t['session_id']} turn {t['turn_id']}: active on a deleted session",
        )
    for c in _rows(
        conn,
        "SELECT c.session_id, c.request_id, c.turn_id, t.phase, t.root_provider_turn_id"
        " FROM submit_claims c LEFT JOIN turns t USING (workspace_id, session_id, turn_id)"
        " WHERE c.status = 'active' AND (t.phase IS NOT 'active'"
        " OR t.root_provider_turn_id IS NOT NULL)",
    ):
        ctx.fail(
            Law.TURN_CLAIM,
            f"session {c['session_id']} claim {c['request_id']}: active while its turn"
            f" {c['turn_id']} is {c['phase'] or 'missing'}"
            f" (provider turn {c['root_provider_turn_id']!r})",
        )
    # A replay of a submit is answered by comparing its input with the claim's text: that text
    # is its Turn's input (the user Message the claim wrote with it), or a replay of the real
    # input would be refused and another input answered with this Turn.
    for c in _rows(
        conn,
        "SELECT c.session_id, c.request_id, c.turn_id FROM submit_claims c"
        " JOIN session_keys k USING (workspace_id, session_id)"
        " WHERE c.text IS NOT (SELECT m.text FROM messages m WHERE m.session_key ="
        " k.session_key AND m.turn_id = c.turn_id AND m.kind = 'user'"
        " ORDER BY m.position LIMIT 1)",
    ):
        ctx.fail(
            Law.TURN_CLAIM,
            f"session {c['session_id']} claim {c['request_id']}: its text is not the input"
            f" of its turn {c['turn_id']}",
        )


def _check_provider_turns_once(ctx: _Ctx, conn: apsw.Connection) -> None:
    """`provider_turn_once`: within a Session, a provider turn is bound to one Turn at most."""
    for t in _rows(
        conn,
        "SELECT session_id, root_provider_turn_id AS provider_turn, group_concat(turn_id) AS"
        " turns FROM turns WHERE root_provider_turn_id IS NOT NULL"
        " GROUP BY workspace_id, session_id, root_provider_turn_id HAVING COUNT(*) > 1",
    ):
        ctx.fail(
            Law.PROVIDER_TURN_ONCE,
            f"session {t['session_id']}: provider turn {t['provider_turn']} bound to Turns"
            f" {t['turns']}",
        )


def _check_interactions(ctx: _Ctx, conn: apsw.Connection) -> None:
    """`interaction_state`: each Interaction's record is one its Turn's life can leave."""
    for i in _rows(
        conn,
        "SELECT i.session_id, i.turn_id, i.request_id, i.status, i.output_json IS NOT NULL"
        " AS answered, i.created_at_ms, i.resolved_at_ms, t.phase FROM interactions i"
        " JOIN turns t USING (workspace_id, session_id, turn_id)",
    ):
        where = f"session {i['session_id']} turn {i['turn_id']} interaction {i['request_id']}"
        ended, status = i["resolved_at_ms"], i["status"]
        problem = None
        if status == "pending":
            if i["phase"] != "active":
                problem = "pending on a settled Turn"
            elif i["answered"] or ended is not None:
                problem = "pending with an answer or an end time"
        elif status == "resolved":
            if not i["answered"] or ended is None:
                problem = "resolved without its answer or end time"
            elif ended < i["created_at_ms"]:
                problem = "resolved before it was opened"
        elif i["answered"] or ended is None or i["phase"] != "settled":
            problem = "superseded with an answer, without an end time, or on an active Turn"
        if problem is not None:
            ctx.fail(Law.INTERACTION_STATE, f"{where}: {problem}")


def _shadow_refs(home: Path, cwd: str, cache: dict[str, dict[str, str]]) -> dict[str, str]:
    """`refs/agenthost/...` → object of the shadow repository of `cwd` (read with git)."""
    if cwd not in cache:
        repo = ShadowStore(home / "checkpoints").repo_dir(Path(cwd))
        refs: dict[str, str] = {}
        if (repo / "HEAD").is_file():
            out = subprocess.run(
                ["git", "for-each-ref", "--format=%(objectname) %(refname)"],
                env={"GIT_DIR": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)},
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            for line in out.splitlines():
                obj, _, ref = line.partition(" ")
                refs[ref] = obj
        cache[cwd] = refs
    return cache[cwd]


def _check_checkpoints(ctx: _Ctx, conn: apsw.Connection) -> list[tuple[str, str, str, str]]:
    """Every settled Turn of a live Session with a checkpoint record: `after` named (or the
    record `unavailable`), each named tree kept by a ref: its Session's ref of that tree
    (`<session>/+<commit>`), or the Turn's own (`<session>/<turn>/<which>`, as stores
    written before kept them) — and the tree itself in the store (a ref git wrote as a file
    names an object whether or not it is there, and `git gc --prune=now` keeps only what
    some ref or the shadow index names). The refs are read after the store
    was copied (a capture keeps its ref before the settlement is written); returns the
    (workspace, session, turn, detail) of each miss, for the caller to recheck against
    deletes and size-cap drops (recorded before the refs go) that happened since the copy."""
    cache: dict[str, dict[str, str]] = {}
    misses: list[tuple[str, str, str, str]] = []
    # Per folder: the trees a ref was found keeping, with who names them (their objects
    # are looked for after, one `git cat-file` a folder).
    kept: dict[str, list[tuple[str, str, str, str, str]]] = {}
    for t in _rows(
        conn,
        "SELECT t.workspace_id, t.session_id, t.turn_id, t.checkpoint_json FROM turns t"
        " JOIN sessions s USING (workspace_id, session_id)"
        " WHERE t.phase = 'settled' AND s.deleted = 0 AND t.checkpoint_json IS NOT NULL",
    ):
        where = f"session {t['session_id']} turn {t['turn_id']}"
        record = json.loads(t["checkpoint_json"])
        if record.get("state") == "unavailable":
            continue
        if not record.get("after"):
            ctx.fail(Law.CHECKPOINT_KEPT, f"{where}: settled with no after-checkpoint")
            continue
        refs = _shadow_refs(ctx.home, str(record["cwd"]), cache)
        for which in ("before", "after"):
            tree = record.get(which)
            if not tree:
                continue
            ref = "refs/agenthost/" + commit_ref(t["session_id"], str(tree))
            own = "refs/agenthost/" + checkpoint_ref(t["session_id"], t["turn_id"], which)
            if refs.get(ref) != tree and refs.get(own) != tree:
                misses.append(
                    (
                        t["workspace_id"],
                        t["session_id"],
                        t["turn_id"],
                        f"{where}: {which} checkpoint {tree} is not kept by {ref}",
                    )
                )
            else:
                kept.setdefault(str(record["cwd"]), []).append(
                    (t["workspace_id"], t["session_id"], t["turn_id"], which, str(tree))
                )
    for cwd, named in kept.items():
        absent = _absent_trees(ctx.home, cwd, {tree for *_, tree in named})
        for ws, sid, turn_id, which, tree in named:
            if tree in absent:
                detail = f"session {sid} turn {turn_id}: {which} checkpoint {tree} has a ref"
                misses.append((ws, sid, turn_id, detail + " but no tree in the store"))
    return misses


def _absent_trees(home: Path, cwd: str, trees: set[str]) -> set[str]:
    """Which of `trees` the shadow repository of `cwd` holds no tree object of (one
    `git cat-file --batch-check` for them all)."""
    repo = ShadowStore(home / "checkpoints").repo_dir(Path(cwd))
    order = sorted(trees)
    out = subprocess.run(
        ["git", "cat-file", "--batch-check=%(objecttype)"],
        env={"GIT_DIR": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)},
        input="".join(f"{tree}\n" for tree in order),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    if len(out) != len(order):
        return set(order)
    return {tree for tree, kind in zip(order, out, strict=True) if kind != "tree"}


def _check_checkpoint_changes(ctx: _Ctx, conn: apsw.Connection) -> None:
    """Every settled Turn of a live Session whose record names both trees lists as
    `changedFiles` exactly what git's `diff-tree` of its `before` and `after` says (nothing
    when the two are one tree). A pair whose trees the store no longer holds (a Session
    deleted and collected since the copy) is left to `checkpoint_kept`."""
    diffs: dict[tuple[str, str, str], set[tuple[str, str]] | None] = {}
    kinds = {"A": "added", "M": "modified", "D": "deleted"}
    for t in _rows(
        conn,
        "SELECT t.session_id, t.turn_id, t.checkpoint_json FROM turns t"
        " JOIN sessions s USING (workspace_id, session_id)"
        " WHERE t.phase = 'settled' AND s.deleted = 0 AND t.checkpoint_json IS NOT NULL",
    ):
        record = json.loads(t["checkpoint_json"])
        before, after = record.get("before"), record.get("after")
        if record.get("state") == "unavailable" or not before or not after:
            continue
        listed = {(str(c["path"]), str(c["kind"])) for c in record.get("changedFiles") or []}
        key = (str(record["cwd"]), str(before), str(after))
        if key not in diffs:
            if before == after:
                diffs[key] = set()
            else:
                repo = ShadowStore(ctx.home / "checkpoints").repo_dir(Path(key[0]))
                done = subprocess.run(
                    [
                        "git",
                        "diff-tree",
                        "-r",
                        "-z",
                        "--no-renames",
                        "--name-status",
                        before,
                        after,
                    ],
                    env={"GIT_DIR": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)},
                    capture_output=True,
                    check=False,
                )
                parts = [os.fsdecode(p) for p in done.stdout.split(b"\0") if p]
                diffs[key] = (
                    {
                        (path, kinds.get(status[:1], "modified"))
                        for status, path in zip(parts[::2], parts[1::2], strict=False)
                    }
                    if done.returncode == 0
                    else None
                )
        want = diffs[key]
        if want is not None and listed != want:
            ctx.fail(
                Law.CHECKPOINT_CHANGES,
                f"session {t['session_id']} turn {t['turn_id']}: changedFiles"
                f" {sorted(listed)} is not the diff of its before and after {sorted(want)}",
            )


def _undo_owner(ref: str) -> str | None:
    """The Session segment of a restore's undo ref (`refs/agenthost/<session>/restore-<ns>/before`,
    `checkpoint_ref`), None for any other ref."""
    parts = ref.split("/")
    if len(parts) == 5 and parts[3].startswith("restore-") and parts[4] == "before":
        return parts[2]
    return None


def _ref_now(home: Path, cwd: str, ref: str) -> str | None:
    """What `ref` names in `cwd`'s shadow repository now (no cache), None when it is gone."""
    repo = ShadowStore(home / "checkpoints").repo_dir(Path(cwd))
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(objectname)", ref],
        env={"GIT_DIR": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)},
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return out[0] if out else None


def _live_folders(conn: apsw.Connection) -> tuple[dict[str, str], set[str]]:
    """The live Sessions (ref segment → id) and every folder they work in: their `cwd`s and
    those their Turns' checkpoint records name."""
    live = _rows(conn, "SELECT session_id, cwd FROM sessions WHERE deleted = 0")
    folders = {str(r["cwd"]) for r in live if r["cwd"]}
    for r in _rows(
        conn,
        "SELECT DISTINCT json_extract(t.checkpoint_json, '$.cwd') AS cwd FROM turns t"
        " JOIN sessions s USING (workspace_id, session_id)"
        " WHERE s.deleted = 0 AND t.checkpoint_json IS NOT NULL",
    ):
        if r["cwd"]:
            folders.add(str(r["cwd"]))
    return {ref_segment(str(r["session_id"])): str(r["session_id"]) for r in live}, folders


def _check_restore_undos(ctx: _Ctx, conn: apsw.Connection) -> None:
    """Every restore's undo ref of a live Session names a tree its shadow store holds (read
    after the store was copied; a ref dropped since — its Session deleted — is no miss)."""
    owners, folders = _live_folders(conn)
    cache: dict[str, dict[str, str]] = {}
    for cwd in sorted(folders):
        undos = {
            ref: tree
            for ref, tree in _shadow_refs(ctx.home, cwd, cache).items()
            if _undo_owner(ref) in owners
        }
        if not undos:
            continue
        absent = _absent_trees(ctx.home, cwd, set(undos.values()))
        for ref, tree in sorted(undos.items()):
            if tree in absent and _ref_now(ctx.home, cwd, ref) == tree:
                ctx.fail(
                    Law.RESTORE_UNDO_KEPT,
                    f"{cwd}: {ref} names {tree}, a tree the shadow store does not hold",
                )


@dataclass(frozen=True, slots=True)
class WorkspaceAnswer:
    """What a client was answered by `workspace.restore` (`tree_from`: its `undo.tree`,
    `tree_to`: `restored`, `asked`: the tree it was asked to restore) or by
    `session.workspaceDiff` (`from` → `to`; `asked` None)."""

    method: str
    session: str
    cwd: str
    tree_from: str
    tree_to: str
    changed: frozenset[tuple[str, str]]
    asked: str | None = None


def workspace_answer(
    method: str, session: str, body: Mapping[str, Any], asked: str | None = None
) -> WorkspaceAnswer:
    """A `workspace.restore` / `session.workspaceDiff` answer body as `check_workspace_answers`
    reads it."""
    restore = method == "workspace.restore"
    return WorkspaceAnswer(
        method,
        session,
        str(body["cwd"]),
        str(body["undo"]["tree"] if restore else body["from"]),
        str(body["restored"] if restore else body["to"]),
        frozenset((str(c["path"]), str(c["kind"])) for c in body["changedFiles"]),
        asked,
    )


def check_workspace_answers(
    home: Path, answers: Iterable[WorkspaceAnswer], *, diffed: set[WorkspaceAnswer] | None = None
) -> list[Violation]:
    """`restore_undo_kept` and `workspace_answer` over answers a soak's clients were given:
    each restore's undo of a Session live now is named by one of that Session's
    `restore-*/before` refs; each answer's `changedFiles` is the diff of its two trees while
    the store holds both (a deleted Session's may be collected). `diffed`: answers whose
    changes an earlier call compared (added to; each is compared once)."""
    ctx = _Ctx(home)
    answers = list(answers)
    tmp = Path(tempfile.mkdtemp(prefix="answers-"))
    try:
        snapshot_store(home / "store.sqlite3", tmp / "store.sqlite3")
        conn = apsw.Connection(str(tmp / "store.sqlite3"))
        try:
            owners, _ = _live_folders(conn)
        finally:
            conn.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    live = set(owners.values())
    cache: dict[str, dict[str, str]] = {}
    for a in answers:
        if a.asked is not None and a.tree_to != a.asked:
            ctx.fail(
                Law.WORKSPACE_ANSWER,
                f"session {a.session}: {a.method} asked for {a.asked} restored {a.tree_to}",
            )
        if a.method != "workspace.restore" or a.session not in live:
            continue
        seg = ref_segment(a.session)
        refs = _shadow_refs(home, a.cwd, cache)
        if not any(_undo_owner(r) == seg and t == a.tree_from for r, t in refs.items()):
            ctx.fail(
                Law.RESTORE_UNDO_KEPT,
                f"session {a.session}: the undo {a.tree_from} a restore of {a.cwd} answered"
                " is kept by no restore-*/before ref of the Session",
            )
    by_cwd: dict[str, list[WorkspaceAnswer]] = defaultdict(list)
    for a in answers:
        if diffed is None or a not in diffed:
            by_cwd[a.cwd].append(a)
    for cwd, some in sorted(by_cwd.items()):
        absent = _absent_trees(home, cwd, {t for a in some for t in (a.tree_from, a.tree_to)})
        diffs: dict[tuple[str, str], set[tuple[str, str]] | None] = {}
        for a in some:
            if a.tree_from in absent or a.tree_to in absent:
                continue
            key = (a.tree_from, a.tree_to)
            if key not in diffs:
                diffs[key] = _tree_diff(home, cwd, *key)
            want = diffs[key]
            if diffed is not None:
                diffed.add(a)
            if want is not None and set(a.changed) != want:
                ctx.fail(
                    Law.WORKSPACE_ANSWER,
                    f"session {a.session}: {a.method} of {cwd} listed {sorted(a.changed)},"
                    f" not the diff of {a.tree_from} and {a.tree_to} {sorted(want)}",
                )
    return ctx.violations


def _tree_diff(home: Path, cwd: str, before: str, after: str) -> set[tuple[str, str]] | None:
    """git's `diff-tree` of two trees of `cwd`'s shadow store as (path, kind); None when git
    cannot read them."""
    if before == after:
        return set()
    repo = ShadowStore(home / "checkpoints").repo_dir(Path(cwd))
    done = subprocess.run(
        ["git", "diff-tree", "-r", "-z", "--no-renames", "--name-status", before, after],
        env={"GIT_DIR": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)},
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        return None
    kinds = {"A": "added", "M": "modified", "D": "deleted"}
    parts = [os.fsdecode(p) for p in done.stdout.split(b"\0") if p]
    return {
        (path, kinds.get(status[:1], "modified"))
        for status, path in zip(parts[::2], parts[1::2], strict=False)
    }


def _check_liveness(ctx: _Ctx, conn: apsw.Connection, grace_ms: int) -> None:
    """On a live daemon with nothing in flight: no Turn stays active with nothing written for
    it (and no interaction waiting on the user), no active operation stays unmoved."""
    now = int(conn.execute("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)").fetchone()[0])
    for t in _rows(
        conn,
        "SELECT t.session_id, t.turn_id, MAX(t.created_at_ms, COALESCE(MAX(m.created_at_ms), 0))"
        " AS last_ms FROM turns t JOIN session_keys k USING (workspace_id, session_id)"
        " LEFT JOIN messages m ON m.session_key = k.session_key AND m.turn_id = t.turn_id"
        " WHERE t.phase = 'active' AND NOT EXISTS (SELECT 1 FROM interactions i"
        " WHERE i.workspace_id = t.workspace_id AND i.session_id = t.session_id"
        " AND i.turn_id = t.turn_id AND i.status = 'pending')"
        " GROUP BY t.workspace_id, t.session_id, t.turn_id",
    ):
        if now - int(t["last_ms"]) > grace_ms:
            ctx.fail(
                Law.ACTIVE_TURN_WORKED,
                f"session {t['session_id']} turn {t['turn_id']}: active, nothing written for "
                f"{(now - int(t['last_ms'])) / 1000:.1f} s",
            )
    for o in _rows(
        conn,
        "SELECT operation_id, source_session_id, status, MAX(created_at_ms,"
        " COALESCE(dispatched_at_ms, 0), COALESCE(accepted_at_ms, 0)) AS last_ms"
        " FROM fork_operations WHERE status IN ('prepared', 'dispatching', 'provider_accepted')",
    ):
        if now - int(o["last_ms"]) > grace_ms:
            ctx.fail(
                Law.FENCE_HAS_SAGA,
                f"operation {o['operation_id']} ({o['status']}) fences source "
                f"{o['source_session_id']} with no progress for "
                f"{(now - int(o['last_ms'])) / 1000:.1f} s",
            )


DELETE_STOP_S = 10.0
"""How long a delete waits for its Session's runtime to stop before it removes the Session's
runtime folder anyway (`SessionControls._discard_runtime`)."""
DELETE_START_S = 120.0
"""How long a runtime start a delete did not wait for may take (`session_start_s`'s default)
before the folder it works in goes."""
DELETE_END_S = 2.0
"""How long a delete whose stop went unanswered may take to kill what still runs in the folder
before it removes it (`actors.runtime_dirs.END_WAIT_S`)."""
DELETE_CALLS_S = Timeouts().fork_s
"""How long a removal may wait for the worker calls in flight when it is asked for (the
Session's runtime stopped, within `DELETE_STOP_S` of the delete) that may start an
app-server in the folder (a `fork.resolve`'s reads, actors/home_uses.py): each is answered or
given up within the host's bound for it, `fork_s` (240 s by default)."""


def homes_waiting(status: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The deleted Sessions `(workspace id, session id)` whose runtime folder's removal a live
    daemon's `host.status` → `homeRemovals` lists as waiting for a worker call in flight (what
    `check_invariants(waiting_homes=…)` takes)."""
    return [
        (str(r["workspaceId"]), str(r["agentSessionId"]))
        for r in status.get("homeRemovals") or []
        if r.get("calls")
    ]


def _check_deleted_homes(
    ctx: _Ctx, conn: apsw.Connection, grace_ms: int, waiting: Collection[tuple[str, str]] = ()
) -> None:
    """`deleted_home_gone`, on a live daemon: no runtime folder of a Session deleted longer
    ago than the grace and its delete's bound, and no process working in it (its environment
    names a path there). A Session with a Turn settled `interrupted` and unbound (its start
    may have been in progress at the delete) is given the start's bound; one whose removal
    the daemon lists as waiting for a call in flight (`waiting`), the stop's and that call's;
    a delete is final, so what the copy shows deleted is deleted on disk's side too."""
    waiting = set(waiting)
    now = int(conn.execute("SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)").fetchone()[0])
    working: dict[int, list[str]] | None = None
    for s in _rows(
        conn,
        "SELECT s.workspace_id, s.session_id, s.updated_at_ms, EXISTS (SELECT 1 FROM turns t"
        " WHERE t.workspace_id = s.workspace_id AND t.session_id = s.session_id"
        " AND t.outcome = 'interrupted' AND t.root_provider_turn_id IS NULL) AS start_cut"
        " FROM sessions s WHERE s.deleted = 1",
    ):
        bound_s = DELETE_START_S if s["start_cut"] else DELETE_STOP_S + DELETE_END_S
        if (s["workspace_id"], s["session_id"]) in waiting:
            bound_s = max(bound_s, DELETE_STOP_S + DELETE_CALLS_S)
        age_ms = now - int(s["updated_at_ms"])
        if age_ms <= grace_ms + bound_s * 1000:
            continue
        folder = ctx.home / "runtimes" / _path_segment(s["workspace_id"]) / s["session_id"]
        if os.path.lexists(folder):
            held = sorted(
                str(p.relative_to(folder)) for p in itertools.islice(folder.rglob("*"), 8)
            )
            ctx.fail(
                Law.DELETED_HOME_GONE,
                f"session {s['session_id']} deleted {age_ms / 1000:.1f} s ago: its runtime "
                f"folder {folder} is still there, holding {held}",
            )
        if working is None:
            working = _runtime_env_paths(ctx.home / "runtimes")
        inside = f"{folder}/"
        for pid, paths in sorted(working.items()):
            named = [p for p in paths if p == str(folder) or p.startswith(inside)]
            if named:
                ctx.fail(
                    Law.DELETED_HOME_GONE,
                    f"session {s['session_id']} deleted {age_ms / 1000:.1f} s ago: process "
                    f"{pid} still works in its runtime folder (its environment names {named[0]})",
                )


RUNTIME_MARK = b"AGENTHOST_RUNTIME="  # drivers/runtime_marker.py `RUNTIME_VAR`
WORKER_MARK = b"AGENTHOST_WORKER_PARENT_PID="  # drivers/worker_env.py `ENV_PARENT_PID`: a worker's
STOPPED_LEFT_WAIT_S = 3.0
"""How long a process of a stopped runtime may be seen before it is reported: a stop's own
end of what it left (`END_LEFT_WAIT_S`, 2 s) in progress (an idle stop at any time), and a
moment more."""


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def _runtime_markers() -> dict[int, tuple[bytes, list[bytes]]]:
    """This user's live processes (not this one) carrying a runtime's marker: their marker
    item (`AGENTHOST_RUNTIME=<id>`) and environment by pid (one `/proc` pass,
    `environs_holding`)."""
    out: dict[int, tuple[bytes, list[bytes]]] = {}
    for pid, items in environs_holding(RUNTIME_MARK).items():
        marker = next((i for i in items if i.startswith(RUNTIME_MARK)), None)
        if marker is not None:
            out[pid] = (marker, items)
    return out


def _running_markers(
    tree: Mapping[int, tuple[int, bytes]],
    marked: Mapping[int, tuple[bytes, list[bytes]]],
    daemon_pid: int | None = None,
) -> set[bytes]:
    """The markers of `marked` whose runtime runs: a process carrying it is a child of a live
    worker (a process whose environment has `WORKER_MARK`: the provider process the worker
    started with it, an app-server or a Claude CLI) — with `daemon_pid`, a worker that is a
    child of that daemon. `tree` is `_proc_tree`'s, taken after `marked` was."""
    workers: dict[int, bool] = {}

    def is_worker(pid: int) -> bool:
        if pid not in workers:
            parent, state = tree.get(pid, (0, b"X"))
            workers[pid] = (
                state not in (b"Z", b"X")
                and (daemon_pid is None or parent == daemon_pid)
                and any(i.startswith(WORKER_MARK) for i in _environ(pid))
            )
        return workers[pid]

    return {m for pid, (m, _) in marked.items() if is_worker(tree.get(pid, (0, b"X"))[0])}


def live_runtime_processes(daemon_pid: int | None) -> set[int]:
    """The processes carrying the marker of a runtime that runs under the live daemon
    `daemon_pid` (`_running_markers`): its provider process and whatever that started, a
    tool's process that left its tree and group (`setsid … &`) included — its runtime's stop
    ends it (`stopped_runtime_left`). None without a daemon."""
    if daemon_pid is None:
        return set()
    marked = _runtime_markers()
    running = _running_markers(_proc_tree(), marked, daemon_pid)
    return {pid for pid, (m, _) in marked.items() if m in running}


def stopped_runtimes_left(runtimes: Path) -> dict[int, str]:
    """The processes working under `runtimes` (a path there in their environment) that carry a
    runtime's marker no live runtime holds — no process carrying it is a child of a live
    worker (a process whose environment has `WORKER_MARK`) — by pid: their markers."""
    mark = os.fsencode(str(runtimes)) + b"/"
    marked = _runtime_markers()
    tree = _proc_tree()  # after the scan: every process it found is in it, unless gone since
    running = _running_markers(tree, marked)
    return {
        pid: m.partition(b"=")[2].decode()
        for pid, (m, items) in marked.items()
        if m not in running and any(i.partition(b"=")[2].startswith(mark) for i in items)
    }


def _check_stopped_runtimes(ctx: _Ctx, runtimes: Path) -> None:
    """`stopped_runtime_left`, on a live daemon: no process of a runtime no longer running
    (`stopped_runtimes_left`) still seen after `STOPPED_LEFT_WAIT_S` (polled: a stop ending
    what its runtime left meanwhile is not reported)."""
    left = stopped_runtimes_left(runtimes)
    deadline = time.monotonic() + STOPPED_LEFT_WAIT_S
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        now = stopped_runtimes_left(runtimes)
        left = {pid: m for pid, m in now.items() if left.get(pid) == m}
    for pid, marker in sorted(left.items()):
        ctx.fail(
            Law.STOPPED_RUNTIME_LEFT,
            f"process {pid} of runtime {marker} runs on under {runtimes} with no process of its "
            "runtime left under a live worker (its runtime stopped, or its worker died)",
        )


def _runtime_env_paths(runtimes: Path) -> dict[int, list[str]]:
    """This user's live processes (not this one) whose environment names a path under
    `runtimes`: those paths, by pid (`domain.procfs.environs_holding`)."""
    mark = os.fsencode(str(runtimes)) + b"/"
    out: dict[int, list[str]] = {}
    for pid, items in environs_holding(mark).items():
        paths = [
            os.fsdecode(value)
            for value in (item.partition(b"=")[2] for item in items)
            if value.startswith(mark)
        ]
        if paths:
            out[pid] = paths
    return out


def _branches_of(repo: str, short: str) -> list[str]:
    import subprocess

    done = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname:short)", "refs/heads/agenthost/"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
    )
    return [b for b in done.stdout.split() if b.endswith(f"-{short}")]


def _worktrees_of(repo: str, short: str) -> list[str]:
    import subprocess

    done = subprocess.run(
        ["git", "worktree", "list", "--porcelain"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
    )
    paths = [line[9:] for line in done.stdout.splitlines() if line.startswith("worktree ")]
    return [p for p in paths if Path(p).name == short]


def _tip(repo: str, branch: str) -> str:
    import subprocess

    done = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
    )
    return done.stdout.strip()


WORKTREE_GRACE_MS = 10_000
"""How long a live daemon may take to remove a failed fork's tree after marking it failed (the
saga removes it right after; a check may land between the two)."""


def worktree_retrying(status: Mapping[str, Any]) -> list[str]:
    """The trees a live daemon's `host.status` lists as still being removed because git could
    not remove them or a Session works in them (what `check_invariants(retrying_trees=…)`
    takes)."""
    removals = status.get("worktreeRemovals") or {}
    return [
        str(t["path"])
        for t in removals.get("trees", [])
        if t.get("reason") in ("git_failed", "in_use")
    ]


def _check_worktrees(
    ctx: _Ctx,
    ops: list[dict[str, Any]],
    now_ms: int,
    sessions: list[dict[str, Any]],
    retrying: Collection[str] = (),
) -> None:
    """The worktree laws, read from disk and the repository itself. A `prepared` operation's
    saga may be making its tree right now (half-made, or whole and not yet recorded): allowed;
    if its daemon is dead, start-up recovery fails the operation and removes the tree. A
    committed fork's tree is `removing`/`removed` only once its child Session is deleted
    (`session.delete {worktree: "remove"}`), and never while another live Session works in it
    (its `cwd` in the tree: a shared-workspace fork of the child, one started there). A failed
    fork's tree is kept past the grace only while the live daemon retries its removal:
    `retrying`, the paths its `host.status` → `worktreeRemovals` lists as `git_failed` or
    `in_use` (git could not remove it, or a Session works in it)."""
    deleted = {(s["workspace_id"], s["session_id"]) for s in sessions if s["deleted"]}
    # Real paths: a Session reaching the tree by a symlink (or a tree recorded through one)
    # works in it all the same.
    live_cwds = [
        (os.path.realpath(str(s["cwd"])), s["session_id"])
        for s in sessions
        if not s["deleted"] and s.get("cwd")
    ]
    for op in ops:
        if op.get("workspace_mode") != "worktree" or not op.get("workspace_json"):
            continue
        plan = json.loads(op["workspace_json"])
        op_id, status, state = op["operation_id"], op["status"], op.get("workspace_state")
        top = Path(plan["path"])
        partial = top.parent / f".partial-{top.name}"
        here = top.is_dir()
        making = status == "prepared"
        settling = status == "failed" and now_ms - int(op["completed_at_ms"] or 0) < (
            WORKTREE_GRACE_MS
        )
        child_deleted = (op["workspace_id"], op["target_session_id"]) in deleted
        # A failed fork's tree the live daemon still retries (git could not remove it, or a
        # Session works in it): kept, whole or half-made, until a round removes it.
        kept = status == "failed" and str(top) in retrying and state in ("planned", "made")
        if state in ("removing", "removed") and status == "committed" and not child_deleted:
            ctx.fail(Law.WORKTREE, f"{op_id}: its tree is {state} but its child lives")
        if state in ("removing", "removed"):
            real = os.path.realpath(top)
            for cwd, user in live_cwds:
                if cwd == real or cwd.startswith(real + os.sep):
                    ctx.fail(Law.WORKTREE, f"{op_id}: its tree is {state} but {user} works in it")
        elif (
            status in DISPATCHED
            and state != "made"
            and not (status == "committed" and child_deleted)
        ):
            ctx.fail(Law.WORKTREE, f"{op_id} ({status}) was dispatched with its tree {state}")
        if partial.exists() and not making and not settling and not kept:
            ctx.fail(Law.WORKTREE, f"{op_id} ({status}) left a half-made tree {partial}")
        if status == "failed" and not settling and not kept and (here or state != "removed"):
            ctx.fail(Law.WORKTREE, f"failed {op_id} kept its tree {top} (state {state})")
        if state == "made" and status != "failed" and not here:
            ctx.fail(Law.WORKTREE, f"{op_id} ({status}) recorded a tree that is gone: {top}")
        # `removing`: its child's delete is removing it (a live daemon right now, a stopped
        # one at its next start): present or gone, both are true states.
        if here and state not in ("made", "removing") and not making and not settling and not kept:
            ctx.fail(Law.WORKTREE, f"{op_id} ({status}) has a tree it does not record ({state})")
        if here and state == "made" and not Path(plan["childCwd"]).is_dir():
            ctx.fail(Law.WORKTREE, f"{op_id}: tree {top} lacks the child's cwd")
        repo = plan.get("repoRoot")
        if repo and plan.get("headCommit") and Path(repo).is_dir():
            branches, registered = _branches_of(repo, top.name), _worktrees_of(repo, top.name)
            if len(branches) > 1 or len(registered) > 1:
                ctx.fail(Law.WORKTREE, f"{op_id}: two trees or two branches in {repo}")
            # Removed means removed from the repository too: no worktree of it still listed
            # (a `worktree add` killed mid-checkout leaves one locked, which `prune` keeps),
            # no branch of it left at the commit it was made from (it has none of its own).
            if status == "failed" and state == "removed" and not settling:
                at_head = [b for b in branches if _tip(repo, b) == plan["headCommit"]]
                for left in registered + at_head:
                    ctx.fail(Law.WORKTREE, f"failed {op_id} left {left} in {repo}")
            # A failed fork's tree is being removed (by its saga, a start or the live daemon's
            # retries): one git removed part of (its `.git` file first) is no worktree now.
            if here and state == "made" and status != "failed" and not (top / ".git").is_file():
                ctx.fail(Law.WORKTREE, f"{op_id}: {top} is not a worktree of {repo}")


# -- the person's repository (law 10) and what a subscriber heard ----------------------------

_GIT_READ_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_OPTIONAL_LOCKS": "0",  # a read never refreshes (writes) the index
    "PATH": os.environ.get("PATH", os.defpath),
}
FORK_BRANCHES = "refs/heads/agenthost/"
"""Where a worktree fork's branch lives (docs/design/workspace.md): the one ref it may add."""


def _git_read(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", *args],
        cwd=repo,
        env=_GIT_READ_ENV | {"HOME": str(repo)},
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() if out.returncode == 0 else f"(git {args[0]} failed)"


def repository_state(repo: Path) -> dict[str, str]:
    """What of the person's repository at `repo` nothing of the host may change (law 10): HEAD,
    the commit it names, the index's bytes, every ref but worktree forks' branches, the config
    and the stash. Read without taking git's optional locks. The working tree is not in it:
    the Turns themselves write files there."""
    gitdir = repo / ".git"
    refs = [
        line
        for line in _git_read(repo, "for-each-ref", "--format=%(refname) %(objectname)").split("\n")
        if not line.startswith(FORK_BRANCHES)
    ]
    index = gitdir / "index"
    return {
        "HEAD": (gitdir / "HEAD").read_text(),
        "head_commit": _git_read(repo, "rev-parse", "HEAD"),
        "index": hashlib.sha256(index.read_bytes()).hexdigest() if index.exists() else "",
        "refs": "\n".join(refs),
        "config": (gitdir / "config").read_text(),
        "stash": _git_read(repo, "stash", "list"),
    }


def _check_repository(ctx: _Ctx, repo: Path, before: Mapping[str, str]) -> None:
    now = repository_state(repo)
    for key, was in before.items():
        if now.get(key) != was:
            ctx.fail(Law.REPOSITORY_KEPT, f"{repo}: its {key} changed: {was!r} -> {now.get(key)!r}")


_FORK_STATE_RANK: Mapping[tuple[str, str | None], int] = {
    ("accepted", "frozen"): 0,
    ("accepted", "dispatching"): 1,
    ("accepted", "materializing"): 2,
}
"""The order of an operation's public states on the way to its end (any end ranks 3; an
adopting `fork.resolve`, which goes back to `materializing`, is not in what this reads)."""


def _rank(op: Mapping[str, Any]) -> int:
    return _FORK_STATE_RANK.get((str(op.get("status")), op.get("phase")), 3)


def check_fork_events(
    heard: Sequence[Mapping[str, Any]], ends: Mapping[str, Mapping[str, Any]]
) -> list[Violation]:
    """The fork-event law over what a subscriber connected all along heard (`heard`: its
    events in arrival order) for the operations `ends` names (operation id → the operation as
    `fork.get` answers at the end, none resolved meanwhile): each operation heard, its states
    in order, its last one heard the end's status and, field for field, the end itself (a
    carried row published stale or not the committed one), a committed one's child
    announced."""
    states: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    upserted: set[str] = set()
    for event in heard:
        if event.get("type") == "fork.operation":
            states[str(event["operation"]["operationId"])].append(event["operation"])
        elif event.get("type") == "session.upserted":
            upserted.add(str(event["session"]["agentSessionId"]))
    out: list[Violation] = []
    for op_id, end in ends.items():
        seen = states.get(op_id, [])
        if not seen:
            out.append(Violation(Law.FORK_EVENTS_HEARD, f"{op_id} ({end['status']}): never heard"))
            continue
        ranks = [_rank(op) for op in seen]
        if ranks != sorted(ranks):
            path = " → ".join(f"{op['status']}/{op.get('phase')}" for op in seen)
            out.append(Violation(Law.FORK_EVENTS_HEARD, f"{op_id}: heard out of order: {path}"))
        # None resolved meanwhile: an operation reaches one end, so two ends heard (a `failed`
        # then `committed`: every end ranks alike) is an end published that it never reached.
        if len(reached := list(dict.fromkeys(op["status"] for op in seen if _rank(op) == 3))) > 1:
            out.append(
                Violation(Law.FORK_EVENTS_HEARD, f"{op_id}: heard two ends: {' → '.join(reached)}")
            )
        if seen[-1]["status"] != end["status"]:
            out.append(
                Violation(
                    Law.FORK_EVENTS_HEARD,
                    f"{op_id}: last heard {seen[-1]['status']}, ended {end['status']}",
                )
            )
        elif differ := sorted(k for k in end if seen[-1].get(k) != end[k]):
            # The operation's events carry the row their write committed (design/store.md, "A
            # fork operation's changes carry their operation"): the last one heard is the
            # operation as `fork.get` answers at the end, field for field.
            out.append(
                Violation(
                    Law.FORK_EVENTS_HEARD,
                    f"{op_id}: last heard differs from the end in {', '.join(differ)}",
                )
            )
        if end["status"] == "committed" and end["targetAgentSessionId"] not in upserted:
            out.append(
                Violation(
                    Law.FORK_EVENTS_HEARD,
                    f"{op_id}: its child {end['targetAgentSessionId']} was never announced",
                )
            )
    return out


def _proc_tree() -> dict[int, tuple[int, bytes]]:
    """pid → (parent pid, state) of every process this user can see, zombies included."""
    out: dict[int, tuple[int, bytes]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            out[int(entry.name)] = (int(fields[1]), fields[0])
    return out


def _names_home(pid: int, home: str) -> bool:
    """Whether `pid`'s environment names `home` (`AGENTHOST_HOME`, a provider home under it)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
    except OSError:
        return False
    want, under = home.encode(), (home.rstrip("/") + "/").encode()
    for item in environ:
        _, _, value = item.partition(b"=")
        if value == want or value.startswith(under):
            return True
    return False


def _worker_provider(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return None
    if b"drivers.worker" not in argv or b"--provider" not in argv:
        return None
    at = argv.index(b"--provider") + 1
    return argv[at].decode(errors="replace") if at < len(argv) else None


def _process_problems(home: Path, daemon_pid: int | None) -> list[Violation]:
    tree = _proc_tree()
    me = os.getpid()
    mine: set[int] = set()
    pid: int | None = me
    while pid and pid in tree and pid not in mine:
        mine.add(pid)  # this process and its ancestors (a test's own environment)
        pid = tree[pid][0]
    daemon_tree: set[int] = set()
    if daemon_pid is not None and daemon_pid in tree:
        daemon_tree.add(daemon_pid)
        grew = True
        while grew:
            grew = False
            for child, (parent, _state) in tree.items():
                if parent in daemon_tree and child not in daemon_tree:
                    daemon_tree.add(child)
                    grew = True
    outside = [
        pid
        for pid, (_parent, state) in sorted(tree.items())
        if pid not in mine
        and pid not in daemon_tree
        and state not in (b"Z", b"X")
        and _names_home(pid, str(home))
    ]
    # A live runtime's tool's process that left its tree (`setsid … &`) is its runtime's:
    # that runtime's stop ends it (`stopped_runtime_left` judges it once the runtime stopped).
    live = live_runtime_processes(daemon_pid) if outside else set()
    out = [
        Violation(
            Law.PROCESS_OWNED,
            f"process {pid} of home {home} runs outside the daemon's tree (daemon {daemon_pid})",
        )
        for pid in outside
        if pid not in live
    ]
    workers: Counter[str] = Counter()
    for pid in daemon_tree:
        if tree[pid][1] in (b"Z", b"X"):
            continue
        provider = _worker_provider(pid)
        if provider is not None:
            workers[provider] += 1
    out += [
        Violation(Law.PROCESS_OWNED, f"{n} live workers of {provider} under daemon {daemon_pid}")
        for provider, n in sorted(workers.items())
        if n > 1
    ]
    return out


def socket_dirs_of(home: Path) -> list[Path]:
    """The directories outside `home` that hold (or held) its workers' sockets: the one named
    for its run dir (`drivers.worker_spawn.fallback_socket_dir`) and any `<tmp>/ahw-*` whose
    marker file names its run dir (a fresh one made when the named one was not safely ours)."""
    run_dirs = {
        os.path.abspath(home / "run" / "workers"),
        os.path.realpath(home / "run" / "workers"),
    }
    named = {fallback_socket_dir(Path(run_dir)) for run_dir in run_dirs}
    found = {d for d in named if d.is_dir()}
    for d in Path(tempfile.gettempdir()).glob(f"{SOCKET_DIR_PREFIX}*"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if (d / SOCKET_DIR_MARKER).read_text() in run_dirs:
                found.add(d)
    return sorted(found)


def check_socket_dirs(home: Path, *, stopped_cleanly: bool = False) -> list[Violation]:
    """`Law.SOCKET_DIR_BOUNDED`: at most one socket directory of `home`'s workers outside it
    (live, stopped or SIGKILLed: a restart takes the killed daemon's again), none once its
    daemon `stopped_cleanly`."""
    dirs = socket_dirs_of(home)
    if len(dirs) > (0 if stopped_cleanly else 1):
        when = "after a clean stop" if stopped_cleanly else "(at most one)"
        names = ", ".join(map(str, dirs))
        return [
            Violation(
                Law.SOCKET_DIR_BOUNDED,
                f"{len(dirs)} worker socket directories of home {home} {when}: {names}",
            )
        ]
    return []


def check_processes(
    home: Path, daemon_pid: int | None, *, grace_s: float = 10.0
) -> list[Violation]:
    """`Law.PROCESS_OWNED` over the processes of `home` (Linux `/proc`): every process whose
    environment names the home is the live daemon `daemon_pid` or runs under it (None: the
    daemon is stopped or killed, and none may run), and the daemon runs at most one worker per
    provider. A process of a daemon killed a moment ago exits by its parent-death signal, an
    instant later: problems are looked for again until none is left or `grace_s` passed."""
    deadline = time.monotonic() + grace_s
    while True:
        problems = _process_problems(home, daemon_pid)
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(0.05)


def _env_home(pid: int) -> str | None:
    """`pid`'s `HOME`, None when unreadable or unset."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
    except OSError:
        return None
    for item in environ:
        key, _, value = item.partition(b"=")
        if key == b"HOME":
            return value.decode(errors="replace")
    return None


def _runtime_process_problems(
    home: Path, daemon_pid: int | None, live: Mapping[str, int]
) -> list[Violation]:
    tree = _proc_tree()
    runtimes = str(home / "runtimes") + "/"
    homes: dict[int, tuple[str, str]] = {}  # pid -> (its runtime's HOME, provider)
    for pid, (_parent, state) in tree.items():
        if state in (b"Z", b"X"):
            continue
        h = _env_home(pid)
        if h is None or not h.startswith(runtimes) or not h.endswith("/.home"):
            continue
        provider = PROVIDER_OF_HOME.get(Path(h).parent.name)
        if provider in ("codex", "tutti-agent"):
            homes[pid] = (h, provider)
    leaders: dict[str, int] = {}  # a runtime's HOME -> its app-server's pid
    for pid, (h, provider) in homes.items():
        parent = tree[pid][0]
        worker = _worker_provider(parent) if parent in tree else None
        if worker != provider or daemon_pid is None or tree[parent][0] != daemon_pid:
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                leaders[h] = pid
    out: list[Violation] = []
    kept: set[int] | None = None  # a live runtime's processes by its marker, looked up once
    for pid, (h, _provider) in sorted(homes.items()):
        leader = leaders.get(h)
        if leader == pid:
            continue
        owned = False
        if leader is not None:
            with contextlib.suppress(OSError):
                owned = os.getpgid(pid) == leader
            up: int | None = tree[pid][0]
            seen: set[int] = set()
            while not owned and up and up in tree and up not in seen:
                seen.add(up)
                owned = up == leader
                up = tree[up][0]
        if not owned:
            # A live runtime's tool's process that left the server's tree and group
            # (`setsid … &`): its runtime's stop ends it (`stopped_runtime_left`).
            kept = live_runtime_processes(daemon_pid) if kept is None else kept
            owned = pid in kept
        if not owned:
            out.append(
                Violation(
                    Law.RUNTIME_PROCESSES_ENDED,
                    f"process {pid} of the runtime home {h} lives without its app-server",
                )
            )
    runtimes_alive = Counter(provider for _h, provider in set(homes.values()))
    out += [
        Violation(
            Law.RUNTIME_PROCESSES_ENDED,
            f"processes of {n} {provider} runtimes live, the daemon holds"
            f" {live.get(provider, 0)} live",
        )
        for provider, n in sorted(runtimes_alive.items())
        if n > live.get(provider, 0)
    ]
    return out


def check_runtime_processes(
    home: Path,
    daemon_pid: int | None,
    live: Callable[[], Mapping[str, int]],
    *,
    grace_s: float = 10.0,
) -> list[Violation]:
    """`Law.RUNTIME_PROCESSES_ENDED` over the processes of `home`'s app-server runtimes
    (Linux `/proc`), on a live daemon `daemon_pid` whose live runtimes per provider `live`
    answers (`host.status` `runtimes`; asked again on each look). A runtime evicted a moment
    ago is stopped on a lane of its own, an instant later: looked for again until none is
    left or `grace_s` passed."""
    deadline = time.monotonic() + grace_s
    while True:
        problems = _runtime_process_problems(home, daemon_pid, live())
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(0.05)


def check_daemon_runtimes(home: Path, daemon_pid: int, client: Any) -> list[Violation]:
    """`check_runtime_processes` over a live daemon whose `host.status` `client` asks. A daemon
    killed meanwhile (a soak's armed point firing late) answers nothing: no runtime of it is
    live, and `check_processes` judges what it left."""
    try:
        return check_runtime_processes(
            home, daemon_pid, lambda: live_runtimes(client.call("host.status"))
        )
    except (ClientTimeout, ClientClosed):
        state = _proc_tree().get(daemon_pid)
        if state is not None and state[1] not in (b"Z", b"X"):
            raise
        return []


def live_runtimes(status: Mapping[str, Any]) -> dict[str, int]:
    """Live runtimes per provider in one `host.status` reply."""
    return {p: int(v.get("live", 0)) for p, v in (status.get("runtimes") or {}).items()}


def _soft_fd_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return 1 << 62 if soft == "unlimited" else int(soft)
    raise ValueError(f"no descriptor limit in /proc/{pid}/limits")


def _accepted_sockets(run_dir: Path, tcp_ports: Iterable[int]) -> dict[int, str]:
    """Inode → address of every connection (not a listener) accepted on an ipc path in
    `run_dir` other than a worker link's, or on one of `tcp_ports` (this network namespace's
    /proc/net tables; an accepted Unix socket shows its listener's path)."""
    found: dict[int, str] = {}
    prefix = str(run_dir) + "/"
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or int(cols[3], 16) & 0x10000:  # no path, or listening
            continue
        path = cols[7]
        if path.startswith(prefix) and not os.path.basename(path).startswith("w-"):
            found[int(cols[6])] = path
    ports = set(tcp_ports)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                port = int(cols[1].rsplit(":", 1)[1], 16)
                if port in ports and cols[3] != "0A":  # 0A: LISTEN
                    found[int(cols[9])] = f"tcp port {port}"
    return found


def _reserve_problems(
    pid: int, run_dir: Path, accept_reserve: int, tcp_ports: Iterable[int]
) -> dict[tuple[int, int], str]:
    soft = _soft_fd_limit(pid)
    numbers = [int(n) for n in os.listdir(f"/proc/{pid}/fd")]
    problems: dict[tuple[int, int], str] = {}
    if len(numbers) >= soft:
        problems[(-1, -1)] = f"the daemon holds {len(numbers)} descriptors, its limit {soft}"
    floor = soft - accept_reserve
    high: dict[int, int] = {}
    for fd in numbers:
        if fd < floor:
            continue
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                high[int(link[len("socket:[") : -1])] = fd
    if high:
        accepted = _accepted_sockets(run_dir, tcp_ports)
        for inode, fd in high.items():
            if inode in accepted:
                problems[(fd, inode)] = (
                    f"descriptor {fd} (limit {soft}, reserve {accept_reserve}) holds a"
                    f" connection accepted on {accepted[inode]}"
                )
    return problems


def check_descriptor_reserve(
    pid: int,
    run_dir: Path,
    accept_reserve: int,
    tcp_ports: Iterable[int] = (),
    *,
    again_s: float = 0.05,
) -> list[Violation]:
    """`Law.DESCRIPTOR_RESERVE` over the live daemon `pid` (Linux /proc): what is seen on two
    looks `again_s` apart (the accept shim holds a connection it closes for an instant)."""
    ports = tuple(tcp_ports)
    first = _reserve_problems(pid, run_dir, accept_reserve, ports)
    if not first:
        return []
    time.sleep(again_s)
    second = _reserve_problems(pid, run_dir, accept_reserve, ports)
    return [
        Violation(Law.DESCRIPTOR_RESERVE, detail) for key, detail in second.items() if key in first
    ]


def check_status_bounds(status: Mapping[str, Any]) -> list[Violation]:
    """`Law.STATUS_BOUNDS` over one `host.status` reply of a live `agenthost serve` daemon. A
    reply without the `log` queue's counts or the `runtimes` slots (a key renamed or dropped,
    a count or its bound missing) is a finding: the bound it would have checked goes
    unchecked."""
    out: list[Violation] = []
    log, runtimes = status.get("log"), status.get("runtimes")
    bounded = [("log queue", log, "queued", "capacity")]
    if isinstance(runtimes, Mapping):
        for provider, slots in runtimes.items():
            bounded.append((f"{provider} runtimes", slots, "live", "limit"))
            bounded.append((f"{provider} runtimes", slots, "starting", "startLimit"))
    else:
        out.append(Violation(Law.STATUS_BOUNDS, f"host.status has no runtimes: {runtimes}"))
    for what, part, count, bound in bounded:
        if not isinstance(part, Mapping) or count not in part or bound not in part:
            out.append(Violation(Law.STATUS_BOUNDS, f"{what}: no {count} or {bound} ({part})"))
        elif int(part[count]) > int(part[bound]):
            out.append(
                Violation(
                    Law.STATUS_BOUNDS, f"{what}: {count} {part[count]} > {bound} {part[bound]}"
                )
            )
    return out


def check_event_bounds(largest: Mapping[str, int]) -> list[Violation]:
    """`Law.EVENTS_BOUNDED` over the largest event body heard of each type (`largest`: event
    type -> its msgpack bytes)."""
    return [
        Violation(Law.EVENTS_BOUNDED, f"a {kind} event of {size} bytes, past {MAX_EVENT_BYTES}")
        for kind, size in sorted(largest.items())
        if size > MAX_EVENT_BYTES
    ]


def check_session_events(
    heard: Sequence[Mapping[str, Any]], ends: Mapping[str, Mapping[str, Any]]
) -> list[Violation]:
    """The Session-event law over what a subscriber connected all along heard (`heard`: its
    events in arrival order) for the Sessions `ends` names (Session id → the Session as
    `session.get` answers at the end): titles of the form `<writer>:<n>` heard in each
    writer's order (n never lower than one heard before from that writer), and the last
    `session.upserted` of each the end's row in what a write may change (`_SESSION_ENDS`: a
    Turn's claim and settlement carry only their touch, built on a row the events thread
    holds — one built on the wrong row ends with the wrong title, time or active Turn)."""
    out: list[Violation] = []
    last: dict[str, Mapping[str, Any]] = {}
    high: dict[tuple[str, str], int] = {}
    for event in heard:
        if event.get("type") != "session.upserted":
            continue
        session = event["session"]
        sid = str(session["agentSessionId"])
        if sid not in ends:
            continue
        last[sid] = session
        writer, sep, n_text = str(session.get("title")).rpartition(":")
        if not sep or not n_text.isdigit():
            continue
        key, n = (sid, writer), int(n_text)
        if n < high.get(key, -1):
            out.append(
                Violation(
                    Law.SESSION_EVENTS_HEARD,
                    f"{sid}: heard {writer}:{n} after {writer}:{high[key]} (a stale event)",
                )
            )
        high[key] = max(n, high.get(key, -1))
    for sid, end in ends.items():
        seen = last.get(sid)
        if seen is None:
            out.append(Violation(Law.SESSION_EVENTS_HEARD, f"{sid}: never heard"))
        else:
            for name in _SESSION_ENDS:
                if seen.get(name) != end.get(name):
                    out.append(
                        Violation(
                            Law.SESSION_EVENTS_HEARD,
                            f"{sid}: last heard {name} {seen.get(name)!r}, ended {end.get(name)!r}",
                        )
                    )
    return out


_SESSION_ENDS = (
    "title",
    "pinned",
    "settings",
    "goal",
    "providerSessionId",
    "model",
    "activeTurnId",
    "updatedAtUnixMs",
)
"""What of a Session's last `session.upserted` must equal the Session at the end."""


_COMMITTED_TURN_FIELDS = (
    "sequence",
    "phase",
    "outcome",
    "error",
    "rootProviderTurnId",
    "finalAssistantMessageId",
    "createdAtUnixMs",
    "settledAtUnixMs",
)
"""What a settled Turn's event must show as the store holds it (its binding state and its
checkpoint record may change after the settlement: a late binding, a dropped checkpoint)."""


def _committed(turn: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        *(turn.get(name) for name in _COMMITTED_TURN_FIELDS),
        [(m.get("messageId"), m.get("kind"), m.get("text"), m.get("version"),
          m.get("payload"))
         for m in turn.get("messages") or []],
        [(i.get("requestId"), i.get("status")) for i in turn.get("interactions") or []],
    )  # fmt: skip


def check_turn_events(
    heard: Sequence[Mapping[str, Any]],
    turns: Iterable[str],
    stored: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    streaming: Collection[str] = (),
) -> list[Violation]:
    """The delta law over what a subscriber connected all along heard (`heard`: its events in
    arrival order) for the Turns `turns` names (settled before the caller stopped listening):
    each Turn's deltas heard after its first `turn.updated` and before its settling one, and
    its assistant deltas, joined, its settled assistant Messages' text, joined. And the Turn
    events' own law: no `turn.updated` of a Turn back at `active` after one that settled it,
    and (`stored`: turn id → the Turn as `session.timeline` answered it once settled) its
    settling event shows what the store committed. `streaming`: the Turns whose provider
    streamed their reply (a fake model's `/stream`): one of them heard with no delta at all
    lost every delta (a Turn not named there may reply without any)."""
    out: list[Violation] = []
    wanted = set(turns)
    first: dict[str, int] = {}
    settled: dict[str, tuple[int, Mapping[str, Any]]] = {}
    deltas: dict[str, list[tuple[int, Mapping[str, Any]]]] = defaultdict(list)
    for index, event in enumerate(heard):
        kind = event.get("type")
        if kind == "turn.updated":
            turn = event["turn"]
            turn_id = str(turn.get("turnId"))
            first.setdefault(turn_id, index)
            if turn.get("phase") == "settled" and turn_id not in settled:
                settled[turn_id] = (index, turn)
            elif turn.get("phase") != "settled" and turn_id in settled and turn_id in wanted:
                out.append(
                    Violation(
                        Law.TURN_EVENTS_HEARD,
                        f"{turn_id}: a turn.updated back at {turn.get('phase')!r} after the"
                        " one that settled it",
                    )
                )
        elif kind == "message.delta":
            deltas[str(event.get("turnId"))].append((index, event))
    for turn_id in sorted(wanted):
        if turn_id not in settled:
            out.append(Violation(Law.TURN_EVENTS_HEARD, f"{turn_id}: its settlement never heard"))
            continue
        end, turn = settled[turn_id]
        held = (stored or {}).get(turn_id)
        if (
            held is not None
            and not turn.get("messagesTruncated")
            and _committed(turn) != _committed(held)
        ):
            out.append(
                Violation(
                    Law.TURN_EVENTS_HEARD,
                    f"{turn_id}: its settling turn.updated is not the Turn committed:"
                    f" heard {_committed(turn)!r:.200}, stored {_committed(held)!r:.200}",
                )
            )
        mine = deltas.get(turn_id, [])
        early = [i for i, _ in mine if i < first[turn_id]]
        late = [i for i, _ in mine if i > end]
        if early:
            out.append(
                Violation(
                    Law.TURN_EVENTS_HEARD,
                    f"{turn_id}: {len(early)} delta(s) heard before its first turn.updated",
                )
            )
        if late:
            out.append(
                Violation(
                    Law.TURN_EVENTS_HEARD,
                    f"{turn_id}: {len(late)} delta(s) heard after it settled",
                )
            )
        streamed = "".join(
            str(e.get("delta") or "") for _, e in mine if e.get("kind") == "assistant"
        )
        text = "".join(
            str(m.get("text") or "")
            for m in turn.get("messages") or []
            if m.get("kind") == "assistant"
        )
        if not streamed and text and turn_id in streaming:
            out.append(
                Violation(
                    Law.TURN_EVENTS_HEARD,
                    f"{turn_id}: its reply {text[:60]!r} was streamed, no delta of it heard",
                )
            )
        if turn.get("messagesTruncated") or not streamed:
            continue  # a cut settled event, or a reply that was not streamed
        if streamed != text:
            out.append(
                Violation(
                    Law.TURN_EVENTS_HEARD,
                    f"{turn_id}: its deltas say {streamed[:60]!r}, its reply {text[:60]!r}",
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class Answered:
    """One control request a soak sent and how it was answered: `interaction.respond` (its
    `request_id` and `response`) or `turn.interrupt` (`request_id` ""), `status` the HTTP
    status (None: the reply was lost, e.g. to a SIGKILL) and `body` its reply."""

    sid: str
    turn_id: str
    request_id: str
    response: Mapping[str, Any]
    status: int | None
    body: Mapping[str, Any]
    seen: Mapping[str, Any] | None = None
    """`turn.interrupt`: the Turn as the client last saw it before asking (None: not read)."""


def check_interaction_answers(
    answers: Iterable[Answered],
    turns: Mapping[str, Mapping[str, Any]],
    took: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
) -> list[Violation]:
    """`interaction_answered` over the answers sent (`answers`) and each Turn as
    `session.timeline` answered once the clients were quiet (`turns`: turn id → Turn; a Turn
    of a deleted Session is absent and left alone): at most one 200 per Interaction, its
    record `resolved` with the answer that 200 carried, and a `resolved` record's answer one
    that was sent and not refused (answered 200, or its reply lost). `took`: the answer the
    provider says it took, read from a settled Turn (its fake model's reply; None: none said),
    which the Turn's one Interaction must be recorded `resolved` with."""
    out: list[Violation] = []
    sent: dict[tuple[str, str], list[Answered]] = defaultdict(list)
    for a in answers:
        sent[(a.turn_id, a.request_id)].append(a)
    for (turn_id, request_id), mine in sorted(sent.items()):
        where = f"turn {turn_id} interaction {request_id}"
        ok = [a for a in mine if a.status == 200]
        if len(ok) > 1:
            out.append(Violation(Law.INTERACTION_ANSWERED, f"{where}: answered 200 {len(ok)}x"))
        turn = turns.get(turn_id)
        if turn is None:
            continue
        record = next(
            (i for i in turn.get("interactions") or [] if i.get("requestId") == request_id), None
        )
        if record is None:
            out.append(Violation(Law.INTERACTION_ANSWERED, f"{where}: answered, not recorded"))
            continue
        output = {k: v for k, v in (record.get("output") or {}).items() if k != "by"}
        if ok and (record.get("status") != "resolved" or output != dict(ok[0].response)):
            out.append(
                Violation(
                    Law.INTERACTION_ANSWERED,
                    f"{where}: answered 200 with {dict(ok[0].response)}, recorded"
                    f" {record.get('status')} {output}",
                )
            )
        got = took(turn) if took is not None and len(turn.get("interactions") or []) == 1 else None
        if got is not None and record.get("status") != "resolved":
            # The provider took an answer (its Turn completed on it): its record must land,
            # whatever the request was answered (a 503 whose record was then dropped).
            out.append(
                Violation(
                    Law.INTERACTION_ANSWERED,
                    f"{where}: the provider took {dict(got)}, recorded {record.get('status')}",
                )
            )
        elif got is not None and output != dict(got):
            out.append(
                Violation(
                    Law.INTERACTION_ANSWERED,
                    f"{where}: recorded {output}, the provider took {dict(got)}",
                )
            )
        taken = [dict(a.response) for a in mine if a.status in (200, None)]
        if record.get("status") == "resolved" and output not in taken:
            out.append(
                Violation(
                    Law.INTERACTION_ANSWERED,
                    f"{where}: recorded {output}, an answer not sent or refused",
                )
            )
    return out


def check_interrupts(
    interrupts: Iterable[Answered], turns: Mapping[str, Mapping[str, Any]]
) -> list[Violation]:
    """`interrupt_answered` over the `turn.interrupt`s sent and each Turn as
    `session.timeline` answered once the clients were quiet (`turns`, as for
    `check_interaction_answers`): a Turn an interrupt answered 200 is settled; one that answer
    showed settled keeps that outcome, and one the client had seen settled before asking is
    answered with that outcome, never refused 409 (an interrupt settles an active Turn; it
    changes no settled one, so not even a fork's fence refuses it)."""
    out: list[Violation] = []
    for a in interrupts:
        turn = turns.get(a.turn_id)
        if a.status == 409 and (a.seen or {}).get("phase") == "settled":
            # A settled Turn's interrupt writes nothing: no fence or conflict refuses it.
            out.append(
                Violation(
                    Law.INTERRUPT_ANSWERED,
                    f"turn {a.turn_id}: seen settled, its interrupt refused 409"
                    f" {a.body.get('reason')}",
                )
            )
        if a.status != 200 or turn is None:
            continue
        where = f"turn {a.turn_id}"
        shown = a.body.get("turn") or {}
        if turn.get("phase") != "settled":
            out.append(Violation(Law.INTERRUPT_ANSWERED, f"{where}: interrupted, still active"))
        elif shown.get("phase") == "settled" and shown.get("outcome") != turn.get("outcome"):
            out.append(
                Violation(
                    Law.INTERRUPT_ANSWERED,
                    f"{where}: interrupt answered {shown.get('outcome')}, settled"
                    f" {turn.get('outcome')}",
                )
            )
        seen = a.seen or {}
        if seen.get("phase") == "settled" and shown.get("outcome") != seen.get("outcome"):
            out.append(
                Violation(
                    Law.INTERRUPT_ANSWERED,
                    f"{where}: seen settled {seen.get('outcome')}, its interrupt answered"
                    f" {shown.get('phase')} {shown.get('outcome')}",
                )
            )
    return out


TURN_REASONS = frozenset(
    {
        "model_unreachable",
        "model_auth_failed",
        "model_timeout",
        "provider_stopped",
        "provider_unresponsive",
        "provider_protocol_error",
        "provider_history_missing",
    }
)
"""A failed Turn's typed reasons (`errorReason`, docs/protocol.md "Turn errors")."""
BREAKING_FAULTS = frozenset({"endless", "close", "close_mid", "noid", "stop", "stop_start"})
"""Faults after which the runtime's stdout cannot be read on (or, `noid`, its Turn cannot be
followed: `turn/start` answered without a turn id; `stop`, the runtime stopped before it
answered; `stop_start`, stopped as it started): it is killed, its Turn fails (or, an
`INTERRUPTED_FAULTS` one, is interrupted)."""
INTERRUPTED_FAULTS = frozenset({"stop_start"})
"""Faults whose round interrupts its Turn (`stop_start`: interrupted while its app-server,
stopped as it started, held the Turn's `session.start`): the Turn settles `interrupted`, not
`failed`, and the stopped server is killed all the same (the start given up is ended)."""
CLAUDE_BREAKING_FAULTS = frozenset({"endless", "close", "close_mid", "notobject", "stop"})
"""Claude Code's: its SDK refuses a message of a known type whose fields have the wrong shape
(`MessageParseError`), where the app-server reader reads non-object params as empty ones; a
prompt has no answer naming a turn (the relay passes `noid` on as is: the Turn completes)."""


def breaking_faults(provider: str) -> frozenset[str]:
    """The faults that break `provider`'s stdout for good (its runtime killed, its Turn
    failed); the others' lines are skipped and the Turn completes."""
    return CLAUDE_BREAKING_FAULTS if provider == "claude-code" else BREAKING_FAULTS


FAULT_RSS_BOUND_KIB = (2 * (64 << 20) + (128 << 20)) // 1024
"""The most a worker's peak RSS may grow over a fault round: reading one line costs at most
twice `MAX_LINE_BYTES` (64 MiB, drivers/app_server/process.py) transiently, plus 128 MiB for
the worker's other work meanwhile: in the crash soak the worker serves the other Sessions'
Turns, forks and interactions beside the round (a Claude Code endless round grew the worker
72 MiB alone and 130-176 MiB there). A reader that held the whole line would pass it with any
line over ~256 MiB; the soaks' endless line has no end (an unbounded reader: +4.4 GiB in
20 s)."""


@dataclass(frozen=True, slots=True)
class ProviderFault:
    """One misbehaving-provider round of a soak: the Turn submitted on a Session whose
    app-server's stdout the relay broke with `fault`, and what the soak saw of it."""

    sid: str
    fault: str
    turn_id: str
    in_bound: bool
    """The Turn was seen settled within the fault's bound."""
    disturbed: bool
    """A kill, restart or stop of the soak's own met the round: only its settlement is judged."""
    relay_pid: int | None = None
    """The relay that took the fault (None: no `turn/start` reached it)."""
    relay_alive: bool = False
    """That relay still ran once the Turn settled (and the kill's grace passed)."""
    next_outcome: str | None = None
    """The Session's next Turn's outcome (None: not run)."""
    next_refused: str | None = None
    """The Session's next Turn's submit, refused (`<status> <reason>`; a busy store is asked
    again for 30 s): the Session took no Turn after the fault."""
    next_pid: int | None = None
    """The relay that served that next Turn's `turn/start`."""
    rss_growth_kib: int | None = None
    """The worker's peak RSS growth over the round (None: not measured, e.g. a new worker)."""
    provider: str = "tutti-agent"
    """The Session's provider (`tutti-agent`, `codex`: the app-server behind the relay;
    `claude-code`: each Turn's CLI behind it)."""


def check_provider_faults(
    faults: Iterable[ProviderFault], turns: Mapping[str, Mapping[str, Any]]
) -> list[Violation]:
    """`provider_fault_settles` over the fault rounds a soak ran and each Turn as
    `session.timeline` answered once the clients were quiet (`turns`: turn id → Turn; a Turn
    not there, its Session deleted, is judged on what the round saw)."""
    out: list[Violation] = []

    def fail(f: ProviderFault, what: str) -> None:
        out.append(
            Violation(
                Law.PROVIDER_FAULT_SETTLES,
                f"{f.provider} {f.fault} turn {f.turn_id} ({f.sid}): {what}",
            )
        )

    for f in faults:
        turn = turns.get(f.turn_id)
        if turn is not None and turn.get("phase") != "settled":
            fail(f, "still active once the clients were quiet")
        if f.rss_growth_kib is not None and f.rss_growth_kib > FAULT_RSS_BOUND_KIB:
            fail(f, f"the worker's peak RSS grew {f.rss_growth_kib} KiB (> {FAULT_RSS_BOUND_KIB})")
        if f.disturbed:
            continue
        if not f.in_bound:
            fail(f, "active past the fault's bound")
        if turn is None or turn.get("phase") != "settled":
            continue
        outcome, reason = turn.get("outcome"), turn.get("errorReason")
        if outcome == "failed" and reason not in TURN_REASONS:
            fail(f, f"failed with no typed reason: {str(turn.get('error'))[:120]!r}")
        breaks = breaking_faults(f.provider)
        breaking = f.fault in breaks and f.relay_pid is not None
        ends = "interrupted" if f.fault in INTERRUPTED_FAULTS else "failed"
        if breaking and outcome != ends:
            fail(f, f"{outcome} behind a broken stdout")
        if f.fault not in breaks and outcome != "completed":
            fail(f, f"{outcome} ({reason}) for lines the reader skips")
        if breaking and f.relay_alive:
            fail(f, f"its broken runtime (relay {f.relay_pid}) still runs")
        if f.next_outcome is not None and f.next_outcome != "completed":
            fail(f, f"the Session's next Turn {f.next_outcome}")
        if f.next_refused is not None:
            fail(f, f"the Session's next Turn refused: {f.next_refused}")
        if breaking and f.next_pid is not None and f.next_pid == f.relay_pid:
            fail(f, f"the Session's next Turn ran on the broken runtime (relay {f.relay_pid})")
    return out


def check_invariants(
    home: Path,
    *,
    probe_fence: bool = True,
    live_grace_s: float | None = None,
    repositories: Mapping[Path, Mapping[str, str]] | None = None,
    retrying_trees: Collection[str] = (),
    waiting_homes: Collection[tuple[str, str]] = (),
) -> InvariantReport:
    """Check every invariant over `home` (a daemon's AGENTHOST_HOME), live or stopped.

    `retrying_trees`: the trees the live daemon's `host.status` → `worktreeRemovals` lists as
    still being removed because git could not or a Session works in them
    (`worktree_retrying`): a failed fork's tree among them may stay past the grace.

    `waiting_homes`: the deleted Sessions whose runtime folder's removal the live daemon's
    `host.status` → `homeRemovals` lists as waiting for a worker call in flight
    (`homes_waiting`): such a folder may stay past the delete's bound, within that call's.

    `live_grace_s`: the daemon is alive and quiescent (no turn or fork in flight that the
    caller started less than this ago): also check that no Turn stays active and no fence
    stays held without a live runtime or saga behind it.

    `repositories`: the person's repositories the daemon's Sessions work in, each with its
    `repository_state` taken before the daemon touched it: none may have changed but for
    worktree forks' own worktrees and branches (law 10).

    Provider homes are scanned *before* the store is copied: a child seen in a home then has
    its operation's `dispatching` marker in the copy (law 1), even with forks in flight. They
    are scanned once more *after* the copy for the converse law (an accepted operation's child
    is in a provider home): a fork that bound its child and committed between the first scan
    and the copy has its child on disk by then (it is written before `provider_accepted`), so
    either scan may show it.
    """
    ctx = _Ctx(home)
    children = provider_children(home)
    tmp = Path(tempfile.mkdtemp(prefix="invariants-"))
    try:
        copy_path = tmp / "store.sqlite3"
        snapshot_store(home / "store.sqlite3", copy_path)
        conn = apsw.Connection(str(copy_path))
        try:
            _check_integrity(ctx, conn)
            _check_schema(ctx, conn)
            _check_tables(ctx, conn)
            _check_completed_turns(ctx, conn)
            claude_turns, transcript_misses = _claude_transcript_misses(ctx, conn)
            codex_misses = _codex_turn_misses(ctx, conn)
            tutti_misses = _tutti_turn_misses(ctx, conn)
            _check_host_only_turns(ctx, conn)
            _check_turn_claims(ctx, conn)
            _check_provider_turns_once(ctx, conn)
            _check_interactions(ctx, conn)
            checkpoint_misses = _check_checkpoints(ctx, conn)
            _check_checkpoint_changes(ctx, conn)
            _check_restore_undos(ctx, conn)
            if live_grace_s is not None:
                _check_liveness(ctx, conn, int(live_grace_s * 1000))
                _check_deleted_homes(ctx, conn, int(live_grace_s * 1000), waiting_homes)
                _check_stopped_runtimes(ctx, home / "runtimes")
            ops = _rows(
                conn,
                "SELECT o.*, s.snapshot_json FROM fork_operations o"
                " LEFT JOIN fork_snapshots s USING (op_seq) ORDER BY o.op_seq",
            )
            sessions = _rows(
                conn, "SELECT provider, workspace_id, session_id, deleted, cwd FROM sessions"
            )
            resolutions = _rows(
                conn, "SELECT operation_id, action, state, result_json FROM fork_resolutions"
            )
            alive = _check_children(ctx, conn, ops)
            _check_reservations(ctx, conn, ops)
            _check_fence_witness(ctx, conn, ops)
            _check_kept_digests(ctx, conn)
            _check_fence_window(ctx, conn, ops)
            _check_delete_fence_window(ctx, conn, ops)
            _check_ended_snapshots(ctx, conn, ops)
        finally:
            conn.close()
        _check_single_holders(ctx, ops)
        _check_step_order(ctx, ops)
        _check_provider_logs(ctx, home)
        ctx.violations += check_socket_dirs(home)
        n_children = _check_provider_children(
            ctx, children, ops, alive, after_copy=provider_children(home)
        )
        provider_of = {(s["workspace_id"], s["session_id"]): s["provider"] for s in sessions}
        readable: Counter[str] = Counter()
        for op in alive:
            ws, target = op["workspace_id"], op["target_session_id"]
            provider = provider_of[(ws, target)]
            problem = child_readable_problem(
                home,
                ws,
                target,
                provider,
                str(op["target_provider_session_id"]),
                json.loads(op["target_provider_turn_ids"] or "[]"),
                op.get("source_provider_session_id"),
            )
            if problem:
                ctx.fail(Law.CHILD_READABLE, f"child {target}: {problem}")
            else:
                readable[provider] += 1
        if checkpoint_misses:
            # A Session deleted since the copy had its refs dropped, and a Turn the size cap
            # recorded `unavailable` since then had its refs dropped: neither is a miss.
            recheck = tmp / "recheck.sqlite3"
            snapshot_store(home / "store.sqlite3", recheck)
            now = apsw.Connection(str(recheck))
            try:
                deleted = {
                    (r["workspace_id"], r["session_id"])
                    for r in _rows(
                        now, "SELECT workspace_id, session_id FROM sessions WHERE deleted = 1"
                    )
                }
                dropped = {
                    (r["workspace_id"], r["session_id"], r["turn_id"])
                    for r in _rows(
                        now,
                        "SELECT workspace_id, session_id, turn_id FROM turns"
                        " WHERE json_extract(checkpoint_json, '$.state') = 'unavailable'",
                    )
                }
            finally:
                now.close()
            for ws, sid, turn_id, detail in checkpoint_misses:
                if (ws, sid) not in deleted and (ws, sid, turn_id) not in dropped:
                    ctx.fail(Law.CHECKPOINT_KEPT, detail)
        if transcript_misses:
            deleted_now = _deleted_now(home)
            for ws, sid, detail in transcript_misses:
                if (ws, sid) not in deleted_now:
                    ctx.fail(Law.CLAUDE_TURN_IN_TRANSCRIPT, detail)
        if codex_misses:
            deleted_now = _deleted_now(home)
            for ws, sid, detail in codex_misses:
                if (ws, sid) not in deleted_now:
                    ctx.fail(Law.CODEX_TURN_IN_ROLLOUT, detail)
        if tutti_misses:
            deleted_now = _deleted_now(home)
            for ws, sid, detail in tutti_misses:
                if (ws, sid) not in deleted_now:
                    ctx.fail(Law.TUTTI_TURN_IN_ROLLOUT, detail)
        _check_quarantine(ctx, home, ops, resolutions)
        spares = _check_spare_homes(ctx, home)
        _check_child_owners(ctx, children, ops)
        _check_unknown_evidence(ctx, home, ops, sessions)
        _check_worktrees(ctx, ops, int(time.time() * 1000), sessions, retrying_trees)
        if probe_fence:
            _check_fence(ctx, copy_path, ops)
        for repo, before in (repositories or {}).items():
            _check_repository(ctx, repo, before)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return InvariantReport(
        violations=tuple(ctx.violations),
        operations=dict(Counter(o["status"] for o in ops)),
        sessions=len(sessions),
        provider_children=n_children,
        readable_children=readable.total(),
        readable_by_provider=dict(readable),
        spare_homes=spares,
        claude_turns_read=claude_turns,
    )


def work_in_flight(home: Path) -> Counter[str]:
    """Active Turns and active fork operations (by their source) per provider, as the store of
    `home` holds them now (one read transaction, opened read-only as `snapshot_store` opens it:
    a live or killed daemon's store is never written to). A soak reads it as a kill lands, to
    know which provider's work the kill met."""
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.set_busy_timeout(10_000)
        rows = _rows(
            conn,
            "SELECT s.provider, COUNT(*) AS n FROM turns t JOIN sessions s"
            " USING (workspace_id, session_id) WHERE t.phase = 'active' GROUP BY s.provider"
            " UNION ALL SELECT s.provider, COUNT(*) FROM fork_operations o JOIN sessions s"
            " ON s.workspace_id = o.workspace_id AND s.session_id = o.source_session_id"
            f" WHERE o.status IN {ACTIVE!r} GROUP BY s.provider",
        )
    finally:
        conn.close()
    out: Counter[str] = Counter()
    for r in rows:
        out[str(r["provider"])] += int(r["n"])
    return out


def assert_invariants(
    home: Path,
    *,
    probe_fence: bool = True,
    live_grace_s: float | None = None,
    repositories: Mapping[Path, Mapping[str, str]] | None = None,
    retrying_trees: Collection[str] = (),
    waiting_homes: Collection[tuple[str, str]] = (),
) -> InvariantReport:
    """`check_invariants`, failing the test with every violation listed."""
    report = check_invariants(
        home,
        probe_fence=probe_fence,
        live_grace_s=live_grace_s,
        repositories=repositories,
        retrying_trees=retrying_trees,
        waiting_homes=waiting_homes,
    )
    assert report.ok, "invariant violations:\n" + "\n".join(map(str, report.violations))
    return report


# The reads' laws: `list_pages`, `timeline_pages`, `lineage_answer`. A reader reads
# the store before its first request and after its last answer (`read_view`); a law holds over
# both views: a deleted Session never lives again (ids are never reused), a committed fork's
# lineage row and a Turn's sequence never change, so what was so at both ends was so between.


@dataclass(frozen=True, slots=True)
class ReadView:
    """The store at one moment, as far as the reads' laws look: the live and the deleted
    Sessions, the Turns of the named Sessions (turnId → (sequence, phase)), and the
    committed forks — each child's source, each source's children in operation order."""

    live: frozenset[str]
    deleted: frozenset[str]
    turns: Mapping[str, Mapping[str, tuple[int, str]]]
    forked_from: Mapping[str, str]
    forks: Mapping[str, tuple[str, ...]]


def read_view(home: Path, ws: str, sids: Iterable[str] = ()) -> ReadView:
    """`ReadView` of the store of `home` now: one read transaction on a read-only connection
    (as `work_in_flight` opens it: a live daemon's store is never written to; WAL lets the
    read run while a writer holds the lock)."""
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.set_busy_timeout(10_000)
        with conn:  # one snapshot for every statement
            sessions = _rows(
                conn, "SELECT session_id, deleted FROM sessions WHERE workspace_id = ?", (ws,)
            )
            forks = _rows(
                conn,
                "SELECT l.source_session_id AS source, l.target_session_id AS target"
                " FROM fork_lineage l JOIN fork_operations o ON o.workspace_id ="
                " l.workspace_id AND o.operation_id = l.operation_id WHERE l.workspace_id = ?"
                " ORDER BY o.op_seq",
                (ws,),
            )
            turns: dict[str, dict[str, tuple[int, str]]] = {}
            for sid in sids:
                turns[sid] = {
                    str(r["turn_id"]): (int(r["sequence"]), str(r["phase"]))
                    for r in _rows(
                        conn,
                        "SELECT turn_id, sequence, phase FROM turns WHERE workspace_id = ?"
                        " AND session_id = ?",
                        (ws, sid),
                    )
                }
    finally:
        conn.close()
    children: dict[str, list[str]] = defaultdict(list)
    for r in forks:
        children[str(r["source"])].append(str(r["target"]))
    return ReadView(
        live=frozenset(str(r["session_id"]) for r in sessions if not r["deleted"]),
        deleted=frozenset(str(r["session_id"]) for r in sessions if r["deleted"]),
        turns=turns,
        forked_from={str(r["target"]): str(r["source"]) for r in forks},
        forks={k: tuple(v) for k, v in children.items()},
    )


@dataclass(frozen=True, slots=True)
class ListPaging:
    """`session.list` paged to its end: each page's Session ids in order, whether it had a
    `nextCursor`, and the store before the first request and after the last answer."""

    limit: int
    pages: tuple[tuple[tuple[str, ...], bool], ...]
    before: ReadView
    after: ReadView


@dataclass(frozen=True, slots=True)
class TimelinePaging:
    """`session.timeline` of one Session paged to its end: each page's (turnId, sequence) in
    order and whether it had a `nextSequence`; the store before and after."""

    session: str
    limit: int
    pages: tuple[tuple[tuple[tuple[str, int], ...], bool], ...]
    before: ReadView
    after: ReadView


@dataclass(frozen=True, slots=True)
class LineageRead:
    """A `session.lineage` answer (200) of `session`, and the store before and after."""

    session: str
    answer: Mapping[str, Any]
    before: ReadView
    after: ReadView


@dataclass(frozen=True, slots=True)
class ForkPaging:
    """A Session's own forks paged with `session.lineage` `maxNodes` = `limit` and
    `afterOrdinal` = the last ordinal listed, until `truncated` is null: each page's
    (agentSessionId, ordinal) in order; the store before and after."""

    session: str
    limit: int
    pages: tuple[tuple[tuple[str, int], ...], ...]
    before: ReadView
    after: ReadView


ReadAnswer = ListPaging | TimelinePaging | LineageRead | ForkPaging


def check_read_answers(reads: Iterable[ReadAnswer]) -> list[Violation]:
    """`list_pages`, `timeline_pages` and `lineage_answer` over what a soak's readers were
    answered, each held to the store as it was before and after its read."""
    out: list[Violation] = []
    for r in reads:
        if isinstance(r, ListPaging):
            out += _list_pages(r)
        elif isinstance(r, TimelinePaging):
            out += _timeline_pages(r)
        elif isinstance(r, ForkPaging):
            out += _fork_pages(r)
        else:
            out += _lineage_answer(r)
    return out


def _list_pages(r: ListPaging) -> list[Violation]:
    out: list[Violation] = []

    def fail(detail: str) -> None:
        out.append(Violation(Law.LIST_PAGES, f"session.list (limit {r.limit}): {detail}"))

    shown: list[str] = []
    for n, (page, more) in enumerate(r.pages):
        if len(page) > r.limit:
            fail(f"page {n} holds {len(page)} Sessions")
        if more and not page:
            fail(f"page {n} is empty with nextCursor set")
        shown += page
    twice = sorted(k for k, v in Counter(shown).items() if v > 1)
    if twice:
        fail(f"shown twice: {twice}")
    missed = sorted((r.before.live & r.after.live) - set(shown))
    if missed:
        fail(f"missed Sessions live all along: {missed}")
    gone = sorted(r.before.deleted & set(shown))
    if gone:
        fail(f"shown though deleted before the paging: {gone}")
    return out


def _timeline_pages(r: TimelinePaging) -> list[Violation]:
    out: list[Violation] = []

    def fail(detail: str) -> None:
        out.append(Violation(Law.TIMELINE_PAGES, f"session {r.session} timeline: {detail}"))

    shown: list[tuple[str, int]] = []
    for n, (page, more) in enumerate(r.pages):
        # A page may end before `limit` at its byte bound, never before its first Turn.
        if len(page) > r.limit:
            fail(f"page {n} holds {len(page)} Turns, its limit {r.limit}")
        if more and not page:
            fail(f"page {n} is empty with nextSequence set")
        shown += page
    ids = [t for t, _ in shown]
    seqs = [q for _, q in shown]
    twice = sorted(k for k, v in Counter(ids).items() if v > 1)
    if twice:
        fail(f"Turns shown twice: {twice}")
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        fail(f"sequences not rising: {seqs}")
    settled = {
        t for t, (_, phase) in r.before.turns.get(r.session, {}).items() if phase == "settled"
    }
    gap = sorted(settled - set(ids))
    if gap:
        fail(f"Turns settled before the paging left out: {gap}")
    now = r.after.turns.get(r.session, {})
    if r.session in r.after.live:
        moved = [(t, q, now.get(t)) for t, q in shown if (now.get(t) or (None, ""))[0] != q]
        if moved:
            fail(f"Turns shown at another sequence than the store's: {moved}")
    return out


def _chain(sid: str, views: Sequence[ReadView]) -> list[str]:
    """`sid`'s `forkedFrom` chain, nearest first (a committed lineage row never changes)."""
    chain: list[str] = []
    up = sid
    while True:
        source = next((v.forked_from[up] for v in views if up in v.forked_from), None)
        if source is None or source in chain or source == sid:
            return chain
        chain.append(source)
        up = source


def _lineage_answer(r: LineageRead) -> list[Violation]:
    out: list[Violation] = []
    before, after = r.before, r.after

    def fail(detail: str) -> None:
        out.append(Violation(Law.LINEAGE_ANSWER, f"session {r.session} lineage: {detail}"))

    if r.session in before.deleted:
        fail("answered though the Session was deleted before the read")
    ancestors = list(r.answer.get("ancestors") or [])
    asked = [str(a["agentSessionId"]) for a in ancestors]
    chain = _chain(r.session, (after, before))
    if asked != chain:
        fail(f"ancestors {asked}, the store's forkedFrom chain {chain}")
    for a in ancestors:
        aid = str(a["agentSessionId"])
        if a.get("session") is None and aid in after.live:
            fail(f"ancestor {aid} shown deleted, live after the read")
        if a.get("session") is not None and aid in before.deleted:
            fail(f"ancestor {aid} shown live, deleted before the read")
        source = (a.get("lineage") or {}).get("sourceAgentSessionId")
        up = _chain(aid, (after, before))[:1]
        if [source] != up and not (source is None and not up):
            fail(f"ancestor {aid}'s lineage names {source}, the store's {up}")
    listed: set[str] = set()
    stack: list[tuple[str, list[Mapping[str, Any]]]] = [
        (r.session, list(r.answer.get("descendants") or []))
    ]
    while stack:
        parent, nodes = stack.pop()
        ordinals = [int(n["ordinal"]) for n in nodes]
        if any(b <= a for a, b in itertools.pairwise(ordinals)):
            fail(f"children of {parent} with ordinals {ordinals}")
        committed = list(after.forks.get(parent, ()))
        steady = tuple(committed) == tuple(before.forks.get(parent, ()))
        ids = [str(n["agentSessionId"]) for n in nodes]
        order = [committed.index(i) for i in ids if i in committed]
        if order != sorted(order):
            fail(f"children of {parent} not in operation order")
        for node in nodes:
            cid = str(node["agentSessionId"])
            listed.add(cid)
            if cid not in committed:
                fail(f"{cid} listed under {parent}, no committed fork of it")
            elif steady and int(node["ordinal"]) != committed.index(cid) + 1:
                fail(f"{cid} ordinal {node['ordinal']}, the store's {committed.index(cid) + 1}")
            if (node.get("lineage") or {}).get("sourceAgentSessionId") != parent:
                fail(f"{cid}'s lineage does not name {parent}")
            if node.get("deleted") and cid in after.live:
                fail(f"{cid} shown deleted, live after the read")
            if not node.get("deleted") and cid in before.deleted:
                fail(f"{cid} shown live, deleted before the read")
            stack.append((cid, list(node.get("children") or [])))
    if r.answer.get("truncated") is None:
        tree: list[str] = []
        frontier = [r.session]
        while frontier:
            nxt = [c for p in frontier for c in before.forks.get(p, ()) if c not in tree]
            tree += nxt
            frontier = nxt
        missing = sorted(set(tree) - listed)
        if missing:
            fail(f"committed forks before the read missing from an untruncated answer: {missing}")
    return out


def _fork_pages(r: ForkPaging) -> list[Violation]:
    """A paging of a Session's forks by `afterOrdinal`: ordinals rise across its pages, every
    fork committed before it began is shown (an ordinal only grows: a fork not yet reached
    is reached later), and one is shown twice only if a fork of the Session committed
    meanwhile (an adopt of an earlier-asked fork moves the later ones up, docs/protocol.md)."""
    out: list[Violation] = []

    def fail(detail: str) -> None:
        out.append(Violation(Law.LINEAGE_ANSWER, f"session {r.session} forks paged: {detail}"))

    shown = [item for page in r.pages for item in page]
    ordinals = [o for _, o in shown]
    if any(b <= a for a, b in itertools.pairwise(ordinals)):
        fail(f"ordinals not rising across pages: {ordinals}")
    if any(len(page) > r.limit for page in r.pages):
        fail(f"a page over maxNodes {r.limit}: {r.pages}")
    ids = [i for i, _ in shown]
    missed = sorted(set(r.before.forks.get(r.session, ())) - set(ids))
    if missed:
        fail(f"forks committed before the paging not shown: {missed}")
    twice = sorted(k for k, v in Counter(ids).items() if v > 1)
    steady = r.before.forks.get(r.session, ()) == r.after.forks.get(r.session, ())
    if twice and steady:
        fail(f"forks shown twice though none committed meanwhile: {twice}")
    return out
