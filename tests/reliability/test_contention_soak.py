"""Contention soak: many Sessions, concurrent turns, forks of both point kinds (some into a
worktree: half the Sessions work in a git repository made here), ACKs,
`fork.resolve` of unknown forks (some forced by a one-shot failpoint), submits whose start
fails on the host after the claim (`host.turn.before_warm_start` armed `once:error`: the Turn
settles `failed`) and deletes of fork children and, rarely, of sources, from several clients,
while an external process takes SQLite's write lock on the store at random (a real fault,
`tests/support/store_lock.py`) and the daemon's busy budget is short. Every request is
answered (no client timeout), none with status 500; once the lock is gone for good every Turn
settles and every operation ends, and the invariant checker — with the live laws (no Turn
active without a runtime, no fence without its saga) — finds no violation, live and stopped.

A `run/`-deletion phase runs in the same chaos: `run/` is removed under the live daemon (as a
cleaner of old /tmp entries would) and a second `agenthost serve` is started on the home at
once. Every such `serve` must be refused (exit 1), no Turn may end with the "host restarted"
error of a startup recovery (none ran on the live store), the clients already connected keep
being answered, and the daemon makes `run/` again so a new client gets in.

Descriptor pressure joins the chaos: the daemon runs with a low fd limit (soft and hard
`FD_LIMIT`) and listens on a CURVE TCP endpoint too; a flooder opens bursts of connections —
idle ZeroMQ clients and raw never-greeting connections on ipc, unauthenticated ones on TCP —
each several times what the daemon may hold, holds them, drops them. The daemon must refuse or
shed what it cannot hold and stay alive; the clients' own connections keep being answered.

A worktree fork's child deleted by a client asks, at random, to keep its tree or to remove it
(`force` or not: a dirty tree is refused with 409 `workspace_worktree_dirty`); the person's
repository must gain nothing but the forks' worktrees and `agenthost/` branches
(`repository_kept`, law 10). Half the removals (as root; forced then) first make a file of the
soak's own in the tree immutable, so git cannot remove it: the delete answers `removing`, the
pin is lifted 1-5 s later, and the live daemon must remove and record every such tree by itself
(`TreePins`; its retries from `[workspace] tree_retry_s` = 1 s): none is left `removing` once
the chaos is over (a run whose chaos pinned none pins a live worktree child's tree after it, if
one is left). After the chaos a worktree fork is failed before its dispatch with a file of its
tree pinned so (`TreePins.fail_one`): the live daemon must remove the failed fork's tree and
record it `removed` by itself too. Before some `remove` deletes a person starts a Session in
the child's tree through a symlink to it (`start_by_a_link`; a run whose chaos started none
starts one after it): the delete must keep the tree and name that Session
(`kept_for_the_link`), which works there to the end (the worktree law). After the chaos the
daemon's ipc listeners come down to the current three plus the ones old clients may still pin
(`OLD_LISTENERS_KEPT` per endpoint), whatever the number of re-binds.

The clients restore folders and read diffs in the same chaos (`workspace.restore` to a Turn's
`before` or `after` or the undo of the last restore, `force` at times; `session.workspaceDiff`),
racing Turns, forks (worktree ones too) and deletes: a refusal a law allows
(`agent_session_busy`, `workspace_shared`, `workspace_checkpoint_missing`,
`workspace_unavailable`, `store_busy`, a deleted Session's 404) is counted, any other error is
a failure, and the answers are held to the store after the chaos (`check_workspace_answers`:
`restore_undo_kept`, `workspace_answer`).

Then, with the chaos over, a held-events burst: a subscriber connected all along hears
concurrent forks (each boundary asked twice at once, by `throughTurn` and `latestSettled`; some
into a worktree), and the checker's `fork_events_heard` law holds over what it heard: every
operation heard to its end, its states in order, a committed child announced; meanwhile
writers rename Sessions (`session_events_heard`) and two other Sessions stream replies as
deltas (`turn_events_heard`: each Turn's deltas after its first `turn.updated`, before its
settling one, and joined, its reply).

Stopped providers too: at every third lock take one of the daemon's app-servers is SIGSTOPped;
the worker kills it within `provider_stopped_seconds` (its Turn, if any, settles `failed`
`provider_stopped`). At soak size there are fewer runtime slots than Sessions (32 for 40:
turns and forks contend for them, forks within their share; in the short profile each cold
start costs too much of its few seconds). At the end, the daemon's timer heap holds no entry
per Turn run.

Claude Code among them: one Session in four (seeded, among those in the repository) is a
`claude-code` Session (the real `claude` program against the fake Messages API); its
turns, forks, resolves and deletes take the same steps, the burst forks one of them (a new
one, its Turn run then, if the chaos left none forkable: so for Codex), and the soak
asserts that a Claude fork committed and that the live check's `spare_home_empty` walked a
home with spares in it. Codex too: one Session in eight (one in the short profile; seeded,
among those in the repository, none of Claude's) is a `codex` Session (the real pinned
`codex app-server`, `AGENTHOST_CODEX_BIN`, against the fake Responses API); its turns, forks,
resolves, deletes, restores and diffs take the same steps, its app-server is among those
SIGSTOPped, the burst forks one of them too, and the soak asserts that a Codex fork committed.
Its Codex Sessions are made with `approvalPolicy: on-request` (`CODEX_ASKS`): their Turns ask
too (`interaction_chaos`).

Clients that never read, held for the whole chaos: a subscriber on each events socket (the
prefix-topic one and the terminated-topic one) that subscribes to everything and never reads,
and a DEALER that sends `session.timeline` (limit 1000) and `session.list` (limit 200)
requests all along and never reads a reply (each a real ZeroMQ socket with a tiny receive
queue, so back-pressure reaches the daemon as from a client that stopped reading). Every other
client is still answered (no client timeout), the queues `host.status` reports stay within
their capacities at every look (`status_bounds`, sampled through the chaos), and the daemon's
resident memory grows over the chaos by at most what the unread clients may make it hold —
`EVENTS_HWM` events of the largest frame a reading subscriber heard meanwhile, per stalled
subscriber, plus the per-connection bound of unread replies (`transport.server`: 32 queued,
8 MiB of large ones, a 16 MiB backlog, one reply over each) — plus `RSS_NOISE_MB`. The
first Session's settings are too big for an event (`BIG_SETTINGS`), and every event the reading
subscriber hears is within `MAX_EVENT_BYTES` (`events_bounded`).

Interactions and interrupts among the clients' actions (`interaction_chaos.Asker`): Tutti Agent
Turns whose fake model asks for an approval or an answer, Claude Code Turns whose Bash call asks
for its permission, Codex Turns whose `exec_command` call asks for its approval, answered at
random moments (approve or decline, sometimes twice at once, sometimes never), and
`turn.interrupt` of random Turns, racing the forks, deletes
and lock takes; once the chaos is over the asked Turns still active are interrupted, and what
the clients were answered is checked (`interaction_answered`, `interrupt_answered`;
`interaction_state` with every store law), the answers counted by status.

A provider that misbehaves on its stdout (`provider_chaos`): every Tutti Agent app-server
starts through `tests/daemon/misbehaving_app_server.py`, and a thread of the chaos puts one fault
after another (one endless line, garbage, non-object notifications, its stdout closed at
`turn/start` or mid-Turn; here also `stop`, the runtime stopped before it answers `turn/start`:
its Turn fails `provider_stopped`, the Session's next Turn runs on a new one; and `stop_start`,
the app-server stopped as it starts and the Turn interrupted then: it settles `interrupted`, the
stopped server is killed, the next Turn runs on a new one) on Turns of the
chaos's two Sessions, under the lock takes and the SIGSTOPs; at the end
`provider_fault_settles` judges what was seen.
A slow provider fork (`slow_fork`): as the chaos starts, a Tutti Agent Session of the soak's own
behind the relay is forked with its `thread/fork` held about the worker's limit (`[daemon]
fork_provider_call_seconds`, `slow_fork.LIMIT_S`), under the lock takes and the SIGSTOPs;
after the chaos its end is awaited, an `unknown` one abandoned at once and its Session's next
Turn run (one more, held past the limit, when the chaos's did not meet it); the run asserts
one was made `unknown` by the worker's limit.
A delete beside a runtime slot wait and controls past the idle reap (`slot_delete`): as the
chaos starts, on a daemon of its own (one runtime slot, a short idle limit) beside the chaos's
load: a delete meets a fork queued for the slot at once (409), one beside an interrupted Turn's
queued preparation is applied at once, a request after a delete waiting for a held runtime
start goes after it (404), an answer and an interrupt whose worker's reply is held past the
idle limit are answered 200 and recorded; its home's laws are checked after the chaos.
The reads a GUI lives on among the clients' actions (`read_chaos.Reader`): `session.list`
paged to its end, a Session's `session.timeline` paged with `afterSequence`, its
`session.lineage` — or a pin or rename the pages show — racing the Turns, forks, deletes and
lock takes; after the chaos each read is held to the store as it was before and after it
(`list_pages`, `timeline_pages`, `lineage_answer`).

The fresh app-server's proof (`proof_race`): as the chaos starts, on a daemon of its own
(`readability_proof = "app_server"` for Tutti Agent) beside the chaos's load, forks of two
Sessions (`throughTurn` and `latestSettled`) race a client that submits their Turns, writes
their titles and pins and deletes committed children; each committed fork must be proven
`app_server` and its child (if kept) run a Turn; a 500 fails the run; its home's laws are
checked after the chaos, and the run asserts some fork was so proven.
The summary's laws (`laws_checked`): every `Law` this module, its cells or the checks they
name reach, each with its violations, and any `Law` none reaches named.

Short profile (`make test`): 4 clients, 8 Sessions, ~12 s of chaos, 2 `run/` deletions.
`make soak`: 8 clients, 40 Sessions, ~120 s, 12 deletions. Every Session is warm (one turn run)
before the chaos starts."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from actors.pool import COMPACT_MIN
from actors.recovery import ORPHANED_TURN_ERROR
from tests.reliability.codex_cut import rollout_cut_cells
from tests.reliability.interaction_chaos import CODEX_ASKS, Asker
from tests.reliability.laws_checked import laws_checked
from tests.reliability.proof_race import ProofRace
from tests.reliability.proven_absent import prove_after_restarts
from tests.reliability.provider_chaos import (
    FAULTS,
    STOP,
    STOP_START,
    ProviderChaos,
    claude_front,
    codex_front,
    relay_table,
)
from tests.reliability.read_chaos import Reader
from tests.reliability.reliability_harness import (
    LEDGER,
    REPLAY,
    fork_latest_params,
    fork_params,
    provider_env,
    replay_hint,
    resolve_params,
    trials,
)
from tests.reliability.slot_delete import SlotDelete
from tests.reliability.slow_fork import LIMIT_S as SLOW_FORK_LIMIT_S
from tests.reliability.slow_fork import SlowFork
from tests.reliability.workspace_chaos import refusal, workspace_request
from tests.support.daemon import WS, DaemonProcess, run_turn, settle, submit, wait_for
from tests.support.floods import dealer_flood, free_port, raw_flood
from tests.support.invariants import (
    Law,
    Violation,
    WorkspaceAnswer,
    check_daemon_runtimes,
    check_descriptor_reserve,
    check_event_bounds,
    check_fork_events,
    check_invariants,
    check_processes,
    check_session_events,
    check_socket_dirs,
    check_status_bounds,
    check_turn_events,
    check_workspace_answers,
    homes_waiting,
    repository_state,
    workspace_answer,
    worktree_retrying,
)
from tests.support.run_dir import listeners_in
from tests.support.store_lock import WriteLockHolder
from tests.support.worktree_repos import make_repo
from transport.client import ApiError, Client, ClientClosed, ClientTimeout, EventSubscriber
from transport.connections import OLD_LISTENERS_KEPT, ConnectionLimits
from transport.server import (
    EVENTS_HWM,
    MAX_QUEUED_BYTES,
    MAX_UNREAD_BYTES,
    PEER_REPLY_HWM,
    TRACKED_BYTES,
)

FD_LIMIT = 1024
"""The daemon's descriptor limit, soft and hard (it cannot raise it)."""
FLOOD = trials(300, 1000)
"""Raw unauthenticated TCP connections per flood burst."""
IPC_FLOOD = trials(300, 1000)
"""Raw ipc connections per flood burst. At soak size a burst of 1,000 at a limit of 1,024 can
outrun the guard on a loaded machine (one run peaked at the limit); the accept shim closes a
connection accepted into the top `accept_reserve` descriptors at once, so the daemon keeps its
reserve whatever the guard's lag (docs/design/connections.md, `Law.DESCRIPTOR_RESERVE`)."""
DEALERS = trials(100, 200)
"""Idle ZeroMQ clients per burst (a shed one reconnects: they churn while over the cap)."""
BIG_SETTINGS = {"blob": "s" * (300 << 10)}
"""The first Session's settings: past what an event carries (`settingsOmitted`) and past
`MAX_EVENT_BYTES` themselves, so each of its writes (Turns, renames, pins, forks) publishes a
Session whose settings must be left out (`events_bounded`)."""
CLIENTS = trials(4, 8)
SESSIONS = trials(8, 40)
CODEX_SESSIONS = trials(1, 40 // 8)
"""Codex Sessions among them (in the repository, none of Claude's)."""
CHAOS_S = trials(12.0, 120.0)
RUN_DELETIONS = trials(2, 12)
WARM_AT_ONCE = 4
SLOTS = trials(64, 32)
STOPPED_LIMIT_S = 2
RSS_NOISE_MB = 100.0
"""The allocator's noise and the chaos's own growth allowed beyond what the unread clients may
hold (`tests/resources/test_slow_clients.py`'s allowance: tens of MB either way)."""
UNREAD_EVERY_S = 0.02
"""The never-reading DEALER sends a request this often all through the chaos."""
CLAUDE = "claude-code"
CODEX = "codex"

BURST = trials(3, 8)
"""Boundaries forked at once in the held-events burst (each asked twice)."""
RENAMED = 3
"""Sessions of the burst that several writers rename meanwhile (the Session-event law)."""
RENAMERS = 3
RENAMES = trials(10, 40)
"""Renames of each of those Sessions per writer, each titled `w<writer>:<n>`."""
STREAMED = 2
"""Sessions outside the burst that stream Turns meanwhile (the delta law)."""
STREAMS = trials(4, 12)
"""Streamed Turns of each of them (`/stream`: the reply as 4-character deltas)."""
IPC_ENDPOINTS = 3
"""The daemon's ipc listeners in `run/`: API, events, terminated-topic events."""

ASK_SHARE = 0.12
"""The share of client steps that ask, answer or interrupt (`interaction_chaos.Asker`)."""


def checked_laws() -> list[Law]:
    """The laws this soak checks, read from its code and its cells' (`laws_checked`): the summary
    counts their violations one by one and names any `Law` it does not reach. Read when the
    summary is written, not at every xdist worker's collection of this file."""
    return laws_checked(Path(__file__))


pytestmark = pytest.mark.timeout(trials(240, 1200))


TREE_RETRY_S = 1.0
"""The daemon's first wait before it retries a tree git could not remove (then doubling)."""


class TreePins:
    """A tree git cannot remove, for a moment: before a forced `worktree: "remove"` delete of a
    worktree child, a file of the soak's own made immutable in its tree (`chattr +i`: as root
    only); the delete answers `removing`, and the pin is lifted 1-5 s later (at once for any
    other answer: the tree stays with its child, or in use). The live daemon must then remove
    each such tree and record it `removed` by itself (`RemovalRetries`): no `removing` tree
    is left once the chaos is over."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pinned = 0
        self.removing = 0
        self.failed_removing = 0  # failed forks' trees pinned (`fail_one`)
        self._timers: list[threading.Timer] = []
        self.enabled = os.geteuid() == 0

    def pin(self, c: Client, sid: str) -> Path | None:
        if not self.enabled:
            return None
        try:
            cwd = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"][
                "cwd"
            ]
        except Exception:  # noqa: BLE001 - gone, busy: no pin this time
            return None
        if ".agenthost" not in cwd:  # not a worktree fork's tree (`<repo>.agenthost/…`)
            return None
        path = Path(cwd) / ".soak-pin"
        try:
            path.write_text("a file git cannot unlink for a moment\n")
            subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with self.lock:
            self.pinned += 1
        return path

    def lift(self, path: Path, *, later: float | None, failed: bool = False) -> None:
        def undo() -> None:
            subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)
            if later is None:  # the tree stays: the soak's file goes with its pin
                with contextlib.suppress(OSError):
                    path.unlink()

        if later is None:
            undo()
            return
        timer = threading.Timer(later, undo)
        with self.lock:
            if failed:
                self.failed_removing += 1
            else:
                self.removing += 1
            self._timers.append(timer)
        timer.start()

    def delete_one(self, c: Client, t: Tally) -> None:
        """A pinned forced removal of the first live worktree child of `t`, if any."""
        with t.lock:
            children = list(t.children)
        for child in children:
            pin = self.pin(c, child)
            if pin is None:
                continue
            got = t.call(
                c,
                "session.delete",
                {"workspaceId": WS, "agentSessionId": child, "worktree": "remove", "force": True},
            )
            state = (got or {}).get("worktree", {}).get("state")
            with t.lock:
                t.calls[f"session.delete worktree {state} (pinned, after the chaos)"] += 1
            if state == "removing":
                refuse_a_session_in(t, c, str((got or {})["worktree"]["cwd"]))
            self.lift(pin, later=1.0 if state == "removing" else None)
            if state == "removing":
                return

    def fail_one(self, c: Client, t: Tally, repo: Path, home: Path) -> str | None:
        """A worktree fork of a new Session in the repository (its Turn writes a file) that
        fails before its dispatch (`host.workspace.after_record` armed `error`), a file of the
        soak's own made immutable in its tree while the tree waits whole
        (`host.workspace.after_rename` armed `sleep`): git cannot remove the failed fork's
        tree, the live daemon retries it (`RemovalRetries`), and the pin is lifted 1 s after
        the failure. Its operation id (None: not root, or the tree went unpinned)."""
        if not self.enabled:
            return None
        made = t.call(
            c,
            "session.create",
            {"workspaceId": WS, "provider": "tutti-agent", "cwd": str(repo), "title": "failed"},
        )
        if made is None:
            return None
        sid = str(made["session"]["agentSessionId"])
        turn = run_turn(c, sid, "/write src/failed-fork.txt pinned")
        points = ("host.workspace.after_rename", "host.workspace.after_record")
        c.call(
            "debug.failpoints",
            {"points": {points[0]: "once:sleep:3000", points[1]: "once:error"}},
        )
        params = fork_params(sid, turn["turnId"]) | {"workspace": "worktree"}
        reply = c.submit("fork.create", params)
        pin: Path | None = None
        deadline = time.monotonic() + 20
        while pin is None and time.monotonic() < deadline:
            found = _fork_tree(home, params["requestId"])
            if reply.done() and reply.result().status >= 400 and found is None:
                break  # refused before any operation
            if found is not None and found[2] != "prepared":
                break  # failed (or on) already: its tree went unpinned
            if found is not None and (Path(found[1]) / ".git").exists():
                pin = self._pin_file(Path(found[1]) / ".soak-pin")
            time.sleep(0.05)
        with contextlib.suppress(Exception):
            reply.result(60)
        c.call("debug.failpoints", {"points": dict.fromkeys(points, "off")})
        found = _fork_tree(home, params["requestId"])
        with self.lock:
            t.calls[f"fork.create worktree failed, its tree pinned={pin is not None}"] += 1
        if pin is None:
            return None
        self.lift(pin, later=1.0, failed=True)
        return None if found is None else found[0]

    def _pin_file(self, path: Path) -> Path | None:
        try:
            path.write_text("a file git cannot unlink for a moment\n")
            subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with self.lock:
            self.pinned += 1
        return path

    def lift_all(self) -> None:
        with self.lock:
            timers = list(self._timers)
        for timer in timers:
            timer.join()


def refuse_a_session_in(t: Tally, c: Client, cwd: str) -> None:
    """A person starting a Session in a tree the daemon is removing: refused (409
    `workspace_worktree_deleted`); one made there would have its folder removed under it (the
    end's invariant check would see it in a `removing`/`removed` tree as well). Asked by the
    path the delete answered and by another spelling of it (`/./` before it): the tree is
    compared by its real path."""
    other = "/." + cwd
    for where in (cwd, other):
        made = t.call(
            c, "session.create", {"workspaceId": WS, "provider": "tutti-agent", "cwd": where}
        )
        if made is not None:
            with t.lock:
                t.failures.append(f"session.create in the removing tree {where} was not refused")


def start_by_a_link(t: Tally, c: Client, child: str) -> None:
    """A person's Session started in a worktree child's tree through a symlink to it (what an
    API client may send: `session.create` keeps the cwd as given). It works in the tree: the
    child's `remove` delete must keep the tree and name it (`tree_users` compares real paths);
    the Session stays, so the end's check sees its folder too (the worktree law)."""
    try:
        cwd = c.call("session.get", {"workspaceId": WS, "agentSessionId": child})["session"]["cwd"]
    except Exception:  # noqa: BLE001 - gone, busy: none this time
        return
    if ".agenthost" not in cwd or not Path(cwd).is_dir():
        return
    t.links.mkdir(exist_ok=True)
    link = t.links / f"tree-{uuid.uuid4().hex[:8]}"
    link.symlink_to(cwd, target_is_directory=True)
    made = t.call(
        c, "session.create", {"workspaceId": WS, "provider": "tutti-agent", "cwd": str(link)}
    )
    if made is not None:
        with t.lock:
            t.linked[child] = str(made["session"]["agentSessionId"])
            t.calls["session.create in a child's tree by a link"] += 1


def kept_for_the_link(t: Tally, child: str, got: dict[str, Any] | None) -> None:
    """The answer to `child`'s delete when a Session works in its tree by a link: the tree
    kept, that Session named; any other answer removed (or is removing) it under that Session."""
    with t.lock:
        user = t.linked.get(child)
    tree = (got or {}).get("worktree")
    if user is None or tree is None:
        return
    if tree.get("state") != "kept" or user not in tree.get("inUseBy", []):
        with t.lock:
            t.failures.append(f"delete of {child}: {tree} though {user} works in it by a link")


def link_one(t: Tally, c: Client) -> None:
    """None started by a link in the chaos (few deletes in the short profile): one now, in the
    tree of a live worktree child if the chaos left one, whose forced `remove` delete must
    keep the tree and name it."""
    with t.lock:
        children = list(t.children)
    for child in reversed(children):
        start_by_a_link(t, c, child)
        with t.lock:
            if child not in t.linked:
                continue
            t.children.remove(child)
        got = t.call(
            c,
            "session.delete",
            {"workspaceId": WS, "agentSessionId": child, "worktree": "remove", "force": True},
        )
        state = (got or {}).get("worktree", {}).get("state")
        with t.lock:
            t.calls[f"session.delete worktree {state} (by a link, after the chaos)"] += 1
        kept_for_the_link(t, child, got)
        return


def removing_trees(home: Path) -> list[str]:
    """The operations whose tree is recorded `removing`, read beside the daemon."""
    import apsw

    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT operation_id FROM fork_operations WHERE workspace_state = 'removing'"
        ).fetchall()
    finally:
        conn.close()
    return [str(r[0]) for r in rows]


def _fork_tree(home: Path, request_id: str) -> tuple[str, str, str] | None:
    """The operation of fork request `request_id`, its tree's path and its status, read beside
    the daemon (None: no such operation, or no tree)."""
    import json

    import apsw

    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute(
            "SELECT operation_id, workspace_json, status FROM fork_operations WHERE request_id = ?",
            (request_id,),
        ).fetchone()
    finally:
        conn.close()
    if row is None or not row[1]:
        return None
    return str(row[0]), str(json.loads(row[1])["path"]), str(row[2])


def failed_trees_left(home: Path, op_ids: list[str]) -> list[str]:
    """Of `op_ids`, the failed operations whose tree is not yet recorded `removed`."""
    import apsw

    if not op_ids:
        return []
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT operation_id FROM fork_operations WHERE status = 'failed' AND"
            f" workspace_state <> 'removed' AND operation_id IN ({', '.join('?' * len(op_ids))})",
            op_ids,
        ).fetchall()
    finally:
        conn.close()
    return [str(r[0]) for r in rows]


class Tally:
    def __init__(self, home: Path) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.failures: list[str] = []
        self.turns: dict[str, list[str]] = {}  # session -> settled-or-not turn ids
        self.ops: set[str] = set()
        self.unknown: set[str] = set()
        self.children: list[str] = []  # committed fork children, alive as far as we know
        self.answers: list[WorkspaceAnswer] = []  # restores' and diffs' answers
        self.undos: dict[str, str] = {}  # session → the undo tree its last restore answered
        self.claude: set[str] = set()  # the Claude Code Sessions
        self.codex: set[str] = set()  # the Codex Sessions
        self.asker = Asker(self.provider_of)
        """Interactions and interrupts of the clients (`interaction_chaos`)."""
        self.reader = Reader(home)
        """The clients' pagings and lineage reads, held to the store (`read_chaos`)."""
        self.pins = TreePins()
        """Files made immutable in trees a forced `remove` deletes (`TreePins`)."""
        self.links = home.parent / "tree-links"
        """Symlinks to worktree children's trees, a person's other spelling of them."""
        self.linked: dict[str, str] = {}
        """Worktree child → a Session started in its tree through a symlink (`start_by_a_link`)."""

    def provider_of(self, sid: str) -> str:
        return CLAUDE if sid in self.claude else CODEX if sid in self.codex else "tutti-agent"

    def note(self, op: dict[str, Any]) -> None:
        with self.lock:
            self.ops.add(op["operationId"])
            if op["status"] == "unknown":
                self.unknown.add(op["operationId"])
            else:
                self.unknown.discard(op["operationId"])
            if op["status"] == "committed" and op["targetAgentSessionId"] not in self.children:
                self.children.append(op["targetAgentSessionId"])

    def call(self, c: Client, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        try:
            status, body = c.call_raw(method, params, timeout=60)
        except (ClientTimeout, ClientClosed) as exc:
            with self.lock:
                self.calls[f"{method} unanswered"] += 1
                self.failures.append(f"{method}: no reply ({type(exc).__name__})")
            return None
        boundary = (body.get("params") or {}).get("forkBoundaryReason") if status >= 400 else None
        reason = (
            "" if status < 400 else f" {body.get('reason')}" + (f"/{boundary}" if boundary else "")
        )
        with self.lock:
            self.calls[f"{method} {status}{reason}"] += 1
            if status == 500:
                self.failures.append(f"{method} → 500 {body}")
        return body if status < 400 else None


def client_loop(d: DaemonProcess, t: Tally, sids: list[str], n: int, stop: threading.Event) -> None:
    rng = random.Random(n)
    # A draw of its own (the client's `rng` draws as before): a submit whose start fails on the
    # host after its claim, the typed error where the warm `turn.start` goes.
    faults = random.Random(f"warm-start-{n}")
    c = d.client(timeout=60)
    while not stop.is_set():
        sid = rng.choice(sids)
        s = {"workspaceId": WS, "agentSessionId": sid}
        if rng.random() < ASK_SHARE:
            t.asker.step(c, rng, sids, f"client {n}")  # ask, answer or interrupt
            time.sleep(rng.uniform(0.0, 0.1))
            continue
        action = rng.choices(
            [
                "submit",
                "fork",
                "fork_latest",
                "resolve",
                "ack",
                "delete",
                "settings",
                "get",
                "restore",
                "workspace_diff",
                "read",
            ],
            weights=[6, 2, 1, 1, 1, 0.5, 1, 1, 1, 0.5, 1],
        )[0]
        if action == "submit":
            text = rng.choice(["hello", "/slow 200 slow", "/tool grep x", "/write notes.md x"])
            if faults.random() < 0.02:
                # That Turn (or the next warm one of any Session) settles `failed`, never left
                # `active` (`active_turn_worked`, live, at the end).
                t.call(
                    c,
                    "debug.failpoints",
                    {"points": {"host.turn.before_warm_start": "once:error"}},
                )
            body = t.call(
                c,
                "turn.submit",
                s | {"requestId": str(uuid.uuid4()), "input": [{"type": "text", "text": text}]},
            )
            if body:
                with t.lock:
                    t.turns.setdefault(sid, []).append(body["turn"]["turnId"])
        elif action == "fork":
            body = t.call(c, "session.timeline", s | {"limit": 1000})
            settled = [
                x["turnId"] for x in (body or {}).get("turns", []) if x["phase"] == "settled"
            ]
            if settled:
                if rng.random() < 0.2:
                    # A fork whose reply is lost in the worker: `unknown`, for resolve to settle.
                    t.call(
                        c,
                        "debug.failpoints",
                        {"points": {"worker.fork.after_provider_call": "once:error"}},
                    )
                params = fork_params(sid, rng.choice(settled))
                if rng.random() < 0.3:
                    # A worktree of the Turn's files (refused where the Turn has none).
                    params["workspace"] = "worktree"
                got = t.call(c, "fork.create", params)
                if got:
                    t.note(got["operation"])
                    if got["operation"].get("workspace", {}).get("state") == "made":
                        with t.lock:
                            t.calls["fork.create worktree made"] += 1
        elif action == "fork_latest":
            got = t.call(c, "fork.create", fork_latest_params(sid))
            if got:
                t.note(got["operation"])
        elif action == "resolve" and t.unknown:
            with t.lock:
                op_id = rng.choice(sorted(t.unknown))
            how = rng.choice(["inspect", "adopt", "abandon"])
            got = t.call(c, "fork.resolve", resolve_params(op_id, how))
            if got:
                t.note(got["operation"])
        elif action == "ack" and t.ops:
            with t.lock:
                op_id = rng.choice(sorted(t.ops))
            got = t.call(c, "fork.acknowledge", {"workspaceId": WS, "operationId": op_id})
            if got:
                t.note(got["operation"])
        elif action == "delete":
            # Mostly a fork child; now and then a source (refused while it has an unknown fork).
            # A worktree fork's child keeps or removes its tree (a dirty one only by force).
            with t.lock:
                victim = t.children.pop() if t.children and rng.random() < 0.8 else sid
            how = rng.choice([{}, {"worktree": "keep"}, {"worktree": "remove"}])
            if how and rng.random() < 0.5:
                how["force"] = True
            pin = None
            if how.get("worktree") == "remove" and rng.random() < 0.5:
                start_by_a_link(t, c, victim)  # a Session in its tree by another spelling
            if how.get("worktree") == "remove" and rng.random() < 0.5:
                how["force"] = True  # the pin is a file no checkpoint holds
                pin = t.pins.pin(c, victim)  # git cannot remove its tree for a moment
            got = t.call(c, "session.delete", {"workspaceId": WS, "agentSessionId": victim} | how)
            if got and "worktree" in got:
                with t.lock:
                    t.calls[f"session.delete worktree {got['worktree']['state']}"] += 1
                if how.get("worktree") == "remove":
                    kept_for_the_link(t, victim, got)
            if pin is not None:
                removing = bool(got) and got.get("worktree", {}).get("state") == "removing"
                if removing:
                    refuse_a_session_in(t, c, str(got["worktree"]["cwd"]))
                t.pins.lift(pin, later=rng.uniform(1.0, 5.0) if removing else None)
        elif action in ("restore", "workspace_diff"):
            workspace_call(t, c, rng, sid, action)
        elif action == "read":
            t.reader.step(c, rng, sids + t.children, f"client {n}")  # page or read the lineage
        elif action == "settings":
            settings = t.asker.settings(sid, {"r": rng.randrange(100)})
            t.call(c, "session.updateSettings", s | {"settings": settings})
        else:
            t.call(c, "session.get", s)
        time.sleep(rng.uniform(0.0, 0.1))


def workspace_call(t: Tally, c: Client, rng: random.Random, sid: str, how: str) -> None:
    """A `workspace.restore` of `sid` (a Turn's `before` or `after`, or the undo of its last
    restore; `force` at times) or a `session.workspaceDiff`, racing Turns, forks (worktree
    ones too) and deletes of the same Sessions and folders; answers kept for
    `check_workspace_answers`."""
    with t.lock:
        turns = list(t.turns.get(sid, []))
        undo = t.undos.get(sid)
    request = workspace_request(rng, sid, turns, undo, how)
    if request is None:
        return
    method, s, asked = request
    try:
        status, body = c.call_raw(method, s, timeout=60)
    except (ClientTimeout, ClientClosed) as exc:
        with t.lock:
            t.calls[f"{method} unanswered"] += 1
            t.failures.append(f"{method}: no reply ({type(exc).__name__})")
        return
    with t.lock:
        if status >= 400:
            key, allowed = refusal(method, status, body)
            t.calls[key] += 1
            if not allowed:
                t.failures.append(f"{method} {s} → {status} {body}")
            return
        t.calls[f"{method} {status}"] += 1
        answer = workspace_answer(method, sid, body, asked)
        t.answers.append(answer)
        if how == "restore":
            t.undos[sid] = answer.tree_from


def app_servers(home: Path) -> list[int]:
    """Pids of the running (not stopped, not exited) app-servers serving this home."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"app-server" in cmdline and str(home).encode() in environ and state not in b"TtZX":
            out.append(int(entry.name))
    return out


def _stopped_or_alive(pid: int) -> bool:
    """The process still exists and is not a zombie (its worker has not killed it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _timers_left(c: Client) -> int:
    """`host.status` `timers` once it is down to what is still pending (30 s at most)."""
    deadline = time.monotonic() + 30
    while (n := int(c.call("host.status")["timers"])) > COMPACT_MIN + 16:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return n


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


class FdPressure:
    """Flood bursts against the daemon's ipc and CURVE TCP listeners until `stop`."""

    def __init__(self, d: DaemonProcess, port: int, seed: int) -> None:
        self.d, self.port, self.rng = d, port, random.Random(seed)
        self.bursts = 0
        self.attempted = 0
        self.peak_fds = 0
        self.dead: str | None = None
        self.violations: list[Violation] = []
        """`Law.DESCRIPTOR_RESERVE` as seen during the bursts (the first few)."""
        self._run_dir = Path(d.api[len("ipc://") :]).parent
        self._reserve = ConnectionLimits.for_fd_limit(FD_LIMIT).accept_reserve

    def _sample(self) -> None:
        assert self.d.proc is not None
        if self.d.proc.poll() is not None:
            self.dead = f"daemon exited {self.d.proc.returncode}"
            return
        with contextlib.suppress(OSError):
            self.peak_fds = max(self.peak_fds, len(os.listdir(f"/proc/{self.d.proc.pid}/fd")))
            if len(self.violations) < 10:
                self.violations += check_descriptor_reserve(
                    self.d.proc.pid, self._run_dir, self._reserve, (self.port,)
                )

    def run(self, stop: threading.Event) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        ctx.setsockopt(zmq.MAX_SOCKETS, 4 * DEALERS)
        try:
            while not stop.wait(self.rng.uniform(0.5, 2.0)):
                with (
                    dealer_flood(ctx, self.d.api, DEALERS),
                    raw_flood(self.d.api[len("ipc://") :], IPC_FLOOD) as ipc,
                    raw_flood(("127.0.0.1", self.port), FLOOD) as tcp,
                ):
                    self._sample()
                    time.sleep(self.rng.uniform(0.2, 1.5))
                    self._sample()
                self.bursts += 1
                self.attempted += DEALERS + ipc.attempted + tcp.attempted
        finally:
            ctx.destroy(linger=0)


class NeverRead:
    """Clients that never read, held from `start` to `close`: a SUB on each events socket
    subscribed to everything and a DEALER sending timeline and list requests (its thread,
    until `stop`); beside them, one SUB that reads, to know the largest event frame the daemon
    published meanwhile (what a stalled subscriber's queue holds at most `EVENTS_HWM` of)."""

    def __init__(self, d: DaemonProcess, sids: list[str], seed: int) -> None:
        self.d, self.sids, self.rng = d, sids, random.Random(seed)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.stalled = [self._socket(zmq.SUB, e) for e in (d.events, d.events_exact)]
        self.dealer = self._socket(zmq.DEALER, d.api)
        self.reader = self.ctx.socket(zmq.SUB)
        self.reader.setsockopt(zmq.LINGER, 0)
        self.reader.setsockopt(zmq.SUBSCRIBE, b"")
        self.reader.connect(d.events)
        self.sent = 0
        self.refused_send = 0  # the DEALER's own queue full (zmq.Again)
        self.largest_event = 0
        self.events_heard = 0
        # Event type -> the largest body of that type heard (`events_bounded`).
        self.largest_body: dict[str, int] = {}

    def _socket(self, kind: int, endpoint: str) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.LINGER, 0)
        if kind == zmq.SUB:
            sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        return sock

    def send(self, stop: threading.Event) -> None:
        """Requests all along, none of whose replies is ever read."""
        while not stop.wait(UNREAD_EVERY_S):
            if self.rng.random() < 0.7:
                method = "session.timeline"
                params = {
                    "workspaceId": WS,
                    "agentSessionId": self.rng.choice(self.sids),
                    "limit": 1000,
                }
            else:
                method, params = "session.list", {"workspaceId": WS, "limit": 200}
            frame = {"v": 1, "id": str(uuid.uuid4()), "method": method, "params": params}
            try:
                self.dealer.send(msgpack.packb(frame), zmq.NOBLOCK)
                self.sent += 1
            except zmq.Again:
                self.refused_send += 1

    def read(self, stop: threading.Event) -> None:
        """The reading subscriber: the largest event frame (all its parts) published."""
        poller = zmq.Poller()
        poller.register(self.reader, zmq.POLLIN)
        while not stop.is_set():
            try:
                if not poller.poll(200):
                    continue
                parts = self.reader.recv_multipart()
            except zmq.ZMQError:
                return  # closed under it (a failed run's clean-up)
            self.largest_event = max(self.largest_event, sum(len(p) for p in parts))
            self.events_heard += 1
            body = parts[-1]
            kind = str(msgpack.unpackb(body, raw=False).get("type"))
            self.largest_body[kind] = max(self.largest_body.get(kind, 0), len(body))

    def held_bound_mb(self, largest_reply: int) -> float:
        """What the daemon may hold for the unread clients: per stalled subscriber its queue
        of `EVENTS_HWM` events of the largest frame heard; for the DEALER, 32 replies queued in
        ZeroMQ (those of `TRACKED_BYTES` or more within `MAX_QUEUED_BYTES`), the
        `MAX_UNREAD_BYTES` backlog, one reply over each bound."""
        events = len(self.stalled) * EVENTS_HWM * self.largest_event
        replies = (
            PEER_REPLY_HWM * TRACKED_BYTES + MAX_QUEUED_BYTES + MAX_UNREAD_BYTES + 2 * largest_reply
        )
        return (events + replies) / (1 << 20)

    def close(self) -> None:
        if not self.ctx.closed:
            self.ctx.destroy(linger=0)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _largest_reply(c: Client, sids: list[str]) -> int:
    """The largest reply of the never-reading DEALER's kinds now (msgpack bytes): a bound on
    each it was sent, as timelines and lists only grow over the chaos but for deletes."""
    largest = 0
    for sid in sids:
        _, body = c.call_raw(
            "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}
        )
        largest = max(largest, len(msgpack.packb(body)))
    _, body = c.call_raw("session.list", {"workspaceId": WS, "limit": 200})
    return max(largest, len(msgpack.packb(body)))


@dataclass
class Burst:
    """What the held-events burst did and what its subscriber heard."""

    boundaries: int = 0
    ends: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The renamed Sessions as `session.get` answered at the end."""
    streamed: set[str] = field(default_factory=set)
    """The completed Turns whose replies streamed while the subscriber listened."""
    settled_turns: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each of them as `session.timeline` answered once it settled (what the store committed)."""
    events: int = 0
    asked: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    made: dict[str, str] = field(default_factory=dict)
    """The Sessions the burst made (provider by Session): a Claude or Codex one when none of
    the chaos's gave the burst a boundary."""


def _listen(sub: EventSubscriber, heard: list[dict[str, Any]], stop: threading.Event) -> None:
    while not stop.is_set():
        event = sub.next(0.2)
        if isinstance(event, dict):
            heard.append(dict(event))


def _joined(c: Client, sub: EventSubscriber, sid: str) -> bool:
    """The subscription has reached the daemon (ZeroMQ's slow joiner): it hears a change made
    now to `sid`."""
    status, _ = c.call_raw(
        "session.updateSettings",
        {"workspaceId": WS, "agentSessionId": sid, "settings": {"burst": str(uuid.uuid4())}},
    )
    if status != 200:
        return False  # e.g. 503 store_busy: ask again
    while (event := sub.next(0.5)) is not None:
        if (
            isinstance(event, dict)
            and event["type"] == "session.upserted"
            and event["session"]["agentSessionId"] == sid
        ):
            return True
    return False


def _reached(turn: dict[str, Any]) -> bool:
    """A Turn completed, or interrupted after its provider started it."""
    return turn.get("outcome") == "completed" or bool(
        turn.get("outcome") == "interrupted" and turn.get("rootProviderTurnId")
    )


def _burst_turn(c: Client, sid: str, text: str) -> dict[str, Any]:
    """`run_turn` whose submit is asked again, with its request id, while the answer is a
    retryable 503 (`store_busy`: the chaos's store locks may still be let go)."""
    request_id = str(uuid.uuid4())
    for _ in range(20):
        try:
            turn_id = submit(c, sid, text, request_id=request_id)["turnId"]
            break
        except ApiError as exc:
            if exc.status != 503 or not exc.retryable:
                raise
            time.sleep(0.25)
    else:
        raise AssertionError(f"turn.submit on {sid} answered 503 twenty times")
    return settle(c, sid, turn_id)


def held_events_burst(
    d: DaemonProcess,
    c: Client,
    sids: list[str],
    in_repo: set[str],
    rng: random.Random,
    claude: set[str],
    codex: set[str],
    repo: Path,
) -> Burst:
    """Forks at once on `BURST` fresh boundaries (a Claude Session's and a Codex Session's
    first, if such are forkable; else, or when its Turn does not complete, a new Session of
    that provider in `repo` is made, one Turn run, and its boundary is forked too: added to
    `claude` or `codex`), each asked twice at once (`throughTurn` and `latestSettled`,
    the barrier answers both with one operation), some into a worktree, heard by a subscriber
    connected before the first: the checker's `fork_events_heard` law over what it heard (the
    saga holds its dispatch step's events for the commit's burst). The streamed Sessions are
    Tutti Agent's (`/stream`)."""
    out = Burst()
    live, forkable = [], []
    for sid in sids:
        status, body = c.call_raw(
            "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}
        )
        if status == 200:
            live.append(sid)
            # A Turn that never reached its provider (one stopped under it) makes every later
            # boundary unforkable (`provider_turn_missing`): prefer Sessions without one (an
            # interrupted Turn the provider ran, `interaction_chaos`'s, is one it has).
            if all(_reached(x) for x in body["turns"]):
                forkable.append(sid)
    heard: list[dict[str, Any]] = []
    stop = threading.Event()
    sub = EventSubscriber(d.events)
    listener: threading.Thread | None = None
    try:
        wait_for(lambda: _joined(c, sub, live[0]), 30)
        listener = threading.Thread(target=_listen, args=(sub, heard, stop), daemon=True)
        listener.start()
        fresh = []
        chosen: list[str] = []
        for mine in (claude, codex):
            theirs = [s for s in forkable if s in mine]
            chosen += rng.sample(theirs, min(1, len(theirs)))
        others = [s for s in forkable if s not in chosen]
        chosen += rng.sample(others, min(BURST - len(chosen), len(others)))
        rest = [sid for sid in live if sid not in chosen]
        chosen += rng.sample(rest, min(BURST - len(chosen), len(rest)))
        for sid in chosen:
            n = rng.randrange(1000)
            text = f"/write burst-{n}.md burst" if sid in in_repo else f"/stream burst {n}"
            turn = _burst_turn(c, sid, text)
            if turn["outcome"] == "completed":
                fresh.append((sid, turn["turnId"]))
                if sid not in in_repo:
                    out.streamed.add(turn["turnId"])
                    out.settled_turns[turn["turnId"]] = turn
        for mine, provider in ((claude, CLAUDE), (codex, CODEX)):
            if mine and not [sid for sid, _ in fresh if sid in mine]:
                # The chaos left no Session of the provider a boundary (deleted, a Turn its
                # stopped app-server never ran, or a Turn that did not complete now).
                sid = c.call(
                    "session.create",
                    {"workspaceId": WS, "provider": provider, "cwd": str(repo)},
                )["session"]["agentSessionId"]
                mine.add(sid)
                in_repo.add(sid)
                out.made[sid] = provider
                turn = _burst_turn(c, sid, f"/write burst-{provider}.md burst")
                if turn["outcome"] == "completed":
                    fresh.append((sid, turn["turnId"]))
        out.boundaries = len(fresh)
        asks = []
        for sid, turn_id in fresh:
            pair = [fork_params(sid, turn_id), fork_latest_params(sid)]
            if sid in in_repo and rng.random() < 0.5:
                for params in pair:
                    params["workspace"] = "worktree"
            asks += pair

        def ask(params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            with Client(d.api, timeout=120) as mine:
                for _ in range(20):  # 503 `store_busy` is retryable: the same request again
                    status, body = mine.call_raw("fork.create", params)
                    if status != 503:
                        break
                    time.sleep(0.2)
                return status, body

        renamed = chosen[:RENAMED]

        def rename(writer: int) -> None:
            # Several writers' renames of the same Sessions meet in group commits, and their
            # events reach the events thread in whichever order their threads deliver them.
            with Client(d.api, timeout=120) as mine:
                for n in range(RENAMES):
                    for sid in renamed:
                        mine.call_raw(
                            "session.updateTitle",
                            {"workspaceId": WS, "agentSessionId": sid, "title": f"w{writer}:{n}"},
                        )

        def stream(sid: str) -> list[dict[str, Any]]:
            # Replies streamed as deltas while forks commit and renames publish: each delta
            # reaches the transport on the worker supervisor's thread or behind their events.
            with Client(d.api, timeout=120) as mine:
                turns = [_burst_turn(mine, sid, f"/stream {sid} {k}") for k in range(STREAMS)]
            return [t for t in turns if t["outcome"] == "completed"]

        streamers = [sid for sid in live if sid not in chosen and sid not in claude | codex]
        streamers = streamers[:STREAMED]
        with ThreadPoolExecutor(len(asks) + RENAMERS + len(streamers)) as pool:
            renames = [pool.submit(rename, k) for k in range(RENAMERS)]
            streams = [pool.submit(stream, sid) for sid in streamers]
            replies = list(pool.map(ask, asks))
            for done in renames:
                done.result()
            for streaming in streams:
                for turn in streaming.result():
                    out.streamed.add(turn["turnId"])
                    out.settled_turns[turn["turnId"]] = turn
        out.asked = Counter(
            f"{status}"
            + (f" {body.get('reason')}" if status >= 400 else "")
            + (
                f"/{boundary}"
                if (boundary := (body.get("params") or {}).get("forkBoundaryReason"))
                else ""
            )
            for status, body in replies
        )
        ops = [body["operation"] for status, body in replies if status < 400]
        op_ids = {op["operationId"] for op in ops}
        # The barrier: both asks of a boundary that were answered name one operation.
        assert len(op_ids) == len({op["sourceAgentSessionId"] for op in ops}), replies

        def ended(op_id: str) -> dict[str, Any] | None:
            op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            return None if op["status"] == "accepted" else dict(op)

        out.ends = {op_id: wait_for(lambda o=op_id: ended(o), 120) for op_id in op_ids}
        # The streamed Sessions too: each Turn's claim and settlement publish their Session's
        # event built from its touch on the row the events thread holds (its last one must be
        # the Session as it ended: title, time, active Turn).
        out.sessions = {
            sid: c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
            for sid in [*renamed, *streamers]
        }
        # Every event is published after its COMMIT and none later than its caller's answer;
        # the subscriber reads them a moment after: wait for them, then judge what it heard.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not check_fork_events(list(heard), out.ends), 30, interval=0.2)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not check_session_events(list(heard), out.sessions), 30, interval=0.2)
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: (
                    not check_turn_events(
                        list(heard), out.streamed, out.settled_turns, streaming=out.streamed
                    )
                ),
                30,
                interval=0.2,
            )
    finally:
        stop.set()
        if listener is not None:
            listener.join(5)
        sub.close()
    out.events = len(heard)
    out.violations = check_fork_events(list(heard), out.ends)
    out.violations += check_session_events(list(heard), out.sessions)
    out.violations += check_turn_events(
        list(heard), out.streamed, out.settled_turns, streaming=out.streamed
    )
    return out


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """The daemon's home: a short busy budget, its Claude Code pointed at a fake Messages API
    that lives as long."""
    config = (
        "[daemon]\nstore_busy_timeout_ms = 200\nstore_retry_limit_seconds = 60\n"
        f"max_runtimes_per_provider = {SLOTS}\nprovider_stopped_seconds = {STOPPED_LIMIT_S}\n"
        f"fork_provider_call_seconds = {SLOW_FORK_LIMIT_S}\n"  # the worker's limit (`slow_fork`)
        f"[workspace]\ntree_retry_s = {TREE_RETRY_S}\n"
    ) + relay_table(tmp_path / "arms")  # `provider_chaos`: Tutti Agent behind the relay
    # and Codex's app-server, Claude Code's CLI
    fronts = {CODEX: codex_front(tmp_path / "arms"), CLAUDE: claude_front(tmp_path / "arms")}
    with provider_env(CLAUDE, tmp_path / "home", config=config, also=(CODEX,), commands=fronts):
        yield tmp_path / "home"


def test_contention_soak_answers_everything_and_keeps_every_law(
    tmp_path: Path, home: Path, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("AGENTHOST_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"contention soak seed: {seed} (AGENTHOST_SOAK_SEED={seed} replays it)")
    at = ["the set-up and warm Turns"]  # where a failure is (its report's "soak replay")
    request.node.stash[REPLAY] = lambda: replay_hint("the contention soak", seed, at[0])
    rng = random.Random(seed)
    port = free_port()
    d = DaemonProcess(
        home, args=("--listen", f"tcp://127.0.0.1:{port}"), preexec_fn=_limit_fds
    ).start()
    pressure = FdPressure(d, port, seed)
    t = Tally(home)
    faults = ProviderChaos(tmp_path / "arms", seed, (*FAULTS, STOP, STOP_START))
    stop = threading.Event()
    locks = 0
    locked_s = 0.0
    deletions = 0
    stopped: list[int] = []
    second_serves: Counter[str] = Counter()
    never_read: NeverRead | None = None
    status_violations: list[Violation] = []
    status_looks = 0
    after_chaos_faults = 0
    began = time.monotonic()
    try:
        c = d.client(timeout=60)
        repo = make_repo(tmp_path / "project")
        repositories = {repo: repository_state(repo)}
        in_repo = range(1, SESSIONS, 2)
        claude_at = set(rng.sample(in_repo, max(1, SESSIONS // 4)))
        codex_at = set(rng.sample(sorted(set(in_repo) - claude_at), CODEX_SESSIONS))
        sids = [
            c.call(
                "session.create",
                {
                    "workspaceId": WS,
                    "provider": CLAUDE
                    if i in claude_at
                    else CODEX
                    if i in codex_at
                    else "tutti-agent",
                }
                | ({"cwd": str(repo)} if i % 2 else {})
                | ({"settings": CODEX_ASKS} if i in codex_at else {})
                | ({"settings": BIG_SETTINGS} if i == 0 else {}),
            )["session"]["agentSessionId"]
            for i in range(SESSIONS)
        ]
        claude = {sids[i] for i in claude_at}
        codex = {sids[i] for i in codex_at}
        t.claude |= claude
        t.codex |= codex
        t.asker.codex_asks |= codex  # each asks before it runs a command (`CODEX_ASKS`)
        # Warm Sessions, as in the scenario: each has run a turn before the chaos, a
        # few at a time (all app-servers starting at once on 2 cores time `session.start`
        # out, and a Turn that never reached the provider leaves its Session unforkable).
        with ThreadPoolExecutor(WARM_AT_ONCE) as pool:
            warm = list(pool.map(lambda sid: run_turn(d.client(timeout=120), sid, "warm"), sids))
        assert [t["outcome"] for t in warm] == ["completed"] * SESSIONS, warm
        faults.setup(c)  # its own Sessions, whose app-server misbehaves on demand
        # A Session of its own whose fork the relay holds about the worker's limit.
        slow = SlowFork(home, tmp_path / "arms", seed)
        slow.setup(c, str(repo))
        threads = [
            threading.Thread(target=client_loop, args=(d, t, sids, n, stop), daemon=True)
            for n in range(CLIENTS)
        ]
        threads.append(threading.Thread(target=pressure.run, args=(stop,), daemon=True))
        threads.append(  # `provider_chaos`'s rounds
            threading.Thread(
                target=faults.run, args=(lambda: d.client(timeout=60), stop), daemon=True
            )
        )
        # The clients that never read, held for the whole chaos (and its RSS's baseline).
        never_read = NeverRead(d, sids, seed)
        threads.append(threading.Thread(target=never_read.send, args=(stop,), daemon=True))
        threads.append(threading.Thread(target=never_read.read, args=(stop,), daemon=True))
        time.sleep(0.5)  # the subscriptions reach the daemon
        assert d.proc is not None
        rss_start = _rss_mb(d.proc.pid)
        rss_peak = rss_start
        for th in threads:
            th.start()
        slow.start(d.client(timeout=60))  # held under the chaos's locks, stops and floods
        slots = SlotDelete(tmp_path / "sd", seed)  # `slot_delete`'s cells, beside it
        slots.start(kill=False)
        proof = ProofRace(tmp_path / "pr", seed)  # `proof_race`: app_server proofs, beside it
        proof.start()
        at[0] = f"the chaos ({CHAOS_S:.0f} s)"
        started = time.monotonic()
        deadline = started + CHAOS_S
        # The deletions spread over the chaos, one at each of these times from its start.
        delete_at = sorted(rng.uniform(0, CHAOS_S * 0.8) for _ in range(RUN_DELETIONS))
        while time.monotonic() < deadline or delete_at:
            time.sleep(rng.uniform(0.3, 1.5))
            # What `host.status` reports within its capacities (`status_bounds`), and the RSS.
            status_looks += 1
            status_violations += check_status_bounds(c.call("host.status"))
            rss_peak = max(rss_peak, _rss_mb(d.proc.pid))
            if delete_at and time.monotonic() - started >= delete_at[0]:
                delete_at.pop(0)
                shutil.rmtree(home / "run", ignore_errors=True)
                deletions += 1
                second = subprocess.run(
                    [sys.executable, "-m", "agenthost.cli", "--home", str(home), "serve"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    stdin=subprocess.DEVNULL,
                )
                refused = second.returncode == 1 and "is serving" in second.stderr
                second_serves["refused" if refused else f"exit {second.returncode}"] += 1
                continue
            if locks % 3 == 1 and (running := app_servers(home)):
                victim = rng.choice(running)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGSTOP)
                    stopped.append(victim)
            with WriteLockHolder(home / "store.sqlite3"):
                locks += 1
                held = rng.uniform(0.1, 1.2)
                time.sleep(held)
                locked_s += held
        if not stopped:
            # A loaded machine may run too few lock rounds to meet a live app-server on one of
            # them: stop one now, while the clients still run Turns, so the phase always runs.
            wait_for(lambda: bool(app_servers(home)), 30)
            victim = rng.choice(app_servers(home) or [0])
            with contextlib.suppress(ProcessLookupError):
                if victim:
                    os.kill(victim, signal.SIGSTOP)
                    stopped.append(victim)
        stop.set()
        at[0] = "the settling after the chaos"
        for th in threads:
            th.join(90)
        # The unread clients still held: what the daemon holds for them is bounded.
        rss_end = _rss_mb(d.proc.pid)
        status_looks += 1
        status_violations += check_status_bounds(c.call("host.status"))
        held_bound = never_read.held_bound_mb(_largest_reply(c, sids))
        # Every event within its cap, the first Session's big settings in each of its own.
        status_violations += check_event_bounds(never_read.largest_body)
        never_read.close()
        t.asker.release(c, "release")  # asked Turns still waiting: interrupted

        # The lock is gone for good: every Turn settles, every operation ends.
        def unsettled() -> list[str]:
            left = []
            for sid in sids:
                status, body = c.call_raw(
                    "session.timeline", {"workspaceId": WS, "agentSessionId": sid}
                )
                if status == 404:
                    continue  # deleted by a client
                left += [
                    f"{t.provider_of(sid)} Session {sid} Turn {x['turnId']} {x['phase']}"
                    for x in body["turns"]
                    if x["phase"] != "settled"
                ]
            for op_id in t.ops:
                op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
                if op["status"] == "accepted":
                    source = op["sourceAgentSessionId"]
                    left.append(f"{t.provider_of(source)} fork {op_id} of {source} accepted")
            return left

        assert pressure.dead is None, (pressure.dead, d.tail_log())
        connections = c.call("host.status")["connections"]
        try:
            wait_for(lambda: not unsettled(), 120, interval=0.5)
        except AssertionError:
            raise AssertionError(
                (seed, "work stayed active after the chaos", unsettled(), d.tail_log())
            ) from None
        # The slow fork's end (an `unknown` one abandoned at once) and its Session's next Turn;
        # one more held past the worker's limit, no chaos, when the chaos's did not meet it.
        slow_ends = [slow.settle(c)]
        slots_wrong = slots.join()
        assert not slots_wrong, (seed, slots_wrong)
        proof_wrong = proof.join()
        assert not proof_wrong, (seed, proof_wrong)
        assert proof.ran["proven app_server"] > 0, (seed, proof.summary())
        if not slow.met_the_limit():
            slow.start(c, past_the_limit=True)
            slow_ends.append(slow.settle(c))
        # Every tree left `removing` by a pin is removed and recorded by the live daemon once
        # its pin is lifted (its retries start at TREE_RETRY_S and double from there).
        if t.pins.removing == 0:
            # None in the chaos (few deletes in the short profile): one now, of a live
            # worktree child if the chaos left one.
            t.pins.delete_one(c, t)
        if not t.linked:
            link_one(t, c)
        # A failed fork's tree git cannot remove for a moment: removed and recorded live too.
        failed_pinned = [op for op in [t.pins.fail_one(c, t, repo, home)] if op]
        t.pins.lift_all()
        try:
            wait_for(lambda: not removing_trees(home), 120, interval=0.5)
            wait_for(lambda: not failed_trees_left(home, failed_pinned), 120, interval=0.5)
        except AssertionError:
            raise AssertionError(
                (
                    seed,
                    "trees stayed removing",
                    removing_trees(home),
                    failed_trees_left(home, failed_pinned),
                    d.tail_log(),
                )
            ) from None
        # The re-binds' replaced listeners are closed once nothing uses them: the current three
        # and at most OLD_LISTENERS_KEPT per endpoint that idle old clients pin (past the cap
        # their idle connections are moved), whatever the number of `run/` removals.
        assert d.proc is not None
        cap = IPC_ENDPOINTS * (1 + OLD_LISTENERS_KEPT)
        wait_for(lambda: len(listeners_in(d.proc.pid, home / "run")) <= cap, 60, interval=0.5)
        listeners = listeners_in(d.proc.pid, home / "run")
        # A client's one-shot `worker.fork.after_provider_call=error` that no fork reached in the
        # chaos stays armed: off, so the burst's forks meet no fault (one made the burst's only
        # Codex fork `unknown`, and the "a Codex fork committed" check failed, 0 violations).
        c.call(
            "debug.failpoints",
            {
                "points": {
                    "worker.fork.after_provider_call": "off",
                    "host.turn.before_warm_start": "off",
                }
            },
        )
        at[0] = "the rollout-cut cells"
        (tmp_path / "cut").mkdir()  # a Codex and a Tutti Agent rollout cut, refused, put back
        assert rollout_cut_cells(home, c, seed, str(tmp_path / "cut")), seed
        at[0] = "the held-events burst"
        burst = held_events_burst(d, c, sids, set(sids[1::2]), rng, claude, codex, repo)
        at[0] = "the end's checks, after the burst"
        t.claude |= claude
        t.codex |= codex
        assert burst.streamed, "no Turn streamed during the burst: the delta law went unchecked"
        # Every stopped app-server was killed by its worker, none left stopped.
        wait_for(lambda: not [p for p in stopped if _stopped_or_alive(p)], 30, interval=0.5)
        # No timer is left per Turn run: only what is still pending (short fork budgets).
        timers = _timers_left(c)
        turn_outcomes: Counter[str] = Counter()
        provider_stopped = 0
        failed_why: Counter[str] = Counter()
        recovered = 0  # Turns a startup recovery settled: none, as no daemon restarted
        for sid in sids:
            status, body = c.call_raw(
                "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}
            )
            if status == 404:
                continue
            turn_outcomes.update(str(x.get("outcome") or x["phase"]) for x in body["turns"])
            provider_stopped += sum(
                1 for x in body["turns"] if x.get("errorReason") == "provider_stopped"
            )
            failed_why.update(
                str(x.get("errorReason") or x.get("error") or "")[:90]
                for x in body["turns"]
                if x.get("outcome") == "failed"
            )
            recovered += sum(x.get("error") == ORPHANED_TURN_ERROR for x in body["turns"])
        # `run/` is back, naming the live daemon, and a new client gets in through it.
        lock = home / "run" / "daemon.lock"
        assert d.proc is not None
        wait_for(lambda: lock.exists() and lock.read_text().strip() == str(d.proc.pid), 10)
        with Client(d.api, timeout=30) as fresh:
            assert fresh.call("host.status", {})["protocol"] == 1
        ops = [
            c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            for op_id in t.ops | set(burst.ends)
        ]
        fork_outcomes = Counter(op["status"] for op in ops if op["operationId"] in t.ops)
        claude_forks = Counter(op["status"] for op in ops if op["sourceAgentSessionId"] in claude)
        codex_forks = Counter(op["status"] for op in ops if op["sourceAgentSessionId"] in codex)
        # The trees the live daemon still retries (none expected: every pin was lifted and its
        # tree removed above) may stay past the grace; any other failed fork's tree may not;
        # nor a deleted Session's folder, unless its removal waits for a call in flight.
        # A Codex tool's detached process beside its running runtime for the live checks (the
        # process laws' too, at once: a fault round below may end its runtime).
        t.asker.detach(c, home, sorted(codex), "live check")
        t.asker.count_detached(home)
        assert d.proc is not None
        detached_processes = check_processes(home, d.proc.pid)
        detached_processes += check_daemon_runtimes(home, d.proc.pid, c)
        status = c.call("host.status")
        live = check_invariants(
            home,
            live_grace_s=5,
            repositories=repositories,
            retrying_trees=worktree_retrying(status),
            waiting_homes=homes_waiting(status),
        )
        answers_wrong = check_workspace_answers(home, t.answers)
        reads_wrong = t.reader.check()
        asked_violations = t.asker.check(c)
        if all(f.disturbed for f in faults.faults):
            # Every fault of the chaos met a SIGSTOP, a new worker or a lost reply (or none
            # ran): one more now, no chaos, so the law judges an undisturbed one.
            faults.guarded(c, lambda: 0)
            after_chaos_faults = 1
        fault_violations = faults.check(c)
        # The processes of the home: all under the live daemon, one worker per provider.
        assert d.proc is not None
        t.asker.count_detached(home)  # what Codex's tools left beside their runtimes
        live_processes = check_processes(home, d.proc.pid)
        live_processes += check_daemon_runtimes(home, d.proc.pid, c) + detached_processes
    finally:
        stop.set()
        if never_read is not None:
            never_read.close()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        d.stop()
    final = check_invariants(home, repositories=repositories)
    # ... and none left once it stopped (its workers, their app-servers, SIGSTOPped ones too).
    final_violations = (
        list(final.violations)
        + burst.violations
        + live_processes
        + check_processes(home, None)
        + check_socket_dirs(home, stopped_cleanly=True)
        + pressure.violations
        + status_violations
        + answers_wrong
        + asked_violations
        + fault_violations
        + reads_wrong
    )
    # The Turns the chaos left unbound with their start's fate unknown (an app-server stopped
    # under one): after a restart (nothing of the stopped daemon left), each such tutti-agent
    # Session's next Turn starts cold and its re-bind's final history marks host-only what
    # the thread cannot hold (`proven_absent`); the laws hold again once it stops.
    tutti = [s for s in sids if s not in claude and s not in codex]
    running: list[DaemonProcess] = []

    def restart() -> Client:
        if running:
            running.pop().stop()
        running.append(DaemonProcess(home).start())
        return running[-1].client(timeout=60)

    try:
        proven, unproven = prove_after_restarts(home, tutti, restart)
    finally:
        for again in running:
            again.stop()
    if running:
        final_violations += list(check_invariants(home, repositories=repositories).violations)
        final_violations += check_processes(home, None)
        final_violations += check_socket_dirs(home, stopped_cleanly=True)
    burst_ends = Counter(str(o["status"]) for o in burst.ends.values())
    assert never_read is not None
    elapsed = time.monotonic() - began
    by_law = Counter(v.law.value for v in list(live.violations) + final_violations)
    checked = checked_laws()
    requests = sum(t.calls.values())
    unanswered = sum(v for k, v in t.calls.items() if k.endswith("unanswered"))
    status_500 = sum(v for k, v in t.calls.items() if k.split()[1] == "500")
    busy = sum(v for k, v in t.calls.items() if k.endswith("store_busy"))
    summary = [
        f"contention soak: seed={seed} clients={CLIENTS} sessions={SESSIONS} "
        f"chaos={CHAOS_S:.0f}s wall={elapsed:.0f}s",
        f"  lock takes: {locks} (another process held the write lock {locked_s:.1f} s in all)",
        f"  app-servers SIGSTOPped: {len(stopped)} (each killed by its worker; "
        f"provider_stopped turns: {provider_stopped}); runtime slots: {SLOTS}; "
        f"timers left: {timers}",
        f"  run/ deletions: {deletions}; second serve: "
        + " ".join(f"{k}={v}" for k, v in sorted(second_serves.items()))
        + f"; turns settled by a startup recovery: {recovered}",
        f"  fd pressure: limit {FD_LIMIT}, {pressure.bursts} bursts, {pressure.attempted}"
        f" connections opened, peak {pressure.peak_fds} descriptors; daemon refused"
        f" {connections['refused']} ({connections['refusedAtAccept']} at accept, into the"
        f" reserve), shed {connections['shed']} (holds at most"
        f" {connections['max']}, reserve {connections['fdReserve']})",
        f"  never-reading clients: {len(never_read.stalled)} subscribers, a DEALER sent"
        f" {never_read.sent} requests ({never_read.refused_send} not queued); largest event"
        f" {never_read.largest_event} B of {never_read.events_heard} heard; RSS"
        f" {rss_start:.0f} -> {rss_end:.0f} MB (peak {rss_peak:.0f}), growth"
        f" {rss_end - rss_start:+.0f} MB, bound {held_bound:.0f} + {RSS_NOISE_MB:.0f} MB;"
        f" host.status looks: {status_looks}",
        f"  requests: {requests} unanswered={unanswered} status_500={status_500} "
        f"503_store_busy={busy}",
        f"  turns: {sum(turn_outcomes.values())} "
        + " ".join(f"{k}={v}" for k, v in sorted(turn_outcomes.items())),
        f"  forks: {len(t.ops)} " + " ".join(f"{k}={v}" for k, v in sorted(fork_outcomes.items())),
        f"  workspace answers checked: {len(t.answers)} (restores"
        f" {sum(a.method == 'workspace.restore' for a in t.answers)})",
        f"  ipc listeners after the chaos: {len(listeners)} (at most {cap}): "
        + " ".join(os.path.basename(a) for a in listeners),
        f"  held-events burst: {burst.boundaries} boundaries, asked "
        + " ".join(f"{k}={v}" for k, v in sorted(burst.asked.items()))
        + f"; {len(burst.ends)} operations "
        + " ".join(f"{k}={v}" for k, v in sorted(burst_ends.items()))
        + f", {len(burst.sessions)} Sessions renamed by {RENAMERS} writers meanwhile"
        + f", {len(burst.streamed)} streamed Turns"
        + f", {burst.events} events heard",
        *(f"    failed: {n} × {why}" for why, n in sorted(failed_why.items())),
        f"  claude: sessions={len(claude)} (made by the burst:"
        f" {sum(p == CLAUDE for p in burst.made.values())}) forks "
        + " ".join(f"{k}={v}" for k, v in sorted(claude_forks.items()))
        + f"; live check: spare homes walked={live.spare_homes}, readable children="
        f"{live.readable_by_provider.get(CLAUDE, 0)}, completed Turns read in their"
        f" transcripts={live.claude_turns_read}",
        f"  codex: sessions={len(codex)} (made by the burst:"
        f" {sum(p == CODEX for p in burst.made.values())}) forks "
        + " ".join(f"{k}={v}" for k, v in sorted(codex_forks.items()))
        + f"; live check: readable children={live.readable_by_provider.get(CODEX, 0)}",
        f"  unanswered Turns after a restart: {dict(proven)}",
        f"  slow forks (held about the worker's limit): {slow_ends}",
        f"  pinned trees: {t.pins.pinned} (left removing, then removed live: {t.pins.removing};"
        f" failed forks' trees, then removed live: {t.pins.failed_removing})",
        "  invariant checks: 2 (live, live_grace_s=5; stopped) + the burst's events; violations="
        f"{len(live.violations) + len(final_violations)}",
        f"  laws checked ({len(checked)} of {len(Law)}; not reached:"
        f" {[law.value for law in Law if law not in checked] or 'none'}): "
        + " ".join(f"{law.value}={by_law[law.value]}" for law in checked),
        "  " + final.summary(),
        "  " + t.asker.summary(),
        "  " + proof.summary(),
        "  " + faults.summary() + f" (after the chaos: {after_chaos_faults})",
        f"  reads held to the store: {len(t.reader.reads)} "
        + " ".join(f"{k}={v}" for k, v in sorted(t.reader.calls.items())),
    ]
    summary += [f"    {k}: {v}" for k, v in sorted(t.calls.items())]
    print("\n".join(summary))
    LEDGER.record(
        "contention-soak",
        f"{CLIENTS} clients, {SESSIONS} sessions, seed {seed}",
        trials=locks,
        outcomes=Counter({f"op_{k}": v for k, v in final.operations.items()})
        + Counter({"store_busy_503": busy, "run_deleted": deletions}),
        invariant_checks=2,
        violations=len(live.violations) + len(final_violations),
    )
    assert live.ok and not final_violations, "invariant violations:\n" + "\n".join(
        map(str, list(live.violations) + final_violations)
    )
    assert not t.failures, (seed, t.failures[:10])
    assert not unproven, (seed, unproven)
    lost = [k for k in t.asker.calls if k.endswith(" lost")]
    assert not t.asker.failures and not lost, (seed, t.asker.failures[:10], lost)
    # ... and a provider misbehaved on its stdout in a round no fault of the soak's disturbed.
    assert any(not f.disturbed for f in faults.faults), (seed, faults.summary())
    assert not faults.failures, (seed, faults.failures)
    assert not t.reader.failures and t.reader.reads, (seed, t.reader.failures[:10])
    # The run really met the fault and really ran turns and forks.
    assert locks > 0 and turn_outcomes["completed"] > 0 and t.ops
    # Removing `run/` never let a second daemon serve the home or recover its store.
    assert deletions == RUN_DELETIONS and second_serves == {"refused": RUN_DELETIONS}
    assert recovered == 0
    # ... and really met descriptor pressure, inside its limit.
    assert pressure.bursts > 0 and connections["refused"] + connections["shed"] > 0
    assert pressure.peak_fds < FD_LIMIT
    # ... and held clients that never read all along, and nothing grew past their bound.
    assert never_read.sent > 0 and status_looks > 1
    assert rss_end - rss_start <= held_bound + RSS_NOISE_MB, (seed, rss_start, rss_end, held_bound)
    # ... and stopped app-servers, each replaced, leaving no timer per Turn behind.
    assert stopped, "no app-server was stopped"
    assert timers <= COMPACT_MIN + 16, timers
    # ... and really met the burst: forks heard to their end, some committed.
    assert burst.ends and any(o["status"] == "committed" for o in burst.ends.values()), burst.ends
    # ... and renamed Sessions meanwhile, whose events the Session-event law judged.
    assert burst.sessions, burst
    # ... and Claude Code's laws under it: a Claude fork committed, and the live check's
    # `spare_home_empty` walked the spare homes its worker made ahead. The burst forks a Claude
    # Session's boundary whatever the chaos left (a new Session's when none is forkable): no
    # fault then, so its fork commits unless the Claude fork path is broken.
    assert claude_forks["committed"] > 0, (seed, claude_forks, burst.made)
    assert live.spare_homes > 0, (seed, "spare_home_empty never walked a spare home")
    # ... and `claude_turn_in_transcript` read completed Claude Turns (the burst's fork
    # source ran one) in their transcripts.
    assert live.claude_turns_read > 0, (seed, "no completed Claude Turn read in a transcript")
    # ... and a slow provider fork made `unknown` by the worker's limit, abandoned at once.
    assert slow.met_the_limit() > 0, (seed, "no slow fork met the worker's limit", slow_ends)
    # ... and Codex's: a Codex fork committed (the burst forks a Codex Session's boundary,
    # a new one's when the chaos left none forkable).
    assert codex_forks["committed"] > 0 or not CODEX_SESSIONS, (seed, codex_forks, burst.made)
