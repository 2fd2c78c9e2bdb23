"""Crash soak: several client threads run random sessions, turns, forks of both point kinds
(`throughTurn`, `latestSettled`) and both workspaces (`shared`, and `worktree`: the sessions
work in a git repository made here; the tree's own failpoints are among the armed ones), ACKs,
`fork.resolve` (inspect / adopt / abandon) of unknown operations, mutations and deletes of
sources and children against a real daemon while a chaos loop SIGKILLs the daemon or its
worker at random moments (or arms a `once:kill` failpoint, the resolve's among them: the
least-armed one the round reaches, and in the long profile every point at least once, some
armed as a free round's load starts: `point_choice`);
after every kill the invariant checker runs, with the person's repository as it was before the
first Session touched it (`repository_kept`, law 10: only the forks' worktrees and
`agenthost/` branches may be added). A delete keeps or removes a worktree fork's tree at random
(`force` or not). A fork request answered earlier is sent again, across restarts (law 6: the
same `requestId` and body get the same operation; a changed body under it is never accepted),
and so is a Turn's submit (the same input gets its Turn; another input is never accepted).
The clients restore Sessions' folders too (`workspace.restore` to an earlier Turn's `before` or
`after`, or the undo of the Session's last restore; `force` at times) and read their diffs
(`session.workspaceDiff`), racing the Turns, forks and deletes of the same folder and the
kills: a refusal a law allows (`agent_session_busy`, `workspace_shared`,
`workspace_checkpoint_missing`, `workspace_unavailable`, a deleted Session's 404) is counted,
any other error is a failure, and after every check the answers so far are held to the store
(`check_workspace_answers`: each answered undo of a live Session still kept by its ref, each
`changedFiles` the diff of its trees); every undo ref on disk names a tree the store holds
(`restore_undo_kept`, in every check: a kill mid-restore included).

One Session in four (seeded; one in ten in the short profile) is a `claude-code` one (the real
`claude` program against the fake Messages API), and so is the seed fork of the first two
rounds and of as many rounds after: its turns, forks, resolves, deletes and replays take the
same steps. The first round arms a `worker.fork.*` / `worker.bind.*` point on its Claude fork,
a later Claude round's armed point lands on its fork too, and a worker kill in a Claude round
kills the Claude worker; the soak asserts that some check ran after a kill that met Claude work
(its store showed an active Claude Turn or fork, or the Claude worker died at a point), that a
Claude fork committed, that `spare_home_empty` walked a home with spares, and that
`claude_turn_in_transcript` read completed Claude Turns in their transcripts. None of these is
left to chance: when no round's kill met Claude work (or the rounds killed nothing), one more
kill follows the rounds (`kill_on_fork`: the daemon dies at `host.fork.after_dispatching` of a
new Claude Session's fork, then the round's checks), and a Claude fork after the chaos (no
point armed, no fault: `fork_once_more`) must commit.

Codex among them the same way (the real pinned `codex app-server`, `AGENTHOST_CODEX_BIN`, against
the fake Responses API): a seeded share of `session.create` (`CODEX_SHARE`: 10 %; 15 % in the
long profile) makes a `codex` Session, and so is the seed fork of
`CODEX_ROUND` (the long profile's 6th, the short one's 3rd: its first stall round) and of as many
rounds after; its turns, forks (both point kinds, shared and worktree), resolves, deletes,
replays, restores and diffs take the same steps. The long profile's `CODEX_ROUND` arms a
`worker.fork.*` / `worker.bind.*` point on its Codex fork (a later Codex round that draws a
failpoint arms a fork-path point the same way), a worker kill in a Codex round kills the Codex
worker, and the stop rounds stop Claude's, Codex's and Tutti Agent's worker in turn. A kill
met Codex work as it meets Claude's (`World.met`); the long profile asserts that a check ran
after one and that a Codex fork committed, the short one prints them (its five rounds arm no
point on a Codex fork: the first is Claude's, the rest are stall, stop and full-disk rounds).
The clients' Codex Sessions are made with `approvalPolicy: on-request` (`CODEX_ASKS`; the
rounds' seed and stop Sessions are not): their Turns ask too (`interaction_chaos`).

A stalled git among the faults: the daemon runs with `tests/workspace/stalling_git.py` first on
its PATH (the real git until armed), a short `[workspace] timeout_s` and a short
`gc_interval_s` and `long_timeout_s` (the bound of a `gc`). Every fifth round (the 3rd, 8th,
...) kills nothing: it arms the stall for a random git command of the checkpoints' shadow
repositories (`add`, `write-tree`, `update-ref` — a drop's ref transaction —, `gc`) at a
random moment while the clients run; a Session it deleted makes the janitor drop and collect
for the last two. After the stalled git is killed at its bound: no process of it runs, every
law holds, no lock file stays in the folder's shadow repository, and a later Turn of the
round's own Session in the same folder records its `before` and `after` checkpoints (the
folder's checkpoints work on, with no restart). The round after each (the 4th, 9th, ...)
stalls a git the same way but SIGKILLs the daemon while the git stalls: the git (its own
session) outlives its daemon, lock held; the restarted daemon kills it before it works on any
folder; then the same checks (no process of the stall left, no lock file, both checkpoints).
A full disk among the faults: every fifth round from the 5th (the 5th, 10th, ...) makes
the daemon's disk full at a random moment while the clients run — its RLIMIT_FSIZE set to
`FULL_DISK_BYTES`, so every write past that offset of a file (the store's write-ahead log's
next frames within a few commits at most) fails with EFBIG, as on a full file system (and the
processes it starts meanwhile inherit the limit); each tutti-agent app-server already running
gets the size of the smallest rollout it holds open as its limit, so its next rollout append
fails too (its Turn must end `failed`, not stay active). At the round's end
either the daemon is SIGKILLed with the disk still full (`full_disk_kill`: a start under
the same limit first, which must fail at once saying the disk holding the store is full, no
"deferred" busy retry, or serve if it had nothing to write past it: `full_disk_start`;
then the restart with space), or space returns
(the limit lifted on the daemon and every process under it, `full_disk`): then no request was
answered 500 (a write refused answers 503 `store_busy`), and, the clients parked, every Turn
and every operation in flight settles within 60 s with no restart (a saga's step, commit or
abort refused by the full disk is retried until it lands) and the live laws hold
(`active_turn_worked`, `fence_has_saga`).
A stopped worker among the faults: every seventh round from the 2nd that is neither a stall nor
a full-disk round (the 2nd, 16th, 37th, 51st) SIGSTOPs a driver worker at a random moment while
the clients run (the round's seed fork in flight, Turns and forks of the clients too): the
Claude worker in the 1st such round (the 2nd: the short profile's), Codex's in the next, Tutti
Agent's in the one after, and so on; no `once:kill` point stays armed. With no restart of the
daemon: the stopped worker is gone (its pid not alive: the supervisor's watchdog declared it
hung and SIGKILLed it; a leftover is SIGCONTed, then the round fails) within
`BUSY_SILENCE_LIMIT_S` of the stop (the supervisor's bound on a silent worker whatever its CPU:
`drivers/supervisor.py`; a stopped one goes sooner, at `SILENCE_LIMIT_S` + `CPU_WINDOW_S`),
every Turn and operation in flight settles within that bound again (the clients parked; a
request it held is lost, `WorkerLost`: the Turn fails, the fork is `unknown`), every law holds
with the live ones (`one_provider_child`, `child_iff_committed`: no provider child made twice or
lost), and a Turn of a new Session of that provider completes on a new worker (another pid).
Interactions and interrupts among the client actions (`interaction_chaos.Asker`): Tutti Agent
Turns whose fake model asks for an approval or an answer, Claude Code Turns whose Bash call asks
for its permission, Codex Turns whose `exec_command` call asks for its approval, answered at
random moments (approve or decline, sometimes twice at once, sometimes never: left to an
interrupt or a kill), and `turn.interrupt` of random Turns, racing the forks and deletes of
the same Session; after every round's kill or fault the Turns asked and still active are
interrupted (so the round's waits for settled work end), `interaction_state` is checked with
every law, and at the end what the clients were answered is checked (`interaction_answered`,
`interrupt_answered`); the summary counts the answers by status.
A provider that misbehaves on its stdout (`provider_chaos`): every Tutti Agent app-server
starts through `tests/daemon/misbehaving_app_server.py`, and in each odd round but a full-disk
one a Turn of one of the chaos's two Sessions meets a fault (one endless line, garbage, non-object
notifications, its stdout closed at `turn/start` or mid-Turn) among the clients' load, the
round's kill landing on it or not; at the end `provider_fault_settles` judges what was seen.
A Turn whose start fails on the host after its claim among the faults: 2 % of the clients'
submits arm `host.turn.before_warm_start` `once:error` first (as the contention soak does), so
such failures meet the kills; at the end no Turn of any live Session is active, and the summary
line counts the arms and the Turns the point failed (`start_error_armed`, `start_failed`).
The reads a GUI lives on too (`read_chaos.Reader`): a client step pages `session.list` or a
Session's `session.timeline`, reads a `session.lineage`, or pins or renames a Session, racing
the others and the kills (a read a kill cuts is dropped); after each restart the daemon's
answers to each read are read back, and at every check the reads since the last one are held
to the store as it was before and after them (`list_pages`, `timeline_pages`,
`lineage_answer`).
A failed fork's tree git cannot remove among the faults (`FailedTreePin`, as root): before
the first round's seed fork a worktree fork fails at `host.workspace.after_record` (`once:error`,
or `once:kill` and a restart) with a file of its tree made immutable; the live daemon must list
the tree in `host.status` → `worktreeRemovals` (`git_failed`) and retry it through the next
`PIN_HELD_ROUNDS` rounds' kills and restarts; every check passes the live daemon's retried
trees (`retrying_trees`: a failed fork's tree among them may stay past the grace, any other
may not); then the pin is lifted and the tree must be removed and recorded `removed` with no
help before the end's checks.
A slow provider fork among the faults (`slow_fork`): in the 3rd, 12th, ... rounds a Tutti
Agent Session of the soak's own, behind the relay, is forked with its `thread/fork` held about
the worker's limit (`[daemon] fork_provider_call_seconds`, `slow_fork.LIMIT_S`), among the
round's load and kill; with the clients parked its end is awaited, an `unknown` one abandoned
at once, its Session's next Turn run, then the round's checks. When no round's was made
`unknown` by the worker's limit, one more follows the rounds, held past it; the run asserts
one was.
The fresh app-server's proof (`proof_round`): the first daemon runs with `readability_proof =
"app_server"` for Tutti Agent and Codex (a fork of each committed so before the clients start),
the rounds' first restart with the default.
A delete beside a runtime slot wait and controls past the idle reap (`slot_delete`): in the
1st, 9th, ... rounds, on a daemon of its own (one runtime slot, a short idle limit) beside the
round's load: a delete meets a fork queued for the slot at once (409), one beside an
interrupted Turn's queued preparation is applied at once, a request after a delete waiting
for a held runtime start goes after it (404), an answer and an interrupt whose
worker's reply is held past the idle limit are answered 200 and recorded; its daemon is
SIGKILLed at random with the fork queued. Its home's laws are checked after the round.
Seeded: the seed is printed and
`AGENTHOST_SOAK_SEED` replays it.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import psutil
import pytest

from drivers.supervisor import BUSY_SILENCE_LIMIT_S, CPU_WINDOW_S
from drivers.worker_spawn import fallback_socket_dir
from tests.reliability.codex_cut import codex_cut_cells
from tests.reliability.interaction_chaos import CODEX_ASKS, Asker
from tests.reliability.point_choice import PointChoice
from tests.reliability.point_flows import FLOWS, NotReady
from tests.reliability.proof_round import forks_proven_by_app_server, set_app_server_proof
from tests.reliability.proven_absent import prove_after_restarts
from tests.reliability.provider_chaos import (
    START_FAILPOINT,
    ProviderChaos,
    claude_front,
    codex_front,
    relay_table,
)
from tests.reliability.read_chaos import Reader
from tests.reliability.reliability_harness import (
    LEDGER,
    REPLAY,
    SOAK,
    PointTally,
    fork_latest_params,
    fork_params,
    host_fired,
    provider_env,
    replay_hint,
    resolve_params,
    worker_fired,
    worker_of,
)
from tests.reliability.slot_delete import SlotDelete
from tests.reliability.slow_fork import SlowFork, daemon_table
from tests.reliability.store_start import old_store_full_disk_start
from tests.reliability.tutti_forks import tutti_fork_cells
from tests.reliability.workspace_chaos import refusal, workspace_request
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, wait_for
from tests.support.freezer import running as pid_running
from tests.support.freezer import stop as sigstop
from tests.support.git_repos import make_repo
from tests.support.invariants import (
    SPARE_HOME_PREFIX,
    InvariantReport,
    WorkspaceAnswer,
    assert_invariants,
    check_daemon_runtimes,
    check_invariants,
    check_processes,
    check_socket_dirs,
    check_workspace_answers,
    homes_waiting,
    repository_state,
    socket_dirs_of,
    work_in_flight,
    workspace_answer,
    worktree_retrying,
)
from tests.support.store_lock import WriteLockHolder
from tests.workspace.stalling_git import StallingGit, path_with, running, stalling_git
from transport.client import ApiError, Client, ClientClosed, ClientTimeout
from transport.worker_link import SILENCE_LIMIT_S
from workspace.shadow import ShadowStore

ROUNDS = 60 if SOAK else 5
LONG_HOME = 84
"""The soak's home's length: its workers' sockets go outside it (`drivers.worker_spawn`
`socket_dir`), its own api socket stays in it."""
CLIENTS = 4
LIVE_GRACE_S = 10
"""The live laws' grace: no turn of this soak (at most `/slow 150`) writes nothing that long."""
CLAUDE = "claude-code"
CLAUDE_SHARE = 0.25 if SOAK else 0.1
"""The share of `session.create` and of the rounds' seed forks (past the first two) that is
Claude's (less in the short profile: each Claude Session starts a `claude` program)."""
CODEX = "codex"
CODEX_SHARE = 0.15 if SOAK else 0.1
"""The share of `session.create` and of the rounds' seed forks that is Codex's (less in the
short profile: each Codex Session starts a `codex app-server`)."""
TUTTI = "tutti-agent"
CODEX_ROUND = 6 if SOAK else 3
"""The round whose seed fork is Codex's whatever the draw: in the long profile it arms a
`worker.fork.*` / `worker.bind.*` point on it (as the first round does on Claude's); in the
short one it is the first stall round (nothing armed: a Codex fork in the 5 rounds)."""
pytestmark = pytest.mark.timeout(2400 if SOAK else 240)

POINTS = (
    "host.fork.after_prepare",
    "host.fork.after_dispatching",
    "host.fork.after_provider_result",
    "host.fork.before_commit",
    "host.fork.after_commit",
    "worker.fork.before_provider_call",
    "worker.fork.after_provider_call",
    "worker.bind.before_copy",
    "worker.bind.after_copy",
    "host.resolve.after_begin",
    "host.resolve.after_bind",
    "host.resolve.after_accept",
    "host.resolve.after_quarantine",
    "host.resolve.after_finish",
    "host.workspace.after_materialize",
    "host.workspace.after_rename",
    "host.workspace.after_record",
    "host.workspace.after_remove",
    "host.turn.before_claim",
    "host.turn.before_warm_start",
    "host.checkpoint.before",
    "host.checkpoint.after",
    "host.session.delete.after_commit",
    "host.session.delete.discard",
    "host.session.delete.after_tree_removed",
    "worker.session.after_start",  # a Claude Session's start beside its fork (`point_flows`)
    "worker.history.before_read",  # a cold start's re-bind: the next one asks again
    "worker.session.before_stop",  # a delete's stop of a warm runtime: sent to the next worker
    "host.store.wal_sync",  # any durable write's COMMIT made, its fsync not yet
)
WORKER_POINTS = (
    "worker.fork.before_provider_call",
    "worker.fork.after_provider_call",
    "worker.bind.before_copy",
    "worker.bind.after_copy",
)
"""The worker's points on a Claude or Codex fork: the first round arms one before its Claude
seed fork, the long profile's `CODEX_ROUND` before its Codex one."""
FORK_POINTS = tuple(
    p for p in POINTS if p.startswith(("host.fork.", "worker.fork.", "worker.bind."))
)
"""Points a `throughTurn` fork passes: what a Claude or Codex round arms before its seed fork."""
REACH_S = 30.0
"""A point's directed flow (`point_flows`) reaches it within this, on a loaded machine: the
round's load goes on that long for its points armed, and a lead awaited alone that long."""
FIRED_AT_LEAST = 23
"""Of `POINTS`, the long profile's points that fired (each armed at least once, with its flow):
why the others may not, docs/reliability.md §2."""
SHORT_LEADS = 1
"""The points the short profile's one free round leads (its first, beside its seed fork's)."""
COVER_POINT = "host.fork.after_dispatching"
"""The point `kill_on_fork` arms: the fork's `dispatching` row is durable when it kills."""
STOP_LATE_S = 30.0
"""A stop round whose worker ran at no look of the round tries on this long after it."""
ASK_SHARE = 0.15
START_POINT = "host.turn.before_warm_start"
START_ERROR_SHARE = 0.02
"""The share of submits that arm `START_POINT` `once:error` first (the contention soak's)."""
SUBMIT_REPLAY_SHARE = 0.15
"""Of the submits to a Session with an accepted one, the share that sends that one again
(`replay_submit`), half of them with another input."""
READ_SHARE = 0.08
"""The share of client steps that page or read a lineage (`read_chaos.Reader`)."""
"""The share of client steps that ask, answer or interrupt (`interaction_chaos.Asker`)."""
STALL_EVERY = 5
"""Round `n` is a stalled-git round when `n % STALL_EVERY == 3`, and one whose daemon is
SIGKILLed while the git stalls when `n % STALL_EVERY == 4` (both among the short profile's)."""
STALL_COMMANDS = ("add", "write-tree", "update-ref", "gc")
"""The shadow repositories' git commands a stall round arms."""
GIT_TIMEOUT_S = 2.0
"""`[workspace] timeout_s`: a stalled capture or ref transaction is killed this soon."""
GC_TIMEOUT_S = 8.0
"""`[workspace] long_timeout_s`: a stalled `gc` is killed this soon (the folder waits for it
that long; the default is 120 s). It bounds a worktree fork's tree too: ample for the soak's."""
GC_INTERVAL_S = 2.0
"""`[workspace] gc_interval_s`: a deleted Session's refs are dropped and collected this soon."""
FULL_DISK_BYTES = 64 * 1024
"""A full disk's RLIMIT_FSIZE: the write-ahead log reaches it within a few commits (a log that
holds more frames already, at its next one)."""
FULL_DISK_SETTLE_S = 60
"""After space returns, every Turn and operation in flight settles within this (no restart)."""
TREE_RETRY_S = 1.0
"""`[workspace] tree_retry_s`: the live daemon's first wait before it tries again a tree git
could not remove (then doubling): `FailedTreePin`'s tree goes soon after its pin is lifted."""
PIN_HELD_ROUNDS = 2
"""The rounds through which `FailedTreePin`'s tree stays unremovable (their kills meet it)."""
SLOW_FORK_EVERY = 9
"""The rounds (the 3rd, 12th, 21st, ...: a stall round, kill rounds, a full-disk one, a stall
and kill one) whose load includes a slow Tutti Agent fork (`slow_fork`)."""
SLOT_DELETE_EVERY = 8
"""The rounds (the 1st, 9th, ...) beside whose load `slot_delete`'s cells run."""
STOP_EVERY = 7
"""Round `n` SIGSTOPs a driver worker when `n % STOP_EVERY == 2` and it is neither a stall nor
a full-disk round (the 2nd: the short profile's; the 16th, 37th, 51st: the soak's)."""
STOPPED_GONE_S = BUSY_SILENCE_LIMIT_S
"""A stopped worker is gone within this of its stop: the supervisor kills a silent worker
past it whatever its CPU (one whose CPU stands still, as a stopped one's, at
`SILENCE_LIMIT_S` + `CPU_WINDOW_S`: `drivers/supervisor.py`); and then every Turn and
operation it held settles within it again."""


class World:
    """What the clients know (sessions, settled turns, operations) plus the chaos gate."""

    def __init__(self, home: Path, seed: int) -> None:
        self.home = home
        self.seed = seed
        self.lock = threading.Lock()
        # Every Session works in one git repository: each Turn checkpoints it (and the
        # submits change its files), so the kills also land mid-checkpoint.
        self.cwd = str(make_repo(home.parent / "repo"))
        self.repositories = {Path(self.cwd): repository_state(Path(self.cwd))}
        # The real git until a stall round arms it (shadow repositories' gits only).
        self.stall: StallingGit = stalling_git(home.parent / "stall", "add")
        self.env = {"PATH": path_with(self.stall.bin)}
        self.daemon = DaemonProcess(home, env=self.env).start()
        self.generation = 0
        self.running = threading.Event()
        self.stop = threading.Event()
        self.busy = 0
        self.idle = threading.Condition(self.lock)
        self.sessions: dict[str, list[str]] = {}  # live session → settled turn ids
        self.provider: dict[str, str] = {}  # session (live or not) → its provider
        self.made: Counter[str] = Counter()  # Sessions made by `session.create`, by provider
        self.ops: dict[str, str] = {}  # operation id → last seen status
        self.asked: dict[str, dict[str, Any]] = {}  # operation id → the request that made it
        # Session → its last accepted `turn.submit` and the Turn it made, sent again at times
        # (`replay_submit`), drawn from a generator of its own (the seed's draws unchanged).
        self.submitted: dict[str, tuple[dict[str, Any], str]] = {}
        self.replays = random.Random(f"submit-replay-{seed}")
        self.calls: Counter[str] = Counter()
        self.failures: list[str] = []
        self.undos: dict[str, str] = {}  # session → the undo tree its last restore answered
        self.answers: list[WorkspaceAnswer] = []  # restores' and diffs' answers
        self.diffed: set[WorkspaceAnswer] = set()  # answers whose changes were compared
        self.asker = Asker(self.provider.get)
        """Interactions and interrupts of the clients (`interaction_chaos`)."""
        self.faults = ProviderChaos(home.parent / "arms", seed)
        """A provider misbehaving on its stdout in odd rounds (`provider_chaos`)."""
        self.reader = Reader(home)
        self.slow = SlowFork(home, home.parent / "arms", seed)
        """A Tutti Agent fork the provider is slow to answer (`slow_fork`)."""
        """The clients' pagings and lineage reads, held to the store (`read_chaos`)."""
        self.retried: list[str] = []
        """The trees the live daemon's last `host.status` listed as retried (`retrying`)."""
        self.waiting: list[tuple[str, str]] = []
        """The deleted Sessions whose folder removal that answer listed as waiting for a worker
        call in flight (`homes_waiting`)."""
        self.points = PointTally()
        """The points the rounds armed `once:kill` and the `once:` points that fired."""
        self.choice = PointChoice(POINTS, self.points, seed, most=None if SOAK else SHORT_LEADS)
        """Which point a round arms: the least-armed it can reach (`point_choice`)."""
        self.met: set[str] = set()
        """The providers (Claude Code, Codex) whose work a kill since the last invariant check
        met (an active Turn or fork of theirs in the store as the daemon died or their worker
        was killed, or their worker died at an armed point)."""

    def session(self, c: Client, provider: str) -> str:
        """A new Session of `provider` for a point's flow (`point_flows.Reach`)."""
        return new_session(self, c, provider)

    def keep(self, method: str, params: dict[str, Any], answer: Future[Any]) -> None:
        """A flow's request, not awaited: its answer tallied `(flow)`, an operation noted."""

        def done(f: Future[Any]) -> None:
            try:
                status, body = f.result()
            except Exception:  # noqa: BLE001 - the daemon was killed under it: reply lost
                self.calls[f"{method} lost (flow)"] += 1
                return
            self.calls[f"{method} {status} (flow)"] += 1
            if status == 500:
                self.failures.append(f"flow: {method} → 500 {body}")
            if method in ("fork.create", "fork.resolve") and status < 400:
                note_operation(self, body["operation"], params if method == "fork.create" else None)

        answer.add_done_callback(done)

    def helper(self, c: Client, point: str, action: str) -> None:
        """A point a flow arms on its way to its own (`point_flows.Reach`): tallied apart
        unless it kills."""
        self.points.look(self.home)
        self.points.arm(point, kill=action.endswith("kill"))
        c.call("debug.failpoints", {"points": {point: action}})

    def meet(self) -> None:
        """The kill landing now meets the Claude and Codex work the store holds active."""
        busy = work_in_flight(self.home)
        self.met |= {p for p in (CLAUDE, CODEX) if busy[p]}
        self.asker.met(self.home)

    def client(self, mine: tuple[int, Client] | None) -> tuple[int, Client]:
        with self.lock:
            if mine is not None and mine[0] == self.generation:
                return mine
            return self.generation, self.daemon.client(timeout=5)

    def enter(self) -> bool:
        if not self.running.wait(0.2):
            return False
        with self.lock:
            if not self.running.is_set():
                return False
            self.busy += 1
        return True

    def leave(self) -> None:
        with self.lock:
            self.busy -= 1
            self.idle.notify_all()

    def pause(self) -> None:
        self.running.clear()
        with self.lock:
            assert self.idle.wait_for(lambda: self.busy == 0, 60), "clients did not park"


def call(w: World, c: Client, tag: str, method: str, params: dict[str, Any]) -> Any:
    """One request; the outcome is tallied as `method status/reason`."""
    try:
        status, body = c.call_raw(method, params)
    except (ClientTimeout, ClientClosed):
        w.calls[f"{method} lost"] += 1
        return None
    boundary = (body.get("params") or {}).get("forkBoundaryReason") if status >= 400 else None
    reason = "" if status < 400 else f" {body.get('reason')}" + (f"/{boundary}" if boundary else "")
    w.calls[f"{method} {status}{reason}"] += 1
    if status == 500:
        w.failures.append(f"{tag}: {method} → 500 {body}")
    return body if status < 400 else None


def client_loop(w: World, n: int) -> None:
    rng = random.Random(w.seed * 100 + n)
    starts = random.Random(f"warm-start-{w.seed}-{n}")  # apart: the seed's draws unchanged
    mine: tuple[int, Client] | None = None
    while not w.stop.is_set():
        if not w.enter():
            continue
        try:
            mine = w.client(mine)
            step(w, rng, mine[1], f"client {n}", starts)
        except Exception as exc:  # noqa: BLE001 - a bug in the test or an untyped failure
            w.failures.append(f"client {n}: {type(exc).__name__}: {exc}")
        finally:
            w.leave()


def step(w: World, rng: random.Random, c: Client, tag: str, starts: random.Random) -> None:
    with w.lock:
        sessions = list(w.sessions)
        ops = list(w.ops)
    if rng.random() < ASK_SHARE:
        w.asker.step(c, rng, sessions, tag)  # ask, answer or interrupt
        return
    if rng.random() < READ_SHARE:
        w.reader.step(c, rng, sessions, tag)  # page, read a lineage, or pin or rename
        return
    sid = rng.choice(sessions) if sessions else None
    action = rng.choices(
        [
            "create",
            "submit",
            "refresh",
            "fork",
            "fork_latest",
            "resolve",
            "ack",
            "get",
            "settings",
            "title",
            "pin",
            "goal",
            "delete",
            "replay",
            "restore",
            "workspace_diff",
        ],
        weights=[3 if len(sessions) < 30 else 0, 4, 6, 10, 4, 3, 3, 3, 2, 2, 1, 1, 0.6, 2, 3, 1],
    )[0]
    s = {"workspaceId": WS, "agentSessionId": sid}
    if action == "create" or sid is None:
        draw = rng.random()
        provider = (
            CLAUDE if draw < CLAUDE_SHARE else CODEX if draw < CLAUDE_SHARE + CODEX_SHARE else TUTTI
        )
        body = call(
            w,
            c,
            tag,
            "session.create",
            {
                "workspaceId": WS,
                "provider": provider,
                "title": f"s{rng.randrange(99)}",
                "cwd": w.cwd,
            }
            # A client's Codex Session asks before it runs a command (a round's does not).
            | ({"settings": CODEX_ASKS} if provider == CODEX else {}),
        )
        if body:
            made = body["session"]["agentSessionId"]
            with w.lock:
                w.sessions[made] = []
                w.provider[made] = provider
                w.made[provider] += 1
            if provider == CODEX:
                with w.asker.lock:
                    w.asker.codex_asks.add(made)
    elif action == "submit":
        text = rng.choice(["hello", "hello", "/slow 150 slow one", "/tool grep x", "/fail no"])
        (Path(w.cwd) / f"file-{rng.randrange(8)}.txt").write_text(f"{rng.random()}\n")
        if starts.random() < START_ERROR_SHARE:
            # That Turn (or the next warm one of any Session) fails on the host after its
            # claim, among the kills: settled `failed`, never left `active` (the live
            # `active_turn_worked` at the end, and no Turn active in any timeline).
            armed = call(w, c, tag, "debug.failpoints", {"points": {START_POINT: "once:error"}})
            w.calls["start error armed"] += armed is not None
            if armed is not None:
                w.points.arm(START_POINT, kill=False)  # it fires apart from a kill's arming
        with w.lock:
            again = w.submitted.get(sid) if w.replays.random() < SUBMIT_REPLAY_SHARE else None
            changed = w.replays.random() < 0.5
        if again is not None:
            replay_submit(w, c, tag, *again, changed=changed)
            return
        params = s | {"requestId": str(uuid.uuid4()), "input": [{"type": "text", "text": text}]}
        body = call(w, c, tag, "turn.submit", params)
        if body is not None:
            with w.lock:
                w.submitted[sid] = (params, body["turn"]["turnId"])
    elif action == "refresh":
        body = call(w, c, tag, "session.timeline", s | {"limit": 1000})
        if body:
            with w.lock:
                if sid in w.sessions:
                    w.sessions[sid] = [
                        t["turnId"] for t in body["turns"] if t["phase"] == "settled"
                    ]
    elif action == "fork":
        with w.lock:
            turns = list(w.sessions.get(sid, []))
        if turns:
            params = fork_params(sid, rng.choice(turns))
            if rng.random() < 0.3:
                params["workspace"] = "worktree"  # refused where the Turn has no checkpoint
                w.calls["fork.create asked worktree"] += 1
            body = call(w, c, tag, "fork.create", params)
            if body:
                note_operation(w, body["operation"], params)
    elif action == "fork_latest":
        params = fork_latest_params(sid)
        body = call(w, c, tag, "fork.create", params)
        if body:
            note_operation(w, body["operation"], params)
    elif action == "resolve":
        with w.lock:
            unknown = [o for o, status in w.ops.items() if status == "unknown"]
        if unknown:
            how = rng.choice(["inspect", "inspect", "adopt", "abandon"])
            body = call(w, c, tag, "fork.resolve", resolve_params(rng.choice(unknown), how))
            if body:
                note_operation(w, body["operation"])
    elif action in ("ack", "get") and ops:
        op_id = rng.choice(ops)
        method = "fork.acknowledge" if action == "ack" else "fork.get"
        body = call(w, c, tag, method, {"workspaceId": WS, "operationId": op_id})
        if body:
            op = body["operation"]
            note_operation(w, op)
    elif action == "settings":
        settings = w.asker.settings(str(sid), {"r": rng.randrange(1000)})
        call(w, c, tag, "session.updateSettings", s | {"settings": settings})
    elif action == "title":
        call(w, c, tag, "session.updateTitle", s | {"title": f"t{rng.randrange(1000)}"})
    elif action == "pin":
        call(w, c, tag, "session.pin", s | {"pinned": rng.random() < 0.5})
    elif action == "goal":
        if rng.random() < 0.5:
            call(w, c, tag, "goal.set", s | {"goal": "finish"})
        else:
            call(w, c, tag, "goal.clear", s)
    elif action == "replay":
        with w.lock:
            asked = sorted(w.asked.items(), key=lambda kv: kv[0])
        if asked:
            replay(w, rng, c, tag, *rng.choice(asked))
    elif action in ("restore", "workspace_diff"):
        workspace_step(w, rng, c, tag, str(sid), action)
    elif action == "delete":
        # A worktree fork's child keeps or removes its tree (a dirty one only by force); any
        # other Session ignores both fields.
        how: dict[str, Any] = rng.choice([{}, {"worktree": "keep"}, {"worktree": "remove"}])
        if how and rng.random() < 0.5:
            how = how | {"force": True}
        body = call(w, c, tag, "session.delete", s | how)
        if body is not None:
            if "worktree" in body:
                w.calls[f"session.delete worktree {body['worktree']['state']}"] += 1
            with w.lock:
                w.sessions.pop(sid, None)


def workspace_step(w: World, rng: random.Random, c: Client, tag: str, sid: str, how: str) -> None:
    """A `workspace.restore` of `sid` (to an earlier Turn's `before` or `after`, or the undo of
    its last restore; `force` at times) or a `session.workspaceDiff` (a Turn's, or from
    another Turn's `after`), racing the other clients' Turns, forks and deletes. Answers are
    kept for `check_workspace_answers`."""
    with w.lock:
        turns = list(w.sessions.get(sid, []))
        undo = w.undos.get(sid)
    request = workspace_request(rng, sid, turns, undo, how)
    if request is None:
        return
    method, s, asked = request
    try:
        status, body = c.call_raw(method, s)
    except (ClientTimeout, ClientClosed):
        w.calls[f"{method} lost"] += 1
        return
    if status >= 400:
        key, allowed = refusal(method, status, body)
        w.calls[key] += 1
        if not allowed:
            w.failures.append(f"{tag}: {method} {s} → {status} {body}")
        return
    w.calls[f"{method} {status}"] += 1
    answer = workspace_answer(method, sid, body, asked)
    with w.lock:
        w.answers.append(answer)
        if how == "restore":
            w.undos[sid] = answer.tree_from


def check_answers(w: World) -> list[str]:
    """`check_workspace_answers` over every answer so far (the clients parked)."""
    with w.lock:
        answers = list(w.answers)
    return [str(v) for v in check_workspace_answers(w.home, answers, diffed=w.diffed)]


def replay(
    w: World, rng: random.Random, c: Client, tag: str, op_id: str, params: dict[str, Any]
) -> None:
    """`fork.create` sent again under a `requestId` that made `op_id` (law 6): the same body
    gets that operation, whatever happened since (restarts, an ACK, a resolve); a changed body
    is refused (409 `agent_session_fork_request_conflict`, unless refused sooner)."""
    if rng.random() < 0.7:
        body = call(w, c, tag, "fork.create", params)
        if body is None:
            return
        if body["operation"]["operationId"] != op_id:
            w.failures.append(
                f"{tag}: request {params['requestId']} replayed got operation"
                f" {body['operation']['operationId']}, not {op_id} (law 6)"
            )
        note_operation(w, body["operation"])
    else:
        changed = params | {"targetAgentSessionId": str(uuid.uuid4())}
        if call(w, c, tag, "fork.create", changed) is not None:
            w.failures.append(
                f"{tag}: request {params['requestId']} with another target accepted (law 6)"
            )


def replay_submit(
    w: World, c: Client, tag: str, params: dict[str, Any], turn_id: str, *, changed: bool
) -> None:
    """`turn.submit` sent again under a `requestId` that made `turn_id`, across restarts: the
    same input gets that Turn (unless its Session was deleted meanwhile: 404); another input
    is never accepted (409 `turn_request_conflict`)."""
    if not changed:
        body = call(w, c, tag, "turn.submit", params)
        if body is not None and body["turn"]["turnId"] != turn_id:
            w.failures.append(
                f"{tag}: submit {params['requestId']} replayed got Turn"
                f" {body['turn']['turnId']}, not {turn_id}"
            )
        return
    other = params | {"input": [{"type": "text", "text": "another input"}]}
    if call(w, c, tag, "turn.submit", other) is not None:
        w.failures.append(f"{tag}: submit {params['requestId']} with another input accepted")


def note_operation(w: World, op: dict[str, Any], params: dict[str, Any] | None = None) -> None:
    with w.lock:
        w.ops[op["operationId"]] = op["status"]
        w.provider[op["targetAgentSessionId"]] = w.provider.get(
            op["sourceAgentSessionId"], "tutti-agent"
        )
        if params is not None and op["requestId"] == params["requestId"]:
            w.asked[op["operationId"]] = params  # made by this request, not a barrier's answer
        if op["status"] == "committed":
            w.sessions.setdefault(op["targetAgentSessionId"], [])


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """The daemon's home, its Claude Code pointed at a fake Messages API and its Codex at a fake
    Responses API that live as long."""
    # `[daemon]`: the worker's limit for a provider's fork call (`slow_fork`); `provider_chaos`:
    # Tutti Agent behind the relay, and Codex's app-server, Claude Code's CLI.
    workspace = (
        f"[workspace]\ntimeout_s = {GIT_TIMEOUT_S}\ngc_interval_s = {GC_INTERVAL_S}\n"
        f"long_timeout_s = {GC_TIMEOUT_S}\ntree_retry_s = {TREE_RETRY_S}\n"
    )
    config = daemon_table() + workspace + relay_table(tmp_path / "arms")
    fronts = {CODEX: codex_front(tmp_path / "arms"), CLAUDE: claude_front(tmp_path / "arms")}
    # A home too long for its workers' ipc paths, whatever the base temp dir: their sockets
    # live in the one directory outside it that `socket_dir_bounded` holds the kills to.
    home = tmp_path / ("h" * max(4, LONG_HOME - len(str(tmp_path)) - 1))
    with provider_env(CLAUDE, home, config=config, also=(CODEX,), commands=fronts):
        set_app_server_proof(home, True)  # the first daemon's (`proof_round`)
        yield home


def test_random_load_with_daemon_and_worker_sigkills_keeps_every_invariant(
    home: Path, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("AGENTHOST_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash soak seed: {seed} (AGENTHOST_SOAK_SEED={seed} replays it)")
    at = ["the set-up, before the rounds"]  # where a failure is (its report's "soak replay")
    request.node.stash[REPLAY] = lambda: replay_hint("the crash soak", seed, at[0])
    rng = random.Random(seed)
    w = World(home, seed)
    w.faults.setup(w.daemon.client(timeout=60), w.cwd)
    w.slow.setup(w.daemon.client(timeout=60), w.cwd)
    chaos: Counter[str] = forks_proven_by_app_server(w, (TUTTI, CODEX))
    checks = violations = 0
    claude_checks = codex_checks = spares_seen = 0
    proven: Counter[str] = Counter()  # the kills' unanswered Turns after the last restart
    restarts = 0  # the rounds' restarts of a killed daemon
    stops: Counter[str] = Counter()  # stopped workers, by provider
    stopped_gone_s: list[float] = []  # from each SIGSTOP to the stopped worker's end
    pin = FailedTreePin(seed)
    slots = SlotDelete(home.parent / "sd", seed)  # `slot_delete`'s cells
    threads = [
        threading.Thread(target=client_loop, args=(w, n), daemon=True) for n in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    first_point: str | None = None  # the first round's, on its Claude seed fork
    try:
        rounds = 0
        faulted: threading.Thread | None = None
        while rounds < ROUNDS:
            rounds += 1
            at[0] = f"round {rounds} of {ROUNDS}"
            if revive(w):
                chaos["failpoint_fired_late"] += 1
            # A Claude (Codex) round's seed fork is Claude's (Codex's); the first round (the
            # long profile's `CODEX_ROUND`), and such a round that draws a failpoint, arm it
            # before that fork is sent, so the kill lands on it.
            if rounds <= 2:
                provider = CLAUDE
            elif rounds == CODEX_ROUND:
                provider = CODEX
            else:
                draw = rng.random()
                provider = (
                    CLAUDE
                    if draw < CLAUDE_SHARE
                    else CODEX
                    if draw < CLAUDE_SHARE + CODEX_SHARE
                    else TUTTI
                )
            plan = rng.choice(["kill_daemon", "kill_daemon", "kill_worker", "arm_failpoint"])
            stall = rounds % STALL_EVERY in (3, 4)
            command, probe = "", ""
            full = rounds % STALL_EVERY == 0
            if full:
                plan = rng.choice(["full_disk", "full_disk_kill"])
            stop_round = rounds % STOP_EVERY == 2 and not stall and not full
            if stop_round:
                plan = "stop_worker"
                # The stop rounds' workers are Claude's, Codex's, Tutti Agent's in turn (the
                # seed fork of the same provider).
                provider = (CLAUDE, CODEX, TUTTI)[stops.total() % 3]
                if quiet_failpoints(w):
                    chaos["failpoint_fired_late"] += 1
            if stall:
                plan = "stall_git" if rounds % STALL_EVERY == 3 else "stall_kill"
                if quiet_failpoints(w):
                    chaos["failpoint_fired_late"] += 1
                probe = stall_probe(w)
                command = rng.choice(STALL_COMMANDS)
            early = None
            first = rounds == 1 or (SOAK and rounds == CODEX_ROUND)
            if provider != TUTTI and (first or plan == "arm_failpoint"):
                plan = "arm_failpoint"
                early = w.choice.pick(WORKER_POINTS if first else FORK_POINTS)
                chaos[f"armed_on_{provider}_fork"] += 1
                first_point = first_point or early
            if rounds == 1:
                pin.make(w)  # a failed fork's tree git cannot remove, through the kills
            elif rounds == 1 + PIN_HELD_ROUNDS:
                pin.lift()  # the live daemon (or a start) removes it from now on
            try:
                worker_pid = seed_fork(w, rng, provider, early)
            except (ClientTimeout, ClientClosed):
                # Only a daemon killed by a late armed point may leave the seed unanswered.
                assert revive(w), "a live daemon did not answer the round's seed"
                chaos["failpoint_fired_late"] += 1
                worker_pid = seed_fork(w, rng, provider, early)
            slow = rounds % SLOW_FORK_EVERY == 3
            if rounds % SLOT_DELETE_EVERY == 1:
                slots.start()  # on a daemon of its own, beside the round's load and kill
            if slow:
                w.slow.start(w.daemon.client(timeout=30))  # held about the worker's limit
            pending = [early] if early else []  # the round's points left to its load
            if free_round(rounds):
                # Points never armed yet, armed as the load starts (`PointChoice.lead`), each
                # with its directed flow, in turn: each but the last (the seed fork's point
                # first) fired, its daemon restarted and checked, before the next is armed.
                lead = w.choice.lead(
                    sum(free_round(n) for n in range(rounds, ROUNDS + 1)),
                    spare=plan == "kill_daemon" or early is not None,
                )
                chaos["lead_armed"] += len(lead)
                if early and lead:
                    checks += reach(w, early, chaos)
                    pending = []
                for n, point in enumerate(lead):
                    if not arm_reaching(w, point, chaos):
                        continue
                    if n < len(lead) - 1:
                        checks += reach(w, point, chaos)
                    else:
                        pending = [point]
            reach_by = time.monotonic() + REACH_S
            w.running.set()
            # `provider_chaos`: a fault among the round's load, met by its kill or not, and
            # running on across the round's checks (joined at the end).
            if rounds % 2 == 1 and not full and not (faulted and faulted.is_alive()):
                c = w.daemon.client(timeout=5)
                faulted = threading.Thread(
                    target=w.faults.guarded, args=(c, lambda: w.generation), daemon=True
                )
                faulted.start()
            began_round = time.monotonic()
            deadline = began_round + rng.uniform(0.5, 2.5)
            arm_at = began_round + rng.uniform(0.0, 0.5) if stall else None
            fill_at = began_round + rng.uniform(0.0, 0.5) if full else None
            stop_at = began_round + rng.uniform(0.0, 0.5) if stop_round else None
            stopped: tuple[str, int, float] | None = None  # provider, pid, when
            refused_before = _refused(w)
            while w.daemon.proc.poll() is None and (
                time.monotonic() < deadline
                # The load goes on until the round's armed points fired (their flows sent).
                or (time.monotonic() < reach_by and not all(reached(w, p) for p in pending))
            ):
                if arm_at is not None and time.monotonic() >= arm_at:
                    w.stall.arm(command)  # at a random moment of the clients' load
                    arm_at = None
                if fill_at is not None and time.monotonic() >= fill_at:
                    fill_disk(w)  # at a random moment of the clients' load
                    fill_at = None
                if stop_at is not None and time.monotonic() >= stop_at:
                    # At a random moment of the clients' load (a worker not running now,
                    # restarting, is tried again at the next look).
                    stopped = stop_worker(w, provider)
                    stop_at = None if stopped else stop_at
                time.sleep(0.05)
            if stop_at is not None and w.daemon.proc.poll() is None:
                # The stop round's worker was not running at any look of the round (restarting
                # under load): the stop lands once it runs again, the clients still running.
                with contextlib.suppress(AssertionError):
                    stopped = wait_for(lambda p=provider: stop_worker(w, p), STOP_LATE_S, 0.05)
            for point in pending:
                landed(w, point)
            action = "failpoint_fired" if w.daemon.proc.poll() is not None else plan
            # A daemon dead by itself was killed by an armed point, never by anything else (a
            # full disk's EFBIG, its SIGXFSZ, an error).
            assert w.daemon.proc.returncode in (None, -signal.SIGKILL), (
                seed,
                w.daemon.proc.returncode,
                w.daemon.tail_log(),
            )
            if full and fill_at is None:
                chaos["full_disk 503s"] += _refused(w) - refused_before
            if action == "full_disk":
                space_returns(w)
            if action == "stop_worker" and stopped is None:
                action = "stop_missed"  # no worker of the provider ran in the round
            if action in ("stall_git", "stall_kill"):
                with answered(w, command):
                    action = stall_met(w, command, kill=action == "stall_kill")
            elif stall:
                # An armed point of an earlier round killed the daemon first: no stall here
                # (a git it stalled lives on: the restart kills it, `check_processes` sees).
                w.stall.disarm()
                action = f"{action} (stall round)"
            if action == "kill_worker":
                # A Claude or Codex round's worker kill kills its provider's worker.
                victim = provider if provider != TUTTI else rng.choice([TUTTI, CLAUDE, CODEX])
                worker = worker_of(w.daemon, victim)
                if worker and worker.get("pid"):
                    if victim != TUTTI and work_in_flight(w.home)[victim]:
                        w.met.add(victim)
                    os.kill(int(worker["pid"]), signal.SIGKILL)
                    chaos[f"kill_worker {victim}"] += 1
            elif action == "arm_failpoint" and early is None:
                # The round's own point, its flow sent among the clients' load, which goes on
                # until the point fired.
                point = w.choice.pick()
                if arm_reaching(w, point, chaos):
                    with contextlib.suppress(AssertionError):
                        wait_for(lambda p=point: reached(w, p) or not alive(w), REACH_S)
                    landed(w, point)
                if not alive(w):
                    action = "failpoint_fired"
            # `failpoint_fired (stall round)` too: the stalled git of the daemon that died
            # lives on until the restart kills it.
            restarted = action.startswith(
                ("kill_daemon", "failpoint_fired", "stall_kill", "full_disk_kill")
            )
            if restarted:
                with w.lock:
                    w.daemon.kill()  # SIGKILL; in-flight calls end as `lost`
                    w.meet()  # what the daemon held active as it died
            w.pause()
            if (
                early
                and early.startswith("worker.")
                and not restarted
                and worker_died_at(w, provider, early, worker_pid)
            ):
                w.met.add(provider)
                chaos["worker_died_at_point"] += 1
            if restarted:
                restarts += 1
                if action == "full_disk_kill":
                    chaos[f"full_disk_start {full_disk_start(w)}"] += 1
                if restarts == 1:
                    set_app_server_proof(w.home, False)  # the default proof from now on
                with w.lock, busy_store(w, restarts % BUSY_START_EVERY == 1) as held:
                    w.daemon = DaemonProcess(w.home, env=w.env).start()
                    w.generation += 1
                chaos["busy_store_start"] += held
                # What the restarted daemon reads back (the clients parked).
                w.reader.sweep(w.daemon.client(timeout=30), list(w.sessions))
            if action != "stop_worker" or stopped is None:
                release_asks(w)
            grace = None
            if action == "full_disk":
                full_disk_settles(w)
                grace = LIVE_GRACE_S
            if action == "stop_worker" and stopped is not None:
                # The clients parked (a call the stopped worker held ends `lost` meanwhile).
                stopped_gone_s.append(stopped_worker_gone(w, *stopped))
                stops[stopped[0]] += 1
                release_asks(w)  # the stopped worker gone: Tutti Agent's asks answer again
                stopped_worker_replaced(w, *stopped)
                grace = LIVE_GRACE_S
            if action.startswith("stall_"):
                with answered(w, command):
                    stall_after(w, command, probe)
            if slow:
                chaos[f"slow_fork {settle_slow_fork(w)}"] += 1
            chaos[action] += 1
            # A Codex tool's detached process beside its running runtime for the live checks.
            chaos["detached_tool_process"] += w.asker.detach(
                w.daemon.client(), w.home, list(w.sessions), "round"
            )
            report = checked(w, live_grace_s=grace)
            checks += 1
            violations += len(report.violations)
            spares_seen = max(spares_seen, report.spare_homes)
            claude_checks += CLAUDE in w.met
            codex_checks += CODEX in w.met
            w.met.clear()
            assert report.ok, (seed, report.violations)
            slots_wrong = slots.join()  # the cells' end and their home's laws, if they ran
            violations += len(slots_wrong)
            assert not slots_wrong, (seed, slots_wrong)
            answers_wrong = check_answers(w)
            violations += len(answers_wrong)
            assert not answers_wrong, (seed, answers_wrong)
            reads_wrong = w.reader.check()  # the reads since the last check
            violations += len(reads_wrong)
            assert not reads_wrong, (seed, reads_wrong)
            # No process of a killed daemon (its workers, their app-servers) outlives it, and
            # the live one runs one worker per provider (the workers started ahead included).
            assert w.daemon.proc is not None
            w.asker.count_detached(w.home)  # what Codex's tools left beside their runtimes
            orphans = check_processes(w.home, w.daemon.proc.pid)
            orphans += check_daemon_runtimes(w.home, w.daemon.proc.pid, w.daemon.client())
            assert not orphans, (seed, orphans)
        # Every committed child that is alive resumes through the daemon (its provider state is
        # readable from its own home); a sample in the short profile.
        at[0] = f"the end's kills and checks, after round {rounds} of {ROUNDS}"
        w.pause()
        if revive(w):
            chaos["failpoint_fired_late"] += 1
        # Coverage by construction: a provider whose work no kill of the rounds met (the
        # timing and the seed's draws decide it), or rounds that killed nothing, get one kill
        # more, now: the daemon dies at a fork's point with that fork active in its store.
        covered = (CLAUDE, CODEX) if SOAK else (CLAUDE,)
        for provider in covered:
            if not (claude_checks if provider == CLAUDE else codex_checks):
                chaos[f"cover_kill {provider}"] += kill_on_fork(w, provider)
                spares_seen = max(spares_seen, check_now(w).spare_homes)
                checks += 1
                claude_checks += CLAUDE in w.met
                codex_checks += CODEX in w.met
                w.met.clear()
        if not killed_by(chaos):
            chaos[f"cover_kill {TUTTI}"] += kill_on_fork(w, TUTTI)
            spares_seen = max(spares_seen, check_now(w).spare_homes)
            checks += 1
            w.met.clear()
        pin.removed(w)  # lifted (if the rounds were fewer): the live daemon removes its tree
        if not w.slow.met_the_limit():
            # No round's slow fork was made `unknown` by the worker's limit (a kill came first,
            # or the provider answered in time): one more now, held past it, no chaos.
            w.slow.start(w.daemon.client(timeout=30), past_the_limit=True)
            chaos[f"slow_fork after {settle_slow_fork(w)}"] += 1
            check_now(w)
            checks += 1
        c = w.daemon.client(timeout=60)
        w.points.look(w.home)  # before `off` clears the markers
        c.call("debug.failpoints", {"points": {p: "off" for p in POINTS}})
        committed = [op for op, status in w.ops.items() if status == "committed"]
        resumed: Counter[str] = Counter()
        committed_by: Counter[str] = Counter()
        for op_id in committed:
            op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            target = op["targetAgentSessionId"]
            provider = w.provider.get(target, TUTTI)
            committed_by[provider] += 1
            if not SOAK and resumed[provider] >= (3 if provider == TUTTI else 1):
                continue  # a sample in the short profile: 3 Tutti Agent children, 1 of the others
            status, _ = c.call_raw("session.get", {"workspaceId": WS, "agentSessionId": target})
            if status == 200:
                wait_for(lambda t=target: _idle(c, t), timeout=60)
                assert run_turn(c, target, "resume")["outcome"] == "completed"
                resumed[provider] += 1
        spares_after_kills = spares_seen
        last_fork = {p: fork_once_more(w, c, p) for p in covered}
        # With the clients parked, the live laws too: no Turn stays active and no
        # operation keeps its fence with nothing working on it (`active_turn_worked`,
        # `fence_has_saga`); `completed_turn_recorded` runs in every check.
        release_asks(w)
        wait_for(lambda: all(_idle_or_gone(c, s) for s in list(w.sessions)), timeout=60)
        start_failed, left_active = start_failures(c, list(w.sessions))
        assert not left_active, (seed, "Turns left active", left_active)
        asked_violations = w.asker.check(c)
        if faulted is not None:
            faulted.join(120)
        if all(f.disturbed for f in w.faults.faults):
            # Every odd round's fault was skipped (its Session busy), lost, or met a kill, a
            # stop or a start failpoint (then only its settlement is judged): one more now, no
            # chaos, so `provider_fault_settles` judges an undisturbed one with the others.
            w.faults.guarded(c, lambda: w.generation)
            chaos["provider_fault_after"] += 1
        fault_violations = w.faults.check(c)
        if spares_seen == 0 and CLAUDE in covered:
            # No round's check met a spare home (a short run may not: each is made on the
            # Claude worker's own thread after a fork answers, and a kill's sweep removes it).
            # The Claude fork just above asked for one; the cells below restart the daemon,
            # whose start-up sweep removes it: walk it now, while this daemon keeps it.
            wait_for(lambda: _glob_spares(w.home), timeout=30)
            spares_seen = check_now(w).spare_homes
        chaos.update(tutti_fork_cells(w))  # with the clients parked and the chaos over
        chaos.update(codex_cut_cells(w))  # a Codex rollout cut back, refused, put back
        chaos.update(slots.ran)
        chaos.update(old_store_full_disk_start(w))  # the daemon restarted on the upgraded store
        c = w.daemon.client(timeout=60)
        final = assert_invariants(
            w.home,
            live_grace_s=LIVE_GRACE_S,
            repositories=w.repositories,
            retrying_trees=retrying(w),
            waiting_homes=waiting(w),
        )
        assert not check_answers(w), (seed, check_answers(w))
        # The law met what it holds: after every kill, the live daemon's sockets in the one
        # directory named for its run dir.
        assert socket_dirs_of(w.home) == [fallback_socket_dir(w.home / "run" / "workers")], seed
        w.reader.sweep(c, list(w.sessions))
        assert not w.reader.check(), seed
        checks += 1
        spares_seen = max(spares_seen, final.spare_homes)
        # The Turns the kills left unbound with their start's fate unknown: after a restart,
        # each Session's next Turn starts cold, and its re-bind's final history marks
        # host-only what the provider's thread cannot hold (`proven_absent`).
        tutti = [s for s in w.sessions if w.provider.get(s, TUTTI) == TUTTI]

        def restart() -> Client:
            with w.lock:
                w.daemon.stop()
                assert not check_processes(w.home, None), "a process outlived the stopped daemon"
                assert not check_socket_dirs(w.home, stopped_cleanly=True), seed
                w.daemon = DaemonProcess(w.home, env=w.env).start()
                w.generation += 1
            return w.daemon.client(timeout=60)

        proven, unproven = prove_after_restarts(w.home, tutti, restart)
        violations += len(unproven)
        assert not unproven, (seed, unproven)
    finally:
        w.stop.set()
        w.running.set()
        for t in threads:
            t.join(10)
        w.daemon.stop()
        pin.lift()
    failures = w.failures + w.asker.failures + w.reader.failures
    assert not failures, (seed, failures[:10])
    assert not asked_violations, (seed, asked_violations)
    assert not fault_violations and not w.faults.failures, (
        seed,
        fault_violations,
        w.faults.failures,
    )
    assert any(not f.disturbed for f in w.faults.faults), (
        "no provider fault round ran undisturbed",
        seed,
        w.faults.summary(),
    )
    assert_invariants(w.home, repositories=w.repositories)  # once more, the daemon stopped
    assert not check_processes(w.home, None), "a process outlived the stopped daemon"
    assert not check_socket_dirs(w.home, stopped_cleanly=True), seed
    checks += 1
    claude_children = sum(1 for p in w.provider.values() if p == CLAUDE) - w.made[CLAUDE]
    codex_children = sum(1 for p in w.provider.values() if p == CODEX) - w.made[CODEX]
    summary = [
        f"seed={seed} rounds={rounds} chaos={dict(chaos)} invariant_checks={checks} "
        f"violations={violations} resumed_children={dict(resumed)}"
        f" unanswered_after_restart={dict(proven)}"
        f" start_error_armed={w.calls['start error armed']} start_failed={start_failed}"
        f" failed_tree_pinned={pin.how or 'no (not root)'}",
        f"stopped workers: {dict(stops)} gone after "
        + " ".join(f"{s:.1f}s" for s in stopped_gone_s)
        + f" (bound {STOPPED_GONE_S:.0f} s; hung at {SILENCE_LIMIT_S + CPU_WINDOW_S:.0f} s)",
        f"claude: sessions_made={w.made[CLAUDE]} (of {w.made.total()}) fork_targets="
        f"{claude_children} forks_committed={committed_by[CLAUDE]} "
        f"checks_after_kills_of_claude_work={claude_checks} spare_homes_seen={spares_seen} "
        f"(after kills: {spares_after_kills}) last_fork={last_fork[CLAUDE]} "
        f"readable_children={final.readable_by_provider.get(CLAUDE, 0)} "
        f"completed_turns_read_in_transcripts={final.claude_turns_read}",
        f"codex: sessions_made={w.made[CODEX]} (of {w.made.total()}) fork_targets="
        f"{codex_children} forks_committed={committed_by[CODEX]} "
        f"checks_after_kills_of_codex_work={codex_checks} last_fork={last_fork.get(CODEX)} "
        f"readable_children={final.readable_by_provider.get(CODEX, 0)}",
        final.summary(),
        f"workspace answers checked: {len(w.answers)} (restores"
        f" {sum(a.method == 'workspace.restore' for a in w.answers)}, diffs compared"
        f" {len(w.diffed)})",
        w.asker.summary(),
        w.faults.summary(),
        w.points.summary(),
        w.choice.summary(),
        f"reads held to the store: {len(w.reader.reads)} "
        + " ".join(f"{k}={v}" for k, v in sorted(w.reader.calls.items())),
    ]
    summary += [f"  {k}: {v}" for k, v in sorted(w.calls.items())]
    print("\n".join(summary))
    outcomes = Counter({f"op_{k}": v for k, v in final.operations.items()}) + chaos
    LEDGER.record(
        "crash-soak",
        f"{CLIENTS} clients, seed {seed}",
        trials=rounds,
        outcomes=outcomes,
        invariant_checks=checks,
        violations=violations,
    )
    # The run really exercised the saga and the chaos: a SIGKILL of the daemon or a worker, or a
    # failpoint that killed one (in its round or later), and a check after it. Rounds that drew
    # none (five short ones may: seen once, 3 worker kills, 2 late failpoints) were followed by
    # one kill at a fork's point (`kill_on_fork`), so this holds unless that kill, its restart
    # or its check failed.
    assert sum(final.operations.values()) > 0 and killed_by(chaos) > 0, dict(chaos)
    # ... and Claude Code's laws under it: a Claude fork committed, a check ran after a kill
    # that met Claude work, and `spare_home_empty` walked a home with spares in it. The fork
    # after the chaos (`fork_once_more`, no point armed, the store free) commits
    # whatever the rounds' forks met; a check after a kill that met Claude work ran in a round
    # or, when no round's kill met it, after `kill_on_fork`'s.
    assert last_fork[CLAUDE] == "committed", ("the Claude fork after the chaos", seed, last_fork)
    assert claude_checks > 0, ("no check after a kill that met Claude work", seed, dict(chaos))
    assert spares_seen > 0, ("spare_home_empty never walked a spare home", seed)
    # `claude_turn_in_transcript` read completed Claude Turns (the fork after the chaos ran one).
    assert final.claude_turns_read > 0, ("no completed Claude Turn read in a transcript", seed)
    # ... and Codex's (the long profile's: its `CODEX_ROUND` arms a worker point on a Codex
    # fork): a Codex fork committed, and a check ran after a kill that met Codex work.
    if SOAK:
        assert last_fork[CODEX] == "committed", ("the Codex fork after the chaos", seed, last_fork)
        assert codex_checks > 0, ("no check after a kill that met Codex work", seed, dict(chaos))
    # ... and every point armed (the long profile's: `PointChoice.lead`), each with its flow,
    # and nearly every one fired; the short profile's first round's point fired.
    fired = [p for p in POINTS if w.points.fired[p]]
    if SOAK:
        assert not w.choice.unarmed(), ("points never armed", seed, w.choice.summary())
        assert len(fired) >= FIRED_AT_LEAST, (seed, w.choice.summary(), w.points.summary())
    assert first_point in fired, ("the first round's point", seed, w.points.summary())
    # ... and a stopped worker mid-fork (the 2nd round's, whatever the seed), replaced.
    assert stops.total() > 0, ("no worker was stopped", seed, dict(chaos))
    # ... and a slow provider fork made `unknown` by the worker's limit, abandoned at once.
    assert w.slow.met_the_limit() > 0, ("no slow fork met the worker's limit", seed, dict(chaos))


def release_asks(w: World) -> None:
    """The clients parked: the Turns asked and maybe still waiting for an answer are
    interrupted, as a person who never answers would (a full-disk round's: once space
    returned, its interrupt may still meet the full disk: 503, then its settle)."""
    w.asker.release(w.daemon.client(timeout=30), "release")


def stall_probe(w: World) -> str:
    """A stall round's own Session in the soak's folder (no client deletes it), with one Turn
    run: its later Turn is the round's liveness check."""
    c = w.daemon.client(timeout=30)
    sid = str(create_session(c, cwd=w.cwd)["agentSessionId"])
    run_turn(c, sid, "before the stall")
    return sid


@contextlib.contextmanager
def answered(w: World, command: str) -> Iterator[None]:
    """A stall round's call the daemon left unanswered fails saying whether the daemon lived
    (a dead one answers nothing: an armed point's kill) and with its log's tail."""
    try:
        yield
    except ClientTimeout as exc:
        rc = w.daemon.proc.poll() if w.daemon.proc is not None else None
        raise AssertionError(
            (w.seed, command, f"unanswered: {exc}", f"daemon exit {rc}", w.daemon.tail_log())
        ) from None


def start_failures(c: Client, sids: list[str]) -> tuple[int, list[str]]:
    """The Turns the clients' `START_POINT` error failed (their `error` names the point), and
    any Turn still active, over the live Sessions' timelines."""
    failed = 0
    active: list[str] = []
    for sid in sids:
        status, body = c.call_raw(
            "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}
        )
        if status != 200:
            continue  # deleted meanwhile
        for t in body["turns"]:
            if t["phase"] != "settled":
                active.append(f"{sid}/{t['turnId']}")
            elif START_FAILPOINT in str(t.get("error") or ""):
                failed += 1
    return failed, active


def quiet_failpoints(w: World) -> bool:
    """Before a stall round: every point an earlier round armed (`once:kill`, not yet hit) is
    turned off, so no kill of the daemon cuts the round's stall (a daemon killed then would
    leave the stalled git running until the restart, and answer no call of the round's
    checks). A daemon such a point killed meanwhile is restarted (`revive`): none is armed
    in a new daemon. True when it was (a point fired late)."""
    w.points.look(w.home)  # before `off` clears the markers
    try:
        w.daemon.client(timeout=10).call("debug.failpoints", {"points": {p: "off" for p in POINTS}})
    except (ClientTimeout, ClientClosed):
        assert revive(w), ("a live daemon did not answer debug.failpoints", w.seed)
        return True
    return False


def stall_met(w: World, command: str, *, kill: bool = False) -> str:
    """The stall armed in the round (now, if the round ended before its moment) is taken by a
    git of the daemon — for a ref transaction or a `gc`, a Session deleted here makes the
    janitor run one — and that git is killed at its bound, with its child. Returns the round's
    action: `stall_git <command>`, or `stall_missed <command>` (no such git ran meanwhile).
    `kill`: the daemon is SIGKILLed as soon as the git and its child stall instead, and the
    round's action is `stall_kill <command>` (the git outlived its daemon: the restart must
    kill it) or `stall_kill_late <command>` (its bound ended it before the kill landed)."""
    if not w.stall.taken() and not w.stall.arm_file.exists():
        w.stall.arm(command)
    c = w.daemon.client(timeout=30)
    if command in ("update-ref", "gc"):
        sid = create_session(c, cwd=w.cwd)["agentSessionId"]
        (Path(w.cwd) / "dropped.txt").write_text(f"{sid}\n")
        run_turn(c, sid, "to be dropped")
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    with contextlib.suppress(AssertionError):
        wait_for(w.stall.taken, 5 * GC_INTERVAL_S, interval=0.1)
    if not w.stall.taken() and w.stall.disarm():
        return f"stall_missed {command}"
    bound = GC_TIMEOUT_S if command == "gc" else GIT_TIMEOUT_S
    if kill:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(w.stall.pids()) == 2, bound, interval=0.02)
        with w.lock:
            w.daemon.kill()
        left = [p for p in w.stall.pids() if running(p)]
        return f"stall_kill {command}" if len(left) == 2 else f"stall_kill_late {command}"

    def ended() -> bool:
        # The stalled git's pid read (its file made but not yet written reads as none), and
        # neither it nor a child written since runs.
        pids = w.stall.pids()
        return bool(pids) and not [p for p in pids if running(p)]

    try:
        wait_for(ended, bound + 30, interval=0.1)
    except AssertionError:
        raise AssertionError(
            (w.seed, f"the stalled git {command} outlived its bound", w.stall.pids())
        ) from None
    return f"stall_git {command}"


def stall_after(w: World, command: str, probe: str) -> None:
    """The liveness law of a stall round, the clients parked: no lock file stays in the
    folder's shadow repository (one a git holds goes within moments; one a killed git left
    would refuse the folder's later writes: its captures for `index.lock`, its drops and
    collections for `packed-refs.lock`), and the round's Session's next Turn in the folder
    records both checkpoints (not `unavailable` `git_failed`). After a daemon killed while its
    git stalled, restarted since: no process of the stall runs (the start killed them)."""
    left = [p for p in w.stall.pids() if running(p)]
    assert not left, (w.seed, command, "a stalled git outlived its daemon's next start", left)
    repo = ShadowStore(w.home / "checkpoints").repo_dir(Path(w.cwd))
    try:
        wait_for(lambda: not _lock_files(repo), 10, interval=0.1)
    except AssertionError:
        raise AssertionError((w.seed, command, "lock files stay", _lock_files(repo))) from None
    c = w.daemon.client(timeout=30)
    wait_for(lambda: _idle(c, probe), 60)
    # A client's `once:error` armed in the round and not met by its own Turn (parked before
    # it submitted) would fail this Turn instead: this Turn judges the stall only.
    c.call("debug.failpoints", {"points": {START_POINT: "off"}})
    (Path(w.cwd) / "after-stall.txt").write_text(f"{command} {time.time_ns()}\n")
    for attempt in range(2):
        turn = run_turn(c, probe, "after the stall")
        ws = turn.get("workspace") or {}
        missed = (ws.get("beforeUnavailable") or {}).get("reason")
        if attempt == 0 and turn["outcome"] == "completed" and missed == "timed_out":
            # A capture past its bound on a machine loaded past its cores (the soak beside
            # others): the stall is judged by the next Turn, whose captures must both land.
            (Path(w.cwd) / "after-stall.txt").write_text(f"{command} {time.time_ns()}\n")
            continue
        break
    assert turn["outcome"] == "completed" and ws.get("before") and ws.get("after"), (
        w.seed,
        command,
        ws,
        turn,
    )


def stop_worker(w: World, provider: str) -> tuple[str, int, float] | None:
    """SIGSTOPs `provider`'s driver worker (once the kernel shows it stopped) and returns the
    provider, its pid and when; None when no worker of it runs now (or the daemon does not
    answer: an armed point killed it)."""
    try:
        worker = worker_of(w.daemon, provider)
    except (ClientTimeout, ClientClosed):
        return None
    if not worker or not worker.get("pid") or worker.get("state") != "ready":
        return None
    pid = int(worker["pid"])
    if provider != TUTTI and work_in_flight(w.home)[provider]:
        w.met.add(provider)
    try:
        sigstop(pid, timeout=5)
    except (ProcessLookupError, FileNotFoundError):
        return None  # it died meanwhile
    return provider, pid, time.monotonic()


def stopped_worker_gone(w: World, provider: str, pid: int, at: float) -> float:
    """The stopped worker's end, the clients parked: its pid is no running process
    within `STOPPED_GONE_S` of the stop (the supervisor declared it hung and killed it). A
    leftover is SIGCONTed (so it shows what it does) and the round fails. Returns the seconds
    from the stop to its end."""
    try:
        wait_for(lambda: not pid_running(pid), STOPPED_GONE_S - (time.monotonic() - at), 0.1)
    except AssertionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        raise AssertionError(
            (w.seed, f"the stopped {provider} worker {pid} outlived {STOPPED_GONE_S} s")
        ) from None
    return time.monotonic() - at


def stopped_worker_replaced(w: World, provider: str, pid: int, at: float) -> None:
    """After a stopped worker's end, the clients parked and no restart: every Turn and
    operation in flight settles within `STOPPED_GONE_S`, and a new Session of `provider`
    runs a Turn to its end on a new worker."""
    try:
        wait_for(lambda: not sum(work_in_flight(w.home).values()), STOPPED_GONE_S)
    except AssertionError:
        raise AssertionError(
            (
                w.seed,
                f"work stayed active after the {provider} worker stopped",
                work_in_flight(w.home),
            )
        ) from None
    c = w.daemon.client(timeout=60)
    sid = new_session(w, c, provider)
    turn = run_turn(c, sid, "after the stop")
    now = (worker_of(w.daemon, provider) or {}).get("pid")
    assert turn["outcome"] == "completed" and now and now != pid, (w.seed, provider, pid, turn)


def free_round(n: int) -> bool:
    """Round `n` is neither a stall, a full-disk nor a stop round (its plan a kill or a point)."""
    return n % STALL_EVERY in (1, 2) and n % STOP_EVERY != 2


def arm_reaching(w: World, point: str, chaos: Counter[str]) -> bool:
    """Arms `point` `once:kill` and sends its directed flow (`point_flows.FLOWS`), what the flow
    needs made first, the point not yet armed; its Session is the clients' from then on (but
    one it deletes). False, the point not armed, when that could not be made now (tallied
    `flow_not_ready`) or the daemon died under it (an earlier round's point fired: restarted)."""
    if revive(w):
        chaos["failpoint_fired_late"] += 1
    flow = FLOWS[point]
    try:
        c = w.daemon.client(timeout=30)
        try:
            ready = flow.ready(w, c)
        except (NotReady, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status == 500:
                raise
            w.calls[f"flow not ready {point}: {exc}"[:120]] += 1
            chaos["flow_not_ready"] += 1
            return False
        w.points.look(w.home)  # a marker an arming clears is counted first
        w.points.arm(point)
        c.call("debug.failpoints", {"points": {point: "once:kill"}})
        flow.send(w, c, ready)
    except (ClientTimeout, ClientClosed):
        # Only a daemon that a point armed meanwhile killed may not answer.
        assert not alive(w), w.daemon.tail_log()
        return False
    chaos["flow_sent"] += 1
    with w.lock:
        if not flow.deletes:
            w.sessions.setdefault(ready.sid, [ready.turn_id] if ready.turn_id else [])
        if ready.op_id:
            w.ops.setdefault(ready.op_id, "unknown")
    return True


def reach(w: World, point: str, chaos: Counter[str]) -> int:
    """The clients parked, `point` (armed, its flow sent) is awaited for `REACH_S`: a daemon it
    killed is restarted and every law checked (`check_now`); one that did not fire is turned off
    (it would cut the next point's flow). Returns the checks run (0 or 1)."""
    with contextlib.suppress(AssertionError):
        wait_for(lambda: reached(w, point) or not alive(w), REACH_S)
    chaos[f"reach {'fired' if reached(w, point) else 'missed'}"] += 1
    landed(w, point)
    if revive(w):
        w.reader.sweep(w.daemon.client(timeout=30), list(w.sessions))
        check_now(w)
        return 1
    return 0


def landed(w: World, point: str) -> None:
    """After `point`'s wait: a host point that fired has its daemon dead (its marker is written
    just before the SIGKILL lands: awaited here, or the round's next call goes to a dying
    daemon); one that did not fire is turned off, so no later step of the round meets a daemon
    it killed meanwhile."""
    if host_fired(w.daemon, point):
        assert w.daemon.proc is not None
        try:
            w.daemon.proc.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError((w.seed, point, "fired, its daemon lives on")) from None
    elif not worker_fired(w.daemon, point) and alive(w):
        w.points.look(w.home)  # before `off` clears the markers
        try:
            w.daemon.client(timeout=10).call("debug.failpoints", {"points": {point: "off"}})
        except (ClientTimeout, ClientClosed):
            assert not alive(w), w.daemon.tail_log()  # it fired at last: its daemon died


def reached(w: World, point: str) -> bool:
    """`point`'s `once:` marker: it fired since its arming (which cleared the last one)."""
    return host_fired(w.daemon, point) or worker_fired(w.daemon, point)


def alive(w: World) -> bool:
    return w.daemon.proc is not None and w.daemon.proc.poll() is None


def new_session(w: World, c: Client, provider: str) -> str:
    """A new Session of `provider` in the soak's folder, counted as the soak's."""
    sid: str = c.call("session.create", {"workspaceId": WS, "provider": provider, "cwd": w.cwd})[
        "session"
    ]["agentSessionId"]
    with w.lock:
        w.provider[sid] = provider
        w.made[provider] += 1
    return sid


def fill_disk(w: World) -> None:
    """The daemon's disk is full: a write by the daemon (or by a process it starts from now on)
    past `FULL_DISK_BYTES` of a file fails with EFBIG; and so does every rollout append of a
    tutti-agent app-server already running (its limit the size of the smallest rollout it has
    open): its Turn must still end, `failed` (docs/tutti-agent.md, `turn/start`), or it stays
    active past `full_disk_settles`."""
    assert w.daemon.proc is not None
    _, hard = resource.prlimit(w.daemon.proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(w.daemon.proc.pid, resource.RLIMIT_FSIZE, (FULL_DISK_BYTES, hard))
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(w.daemon.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                if "tutti-agent" not in " ".join(proc.cmdline()):
                    continue
                sizes = [
                    os.path.getsize(f.path)
                    for f in proc.open_files()
                    if os.path.basename(f.path).startswith("rollout-")
                ]
                if sizes:
                    _, hard = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)
                    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (min(sizes), hard))


def full_disk_start(w: World) -> str:
    """A start while the disk is still full (the killed daemon's RLIMIT_FSIZE on the new one,
    its log a file of its own): it fails at once — no "deferred" retry, a full disk is no
    other process's lock — saying that the disk holding the store is full (`StoreDiskFull`),
    or, with nothing to write past the limit, it serves (stopped then). Either way within
    the time a start takes, never the 30 s of a busy store's retries. Returns which."""
    log_path = w.home.parent / f"full-start-{w.generation}.log"

    def full() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (FULL_DISK_BYTES, hard))

    d = DaemonProcess(w.home, env=w.env, preexec_fn=full)
    d.log_path = log_path
    try:
        d.start(timeout=60)
    except RuntimeError:
        code = d.wait_exit(10)
        said = log_path.read_text(errors="replace")
        assert code == 1 and "deferred" not in said, (w.seed, code, said[-3000:])
        store = str(w.home / "store.sqlite3")
        assert "cannot start: " in said and store in said and "full" in said, (w.seed, said)
        return "refused"
    d.stop()
    return "served"


def space_returns(w: World) -> None:
    """The disk has room again: the daemon's RLIMIT_FSIZE is lifted, then that of every process
    under it (those started while the disk was full inherited the limit)."""
    assert w.daemon.proc is not None
    pids = [w.daemon.proc.pid]
    with contextlib.suppress(psutil.Error):
        pids += [p.pid for p in psutil.Process(w.daemon.proc.pid).children(recursive=True)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))


def full_disk_settles(w: World) -> None:
    """Once space returns, with no restart and the clients parked, no Turn and no operation
    stays active: what the full disk refused is retried until it lands."""
    try:
        wait_for(lambda: not sum(work_in_flight(w.home).values()), FULL_DISK_SETTLE_S)
    except AssertionError:
        raise AssertionError(
            (w.seed, "work stayed active after space returned", work_in_flight(w.home))
        ) from None


def _refused(w: World) -> int:
    with w.lock:
        return sum(n for k, n in w.calls.items() if " 503" in k)


def _lock_files(repo: Path) -> list[str]:
    """The lock files in `repo`, walked while its gits run: a directory one of them removes
    under the walk (an `objects/xx` that a `gc` emptied) is skipped, not an error (`rglob`
    raised FileNotFoundError for it: seed 17, short profile, a stall round)."""
    found = []
    for top, _, names in os.walk(repo):  # errors (a directory gone meanwhile) are skipped
        found += [str(Path(top, n).relative_to(repo)) for n in names if n.endswith(".lock")]
    return sorted(found)


BUSY_START_EVERY = 4
"""The 1st, 5th, 9th, ... restart of a killed daemon meets a store another process holds
(`WriteLockHolder`) for `BUSY_START_S`, past the daemon's busy budget (10 s) whenever its
start opens the store: every start-up write waits for it with backoff
(`recovery.start_write`), none is skipped and the start does not fail; the laws are checked
after as after any restart. No draw of the seed's: a seed replays as before."""
BUSY_START_S = 12.0


@contextlib.contextmanager
def busy_store(w: World, held: bool) -> Iterator[int]:
    """With `held`, another process holds the store's write lock from now until `BUSY_START_S`
    has passed (the start under it waits for it); yields 1 if held, else 0."""
    if not held:
        yield 0
        return
    holder = WriteLockHolder(w.home / "store.sqlite3").acquire()
    release = threading.Timer(BUSY_START_S, holder.release)
    release.start()
    try:
        yield 1
    finally:
        release.join()


def revive(w: World) -> bool:
    """An armed `once:kill` point may fire after the round's chaos step (a saga still in
    flight reaches it while the clients are parked): restart a daemon that died that way."""
    with w.lock:
        if w.daemon.proc is None or w.daemon.proc.poll() is None:
            return False
        w.daemon.kill()
        w.meet()
        w.daemon = DaemonProcess(w.home, env=w.env).start()
        w.generation += 1
        return True


def fork_once_more(w: World, c: Client, provider: str) -> str:
    """With the chaos over (no point armed, no fault, the clients parked), a live Session of
    `provider` runs a Turn and forks it (`latestSettled`), a new one if none of the rounds'
    takes the Turn (deleted, busy, or a Turn that never reached its provider): Claude's spare
    homes its answer leaves are what the final live check's `spare_home_empty` walks, whatever
    the kills swept before. Returns the operation's status at its end."""
    with w.lock:
        mine = [sid for sid in w.sessions if w.provider.get(sid) == provider]
    for sid in [*mine, None]:
        if sid is None:
            sid = new_session(w, c, provider)
            with w.lock:
                w.sessions[sid] = []
        try:
            if not _idle(c, sid) or run_turn(c, sid, "once more")["outcome"] != "completed":
                continue
        except ApiError:
            continue  # deleted meanwhile, or refused: another Session then
        status, body = c.call_raw("fork.create", fork_latest_params(sid))
        if status >= 400:
            continue
        note_operation(w, body["operation"])
        op_id = body["operation"]["operationId"]

        def ended(op_id: str = op_id) -> str | None:
            op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            return None if op["status"] == "accepted" else str(op["status"])

        return str(wait_for(ended, 60))
    return f"no {provider} Session forked"


def kill_on_fork(w: World, provider: str) -> int:
    """One kill more after the rounds, the clients parked: a new Session of `provider` runs a
    Turn and forks it with `host.fork.after_dispatching` armed `once:kill`, so the daemon dies
    with that fork active in its store (`World.meet` sees it: `provider`'s work met); then it
    is restarted. Returns 1."""
    quiet_failpoints(w)  # a point a round armed fires in no step of this one
    c = w.daemon.client(timeout=60)
    sid = new_session(w, c, provider)
    turn = run_turn(c, sid, "before the kill")
    with w.lock:
        w.sessions[sid] = [turn["turnId"]]
    w.points.arm(COVER_POINT)
    c.call("debug.failpoints", {"points": {COVER_POINT: "once:kill"}})
    c.submit("fork.create", fork_params(sid, turn["turnId"]))  # its reply dies with the daemon
    assert w.daemon.proc is not None
    try:
        w.daemon.proc.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError((w.seed, f"{COVER_POINT} not reached", w.daemon.tail_log())) from None
    with w.lock:
        w.daemon.kill()
        w.meet()
        w.daemon = DaemonProcess(w.home, env=w.env).start()
        w.generation += 1
    w.reader.sweep(w.daemon.client(timeout=30), list(w.sessions))
    return 1


def _glob_spares(home: Path) -> list[Path]:
    """The Claude spare homes made ahead under `home`'s runtimes (`SPARE_HOME_PREFIX`)."""
    return list((home / "runtimes").glob(f"*/{SPARE_HOME_PREFIX}*"))


def check_now(w: World) -> Any:
    """A round's checks, the clients parked: every law, the workspace answers and reads so far,
    and no process of a killed daemon left. Returns the invariant report."""
    report = checked(w)
    assert report.ok, (w.seed, report.violations)
    answers_wrong = check_answers(w)
    assert not answers_wrong, (w.seed, answers_wrong)
    reads_wrong = w.reader.check()
    assert not reads_wrong, (w.seed, reads_wrong)
    assert w.daemon.proc is not None
    w.asker.count_detached(w.home)  # what Codex's tools left beside their runtimes
    orphans = check_processes(w.home, w.daemon.proc.pid)
    orphans += check_daemon_runtimes(w.home, w.daemon.proc.pid, w.daemon.client())
    assert not orphans, (w.seed, orphans)
    return report


def killed_by(chaos: Counter[str]) -> int:
    """The kills of the run so far: SIGKILLs of the daemon (a full disk's too) or of a worker,
    points that killed one (in their round, later, or a worker's at the round's armed point),
    and `kill_on_fork`'s."""
    return sum(
        n
        for action, n in chaos.items()
        if action.startswith(
            (
                "kill_daemon",
                "kill_worker ",  # `kill_worker <provider>`: a worker that ran, killed
                "failpoint_fired",
                "stall_kill",
                "full_disk_kill",
                "worker_died_at_point",
                "cover_kill",
            )
        )
    )


def worker_died_at(w: World, provider: str, point: str, pid: int | None) -> bool:
    """The point armed on the round's Claude or Codex fork fired, and in `provider`'s worker: it
    was replaced (another provider's fork of a client may have reached the point first). A point an
    earlier round armed may kill the daemon meanwhile (its `host.status` is then answered by
    nobody): it is restarted here (`revive`), and False."""
    if pid is None or not worker_fired(w.daemon, point):
        return False
    try:
        wait_for(lambda: (worker_of(w.daemon, provider) or {}).get("pid") != pid, 10)
    except AssertionError:
        return False
    except (ClientTimeout, ClientClosed):
        assert revive(w), ("a live daemon did not answer host.status", w.seed, w.daemon.tail_log())
        return False
    return True


def seed_fork(w: World, rng: random.Random, provider: str, arm: str | None) -> int | None:
    """One fork per round on a fresh, settled source of `provider`, left in flight while the
    clients and the chaos run, so every round exercises the saga whatever the random clients
    picked; `arm` is armed `once:kill` just before it is sent. Returns `provider`'s worker's
    pid then (None if there is none)."""
    c = w.daemon.client(timeout=30)
    worktree = rng.random() < 0.5
    sid = new_session(w, c, provider)
    text = (
        f"/write seed.md seed {rng.randrange(1000)}" if worktree and provider == TUTTI else "seed"
    )
    turn = run_turn(c, sid, text)
    with w.lock:
        w.sessions[sid] = [turn["turnId"]]
    worker = worker_of(w.daemon, provider)
    if arm is not None:
        w.points.arm(arm)
        c.call("debug.failpoints", {"points": {arm: "once:kill"}})

    def register(future: Any) -> None:
        try:
            status, body = future.result()
        except Exception:  # noqa: BLE001 - the daemon was killed under it: reply lost
            w.calls["fork.create lost"] += 1
            return
        w.calls[f"fork.create {status}"] += 1
        if status < 400:
            note_operation(w, body["operation"], params)

    params = fork_params(sid, turn["turnId"])
    if worktree:
        params["workspace"] = "worktree"
        w.calls["fork.create asked worktree (seed)"] += 1
    c.submit("fork.create", params).add_done_callback(register)
    return int(worker["pid"]) if worker and worker.get("pid") else None


def retrying(w: World) -> list[str]:
    """The trees the live daemon's `host.status` lists as retried (`worktree_retrying`: git
    could not remove them, or a Session works in them). A daemon that does not answer (a point
    armed in a round fired since) lists what its last answer did: the tree it retried is still
    there, left to the restart."""
    with contextlib.suppress(ClientTimeout, ClientClosed):
        status = w.daemon.client(timeout=10).call("host.status")
        w.retried, w.waiting = worktree_retrying(status), homes_waiting(status)
    return list(w.retried)


def waiting(w: World) -> list[tuple[str, str]]:
    """The deleted Sessions' folders the status `retrying` read last listed as waiting for a
    worker call in flight (a removal may wait for it up to its bound, `deleted_home_gone`)."""
    return list(w.waiting)


def checked(w: World, *, live_grace_s: float | None = None) -> InvariantReport:
    """`check_invariants` over the soak's home, with the person's repository as it was and the
    trees the live daemon retries (a failed fork's among them may stay past the grace)."""
    w.points.look(w.home)
    return check_invariants(
        w.home,
        live_grace_s=live_grace_s,
        repositories=w.repositories,
        retrying_trees=retrying(w),
        waiting_homes=waiting(w),
    )


class FailedTreePin:
    """A failed fork's tree git cannot remove, through kills: before the first round's seed
    fork (the clients parked), a new Tutti Agent Session in the repository writes a file and
    forks it into a worktree with `host.workspace.after_rename` armed `once:sleep` (the tree
    waits whole at its path, not yet recorded) and `host.workspace.after_record` armed
    `once:error` or, drawn at random, `once:kill` (the daemon dies with the tree recorded and
    its operation `prepared`); while the tree waits, a file of the soak's own in it is made
    immutable (`chattr +i`: as root only). The fork fails (the saga's failure, or start-up
    recovery's after the restart), git cannot remove its tree, and the live daemon must list
    it in `host.status` → `worktreeRemovals` (`git_failed`) and keep retrying it: every check
    passes its `retrying_trees`, and the rounds' kills and restarts (`PIN_HELD_ROUNDS` of
    them) meet it. Then the pin is lifted, and the live daemon (or a start) must remove the
    tree and record it `removed` by itself before the end's checks."""

    POINTS = ("host.workspace.after_rename", "host.workspace.after_record")

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"failed-tree-pin-{seed}")  # the seed's draws unchanged
        self.file: Path | None = None
        self.op_id: str | None = None
        self.tree = ""
        self.how = ""

    def make(self, w: World) -> None:
        if os.geteuid() != 0:
            return
        c = w.daemon.client(timeout=60)
        sid = str(create_session(c, provider=TUTTI, cwd=w.cwd, title="failed")["agentSessionId"])
        turn = run_turn(c, sid, f"/write failed-fork.txt pinned {self.rng.randrange(1000)}")
        self.how = self.rng.choice(["error", "kill"])
        w.points.arm(self.POINTS[0], kill=False)  # their firings are the pin's
        w.points.arm(self.POINTS[1], kill=self.how == "kill")
        c.call(
            "debug.failpoints",
            {"points": {self.POINTS[0]: "once:sleep:3000", self.POINTS[1]: f"once:{self.how}"}},
        )
        params = fork_params(sid, turn["turnId"]) | {"workspace": "worktree"}
        reply = c.submit("fork.create", params)
        deadline = time.monotonic() + 30
        while self.file is None and time.monotonic() < deadline:
            found = _fork_tree(w.home, params["requestId"])
            if found is not None and (Path(found[1]) / ".git").exists():
                self.op_id, self.tree = found[0], found[1]
                self.file = _pin(Path(found[1]) / ".soak-pin")
                break
            time.sleep(0.02)
        assert self.file is not None, (w.seed, "the failed fork's tree was never pinned")
        if self.how == "kill":
            assert w.daemon.proc is not None
            w.daemon.proc.wait(60)  # killed at `after_record`, its tree recorded
            with w.lock:
                w.daemon.kill()
                w.meet()
                w.daemon = DaemonProcess(w.home, env=w.env).start()
                w.generation += 1
        else:
            reply.result(60)  # accepted (202): the saga fails it at `after_record`
            wait_for(lambda: _op_status(w.home, str(self.op_id)) == "failed", 60)
            c.call("debug.failpoints", {"points": dict.fromkeys(self.POINTS, "off")})
        w.calls[f"fork.create worktree failed ({self.how}), its tree pinned"] += 1
        # The live daemon retries the tree git could not remove (the saga's removal, or the
        # start's), and says so.
        wait_for(lambda: self.tree in retrying(w), 30)

    def lift(self) -> None:
        """The pinned file is a plain file again (the tree's removal takes it)."""
        if self.file is not None:
            subprocess.run(["chattr", "-i", str(self.file)], check=False, capture_output=True)
            self.file = None

    def removed(self, w: World) -> None:
        """Lifted, the tree goes: removed and recorded `removed` by the live daemon."""
        self.lift()
        if self.op_id is None:
            return
        try:
            wait_for(lambda: _tree_state(w.home, str(self.op_id)) == "removed", 120, 0.5)
        except AssertionError:
            raise AssertionError(
                (w.seed, "the failed fork's tree stayed", self.tree, retrying(w))
            ) from None
        assert not Path(self.tree).exists(), (w.seed, self.tree)


def _pin(path: Path) -> Path:
    path.write_text("a file git cannot unlink for a moment\n")
    subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
    return path


def _store_row(home: Path, sql: str, params: tuple[str, ...]) -> tuple[Any, ...] | None:
    """One row read beside the daemon (read-only)."""
    import apsw

    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.set_busy_timeout(10_000)
        row = conn.execute(sql, params).fetchone()
    finally:
        conn.close()
    return None if row is None else tuple(row)


def _fork_tree(home: Path, request_id: str) -> tuple[str, str] | None:
    """The operation of fork request `request_id` and its tree's path (None: none yet)."""
    import json

    row = _store_row(
        home,
        "SELECT operation_id, workspace_json FROM fork_operations WHERE request_id = ?",
        (request_id,),
    )
    if row is None or not row[1]:
        return None
    return str(row[0]), str(json.loads(row[1])["path"])


def _op_status(home: Path, op_id: str) -> str | None:
    row = _store_row(home, "SELECT status FROM fork_operations WHERE operation_id = ?", (op_id,))
    return None if row is None else str(row[0])


def _tree_state(home: Path, op_id: str) -> str | None:
    row = _store_row(
        home, "SELECT workspace_state FROM fork_operations WHERE operation_id = ?", (op_id,)
    )
    return None if row is None else str(row[0])


def settle_slow_fork(w: World) -> str:
    """The round's slow fork ended (an `unknown` one abandoned at once) and its Session's next
    Turn run, the clients parked; a daemon a late armed point killed meanwhile is restarted
    (`revive`) and the fork settled on the new one."""
    try:
        return w.slow.settle(w.daemon.client(timeout=60))
    except (ClientTimeout, ClientClosed):
        assert revive(w), ("a live daemon did not settle the slow fork", w.seed)
        return w.slow.settle(w.daemon.client(timeout=60))


def _idle_or_gone(c: Client, sid: str) -> bool:
    status, body = c.call_raw("session.get", {"workspaceId": WS, "agentSessionId": sid})
    return status == 404 or (status == 200 and body["session"]["activeTurnId"] is None)


def _idle(c: Client, sid: str) -> bool:
    try:
        session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    except ApiError:
        return False
    return session["activeTurnId"] is None


def test_turn_active_at_daemon_kill_is_settled_after_restart(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    c = d.client()
    sid = c.call("session.create", {"workspaceId": WS, "provider": "tutti-agent"})["session"][
        "agentSessionId"
    ]
    params = {"workspaceId": WS, "agentSessionId": sid, "requestId": "slow"}
    c.call("turn.submit", params | {"input": [{"type": "text", "text": "/slow 60000 x"}]})
    d.kill()
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        # Settled (interrupted or failed) by the restarted daemon, within a generous bound.
        wait_for(lambda: _idle(c, sid), timeout=8)
        turns = c.call("session.timeline", {"workspaceId": WS, "agentSessionId": sid})["turns"]
        assert turns[0]["outcome"] == "interrupted"
        # The Session takes turns again.
        assert run_turn(c, sid, "after the restart")["outcome"] == "completed"
    finally:
        d.stop()
