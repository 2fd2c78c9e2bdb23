"""Crash soak: several client threads run random sessions, turns, forks of both point kinds
(`throughTurn`, `latestSettled`) and both workspaces (`shared`, and `worktree`: the sessions
work in a git repository made here; the tree's own failpoints are among the armed ones), ACKs,
`fork.resolve` (inspect / adopt / abandon) of unknown operations, mutations and deletes of
sources and children against a real daemon while a chaos loop SIGKILLs the daemon or its
worker at random moments (or arms a random `once:kill` failpoint, the resolve's among them);
after every kill the invariant checker runs, with the person's repository as it was before the
first Session touched it (`repository_kept`, law 10: only the forks' worktrees and
`agenthost/` branches may be added). A delete keeps or removes a worktree fork's tree at random
(`force` or not). A fork request answered earlier is sent again, across restarts (law 6: the
same `requestId` and body get the same operation; a changed body under it is never accepted).
Seeded: the seed is printed and
`AGENTHOST_SOAK_SEED` replays it.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.reliability_harness import (
    LEDGER,
    SOAK,
    fork_latest_params,
    fork_params,
    resolve_params,
    worker_of,
)
from tests.support.daemon import WS, DaemonProcess, run_turn, wait_for
from tests.support.git_repos import make_repo
from tests.support.invariants import (
    assert_invariants,
    check_invariants,
    check_processes,
    repository_state,
)
from transport.client import ApiError, Client, ClientClosed, ClientTimeout

ROUNDS = 60 if SOAK else 5
CLIENTS = 4
LIVE_GRACE_S = 10
"""The live laws' grace: no turn of this soak (at most `/slow 150`) writes nothing that long."""
pytestmark = pytest.mark.timeout(1800 if SOAK else 180)

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
)


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
        self.daemon = DaemonProcess(home).start()
        self.generation = 0
        self.running = threading.Event()
        self.stop = threading.Event()
        self.busy = 0
        self.idle = threading.Condition(self.lock)
        self.sessions: dict[str, list[str]] = {}  # live session → settled turn ids
        self.ops: dict[str, str] = {}  # operation id → last seen status
        self.asked: dict[str, dict[str, Any]] = {}  # operation id → the request that made it
        self.calls: Counter[str] = Counter()
        self.failures: list[str] = []

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
    mine: tuple[int, Client] | None = None
    while not w.stop.is_set():
        if not w.enter():
            continue
        try:
            mine = w.client(mine)
            step(w, rng, mine[1], f"client {n}")
        except Exception as exc:  # noqa: BLE001 - a bug in the test or an untyped failure
            w.failures.append(f"client {n}: {type(exc).__name__}: {exc}")
        finally:
            w.leave()


def step(w: World, rng: random.Random, c: Client, tag: str) -> None:
    with w.lock:
        sessions = list(w.sessions)
        ops = list(w.ops)
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
        ],
        weights=[3 if len(sessions) < 30 else 0, 4, 6, 10, 4, 3, 3, 3, 2, 2, 1, 1, 0.6, 2],
    )[0]
    s = {"workspaceId": WS, "agentSessionId": sid}
    if action == "create" or sid is None:
        body = call(
            w,
            c,
            tag,
            "session.create",
            {
                "workspaceId": WS,
                "provider": "tutti-agent",
                "title": f"s{rng.randrange(99)}",
                "cwd": w.cwd,
            },
        )
        if body:
            with w.lock:
                w.sessions[body["session"]["agentSessionId"]] = []
    elif action == "submit":
        text = rng.choice(["hello", "hello", "/slow 150 slow one", "/tool grep x", "/fail no"])
        (Path(w.cwd) / f"file-{rng.randrange(8)}.txt").write_text(f"{rng.random()}\n")
        call(
            w,
            c,
            tag,
            "turn.submit",
            s | {"requestId": str(uuid.uuid4()), "input": [{"type": "text", "text": text}]},
        )
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
            with w.lock:
                w.ops[op_id] = op["status"]
                if op["status"] == "committed":
                    w.sessions.setdefault(op["targetAgentSessionId"], [])
    elif action == "settings":
        call(w, c, tag, "session.updateSettings", s | {"settings": {"r": rng.randrange(1000)}})
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


def note_operation(w: World, op: dict[str, Any], params: dict[str, Any] | None = None) -> None:
    with w.lock:
        w.ops[op["operationId"]] = op["status"]
        if params is not None and op["requestId"] == params["requestId"]:
            w.asked[op["operationId"]] = params  # made by this request, not a barrier's answer
        if op["status"] == "committed":
            w.sessions.setdefault(op["targetAgentSessionId"], [])


def test_random_load_with_daemon_and_worker_sigkills_keeps_every_invariant(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("AGENTHOST_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash soak seed: {seed} (AGENTHOST_SOAK_SEED={seed} replays it)")
    rng = random.Random(seed)
    w = World(tmp_path / "home", seed)
    chaos: Counter[str] = Counter()
    checks = violations = 0
    threads = [
        threading.Thread(target=client_loop, args=(w, n), daemon=True) for n in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    try:
        rounds = 0
        while rounds < ROUNDS:
            rounds += 1
            if revive(w):
                chaos["failpoint_fired_late"] += 1
            try:
                seed_fork(w, rng)
            except (ClientTimeout, ClientClosed):
                # Only a daemon killed by a late armed point may leave the seed unanswered.
                assert revive(w), "a live daemon did not answer the round's seed"
                chaos["failpoint_fired_late"] += 1
                seed_fork(w, rng)
            w.running.set()
            deadline = time.monotonic() + rng.uniform(0.5, 2.5)
            while time.monotonic() < deadline and w.daemon.proc.poll() is None:
                time.sleep(0.05)
            action = (
                "failpoint_fired"
                if w.daemon.proc.poll() is not None
                else rng.choice(["kill_daemon", "kill_daemon", "kill_worker", "arm_failpoint"])
            )
            if action == "kill_worker":
                worker = worker_of(w.daemon, "tutti-agent")
                if worker and worker.get("pid"):
                    os.kill(int(worker["pid"]), signal.SIGKILL)
            elif action == "arm_failpoint":
                w.daemon.client(timeout=5).call(
                    "debug.failpoints", {"points": {rng.choice(POINTS): "once:kill"}}
                )
            restarted = action in ("kill_daemon", "failpoint_fired")
            if restarted:
                with w.lock:
                    w.daemon.kill()  # SIGKILL; in-flight calls end as `lost`
            w.pause()
            if restarted:
                with w.lock:
                    w.daemon = DaemonProcess(w.home).start()
                    w.generation += 1
            chaos[action] += 1
            report = check_invariants(w.home, repositories=w.repositories)
            checks += 1
            violations += len(report.violations)
            assert report.ok, (seed, report.violations)
            # No process of a killed daemon (its workers, their app-servers) outlives it, and
            # the live one runs one worker per provider (the workers started ahead included).
            assert w.daemon.proc is not None
            orphans = check_processes(w.home, w.daemon.proc.pid)
            assert not orphans, (seed, orphans)
        # Every committed child that is alive resumes through the daemon (its provider state is
        # readable from its own home); a sample in the short profile.
        w.pause()
        if revive(w):
            chaos["failpoint_fired_late"] += 1
        c = w.daemon.client(timeout=60)
        c.call("debug.failpoints", {"points": {p: "off" for p in POINTS}})
        committed = [op for op, status in w.ops.items() if status == "committed"]
        resumed = 0
        for op_id in committed[: None if SOAK else 3]:
            op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            target = op["targetAgentSessionId"]
            status, _ = c.call_raw("session.get", {"workspaceId": WS, "agentSessionId": target})
            if status == 200:
                wait_for(lambda t=target: _idle(c, t), timeout=60)
                assert run_turn(c, target, "resume")["outcome"] == "completed"
                resumed += 1
        # With the clients parked, the live laws too: no Turn stays active and no
        # operation keeps its fence with nothing working on it (`active_turn_worked`,
        # `fence_has_saga`); `completed_turn_recorded` runs in every check.
        wait_for(lambda: all(_idle_or_gone(c, s) for s in list(w.sessions)), timeout=60)
        final = assert_invariants(w.home, live_grace_s=LIVE_GRACE_S, repositories=w.repositories)
        checks += 1
    finally:
        w.stop.set()
        w.running.set()
        for t in threads:
            t.join(10)
        w.daemon.stop()
    assert not w.failures, (seed, w.failures[:10])
    assert_invariants(w.home, repositories=w.repositories)  # once more, the daemon stopped
    assert not check_processes(w.home, None), "a process outlived the stopped daemon"
    checks += 1
    summary = [
        f"seed={seed} rounds={rounds} chaos={dict(chaos)} invariant_checks={checks} "
        f"violations={violations} resumed_children={resumed}",
        final.summary(),
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
    # failpoint that killed one (in its round or later). The seed is random, so five short
    # rounds may well draw no daemon kill (seen once: 3 worker kills, 2 late failpoints).
    killed = (
        chaos["kill_daemon"]
        + chaos["kill_worker"]
        + chaos["failpoint_fired"]
        + chaos["failpoint_fired_late"]
    )
    assert sum(final.operations.values()) > 0 and killed > 0, dict(chaos)


def revive(w: World) -> bool:
    """An armed `once:kill` point may fire after the round's chaos step (a saga still in
    flight reaches it while the clients are parked): restart a daemon that died that way."""
    with w.lock:
        if w.daemon.proc is None or w.daemon.proc.poll() is None:
            return False
        w.daemon.kill()
        w.daemon = DaemonProcess(w.home).start()
        w.generation += 1
        return True


def seed_fork(w: World, rng: random.Random) -> None:
    """One fork per round on a fresh, settled source, left in flight while the clients and the
    chaos run, so every round exercises the saga whatever the random clients picked."""
    c = w.daemon.client(timeout=30)
    worktree = rng.random() < 0.5
    sid = c.call("session.create", {"workspaceId": WS, "provider": "tutti-agent", "cwd": w.cwd})[
        "session"
    ]["agentSessionId"]
    turn = run_turn(c, sid, f"/write seed.md seed {rng.randrange(1000)}" if worktree else "seed")
    with w.lock:
        w.sessions[sid] = [turn["turnId"]]

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
