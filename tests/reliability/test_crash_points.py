"""Crashes at the failpoints the fork matrix does not reach: a Turn's claim, warm start and
checkpoints, a delete's removal, an answered Interaction, the binder's attestation, a
resolution's transient runtime and a durable write's fsync of the store's log. Each case arms
its point `once:kill`, drives the real daemon to it, proves the kill (the process died with
SIGKILL and the point's durable `once:` marker exists), restarts what died, and asserts the end
state docs/reliability.md owes the user, every invariant, and that the daemon serves the next
Turn on that Session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_turn_never_sent import host_only_marks
from tests.reliability.reliability_harness import (
    LEDGER,
    children_of,
    fork_latest_params,
    fork_params,
    host_fired,
    provider_env,
    resolve_params,
    session_exists,
    unwired_reason,
    worker_fired,
    worker_of,
)
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    timeline,
    turn_of,
    wait_for,
)
from tests.support.git_repos import make_repo
from tests.support.invariants import assert_invariants, check_processes
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)


class Trial:
    """One case's daemon home, its Session and the proof that the armed point killed."""

    def __init__(self, provider: str, point: str, home: Path, cwd: Path) -> None:
        self.provider = provider
        self.point = point
        self.home = home
        self.cwd = cwd
        self.d = DaemonProcess(home).start()
        self.sid = ""

    def client(self) -> Client:
        return self.d.client(timeout=60)

    def session(self, c: Client) -> str:
        self.sid = create_session(c, provider=self.provider, cwd=str(self.cwd))["agentSessionId"]
        return self.sid

    def arm(self, c: Client) -> None:
        c.call("debug.failpoints", {"points": {self.point: "once:kill"}})

    def host_killed(self) -> None:
        """The daemon died of its own SIGKILL at the point; a new one starts on the home."""
        assert self.d.wait_exit(60) == -signal.SIGKILL, self.d.tail_log()
        assert host_fired(self.d, self.point)
        self.d.kill()
        self.d = DaemonProcess(self.home).start()

    def worker_killed(self, before: dict[str, Any] | None) -> None:
        """The provider's worker died at the point (its marker) and the supervisor has a new
        one (or none yet: the next call starts it). `before`: the worker that was to die, if
        one ran when the point was armed (the call that reaches it may start it)."""
        wait_for(lambda: worker_fired(self.d, self.point), 60)

        def replaced() -> bool:
            w = worker_of(self.d, self.provider)
            return w is None or before is None or w["pid"] != before["pid"]

        wait_for(replaced, 60)
        # What the dead worker spawned (an app-server, a Claude Code CLI parked for the next
        # Turn) exits after it, an instant later: gone before the next Turn is asked for.
        assert self.d.proc is not None
        assert not check_processes(self.home, self.d.proc.pid)

    def worker(self) -> dict[str, Any]:
        w = worker_of(self.d, self.provider)
        assert w is not None
        return w

    def serves_the_next_turn(self) -> None:
        turn = run_turn(self.client(), self.sid, "after the kill")
        assert turn["outcome"] == "completed", turn

    def forks_next(self) -> str:
        """The next fork of the Session (its newest settled Turn): committed, its child running
        a Turn."""
        c = self.client()
        params = fork_latest_params(self.sid)
        status, body = c.call_raw("fork.create", params)
        assert status in (200, 202), (status, body)
        op = _terminal(c, body["operation"])
        assert op["status"] == "committed", op
        child = run_turn(c, op["targetAgentSessionId"], "in the child")
        assert child["outcome"] == "completed", child
        return "committed"


def _submit_dying(t: Trial, text: str) -> None:
    """A submit whose daemon dies under it: the reply may never come."""
    with contextlib.suppress(Exception):
        submit(t.d.client(timeout=2.0), t.sid, text)


def _settled_or_absent(c: Client, sid: str, known: int) -> list[dict[str, Any]]:
    """The Turns after the first `known`: none, or each settled `interrupted` (never left
    running, never `completed` without its provider's answer)."""
    turns = timeline(c, sid)[known:]
    for turn in turns:
        settled = settle(c, sid, turn["turnId"])
        assert settled["outcome"] == "interrupted", settled
    return turns


# -- the cases ------------------------------------------------------------------------------


def turn_before_claim(t: Trial) -> str:
    c = t.client()
    t.session(c)
    t.arm(c)
    _submit_dying(t, "never claimed")
    t.host_killed()
    turns = _settled_or_absent(t.client(), t.sid, 0)
    assert turns == [], turns  # killed before the claim: never recorded
    return "absent"


def turn_before_warm_start(t: Trial) -> str:
    c = t.client()
    t.session(c)
    assert run_turn(c, t.sid, "warms the runtime")["outcome"] == "completed"
    t.arm(c)
    _submit_dying(t, "claimed, never started")
    t.host_killed()
    turns = _settled_or_absent(t.client(), t.sid, 1)
    assert len(turns) == 1, turns  # claimed: recorded, and settled `interrupted` by recovery
    return "interrupted"


def checkpoint_before(t: Trial) -> str:
    c = t.client()
    t.session(c)
    t.arm(c)
    _submit_dying(t, "its before capture dies")
    t.host_killed()
    turns = _settled_or_absent(t.client(), t.sid, 0)
    return "interrupted" if turns else "absent"


def checkpoint_after(t: Trial) -> str:
    c = t.client()
    t.session(c)
    assert run_turn(c, t.sid, "first")["outcome"] == "completed"
    t.arm(c)
    _submit_dying(t, "its after capture dies")
    t.host_killed()
    c = t.client()
    turns = timeline(c, t.sid)
    assert len(turns) == 2, turns
    # The provider had answered, but the settlement waits for the capture: recovery settles
    # the Turn `interrupted` (no capture, so no `after` claimed for its files).
    done = settle(c, t.sid, turns[1]["turnId"])
    assert done["outcome"] == "interrupted", done
    return "interrupted"


def delete_after_commit(t: Trial) -> str:
    c = t.client()
    t.session(c)
    assert run_turn(c, t.sid, "a transcript")["outcome"] == "completed"
    t.arm(c)
    with contextlib.suppress(Exception):
        t.d.client(timeout=2.0).call("session.delete", {"workspaceId": WS, "agentSessionId": t.sid})
    t.host_killed()
    return _deleted(t)


def delete_discard(t: Trial) -> str:
    c = t.client()
    t.session(c)
    assert run_turn(c, t.sid, "a transcript")["outcome"] == "completed"
    t.arm(c)
    assert c.call("session.delete", {"workspaceId": WS, "agentSessionId": t.sid}) == {
        "deleted": True
    }
    t.host_killed()
    return _deleted(t)


def _deleted(t: Trial) -> str:
    """The delete committed: the Session is gone and the next start removed its runtime dir
    (none left in the trash); the daemon serves a new Session of the same provider."""
    c = t.client()
    assert not session_exists(c, t.sid)
    assert not (t.home / "runtimes" / WS / t.sid).exists()
    trash = t.home / "runtimes" / ".trash"
    assert not trash.exists() or not list(trash.iterdir())
    t.session(c)  # the next Turn runs on a new Session: the deleted one takes none
    return "deleted"


def worker_turn_before_start(t: Trial) -> str:
    c = t.client()
    t.session(c)
    assert run_turn(c, t.sid, "first")["outcome"] == "completed"
    before = t.worker()
    t.arm(c)
    turn = submit(c, t.sid, "its worker dies before the start")
    t.worker_killed(before)
    done = settle(c, t.sid, turn["turnId"])
    assert done["outcome"] == "failed", done  # its runtime was lost with its worker
    return "failed"


def worker_history_before_read(t: Trial) -> str:
    """The worker dies in the history read of the cold start after a Turn its provider never
    got (its worker killed before the start): the Turn whose start it was is settled, never
    left running. A worker that had that Turn's start answers no history final, so the
    runtime is let go with its worker (killed, the Session idle): the next cold start asks
    about both unanswered Turns again and its final history proves both absent."""
    c = t.client()
    t.session(c)
    assert run_turn(c, t.sid, "first")["outcome"] == "completed"
    before = t.worker()
    c.call("debug.failpoints", {"points": {"worker.turn.before_start": "once:kill"}})
    lost = submit(c, t.sid, "its worker dies before the start")
    wait_for(lambda: worker_fired(t.d, "worker.turn.before_start"), 60)
    assert settle(c, t.sid, lost["turnId"])["outcome"] == "failed"
    before = t.worker() if worker_of(t.d, t.provider) else before
    t.arm(c)
    turn = submit(c, t.sid, "its cold start's history read dies")
    t.worker_killed(before)
    done = settle(c, t.sid, turn["turnId"])
    assert done["outcome"] == "failed", done  # its runtime was lost with its worker
    assert_invariants(t.home)
    worker = t.worker()
    os.kill(worker["pid"], signal.SIGKILL)
    wait_for(lambda: (worker_of(t.d, t.provider) or {"pid": 0})["pid"] != worker["pid"], 60)
    assert run_turn(c, t.sid, "a cold start again")["outcome"] == "completed"
    assert host_only_marks(t.home, t.sid) == [0, 1, 1, 0]
    return "failed"


def worker_session_after_start(t: Trial) -> str:
    c = t.client()
    t.session(c)
    before = worker_of(t.d, t.provider)
    t.arm(c)
    turn = submit(c, t.sid, "its runtime's worker dies before the start is answered")
    t.worker_killed(before)
    done = settle(c, t.sid, turn["turnId"])
    # The start, lost unanswered with its worker, is sent again to the next one (nothing of
    # the Turn reached a provider yet): the Turn runs there.
    assert done["outcome"] == "completed", done
    t.serves_the_next_turn()
    return "completed"


def worker_interaction_after_answer(t: Trial) -> str:
    c = t.client()
    t.session(c)
    turn = submit(c, t.sid, "/approve ls")
    pending = wait_for(lambda: turn_of(c, t.sid, turn["turnId"])["interactions"])
    before = t.worker()
    t.arm(c)
    with pytest.raises(ApiError) as lost:
        c.call(
            "interaction.respond",
            {
                "workspaceId": WS,
                "agentSessionId": t.sid,
                "turnId": turn["turnId"],
                "requestId": pending[0]["requestId"],
                "response": {"decision": "approve"},
            },
        )
    # The provider may have taken the answer, but no 200 said so: the record cannot be
    # `resolved` (`interaction_answered`); the Turn settles with its lost runtime and
    # supersedes it, so no pending Interaction stays on a settled Turn.
    assert lost.value.status == 502 and "provider_lost" in str(lost.value), lost.value
    t.worker_killed(before)
    done = settle(c, t.sid, turn["turnId"])
    assert done["outcome"] == "failed", done
    assert [i["status"] for i in done["interactions"]] == ["superseded"], done
    return "failed/superseded"


def worker_turn_after_interrupt(t: Trial) -> str:
    c = t.client()
    t.session(c)
    turn = submit(c, t.sid, "/ask go on?")
    wait_for(lambda: turn_of(c, t.sid, turn["turnId"])["interactions"])
    before = t.worker()
    t.arm(c)
    status, body = c.call_raw(
        "turn.interrupt", {"workspaceId": WS, "agentSessionId": t.sid, "turnId": turn["turnId"]}
    )
    t.worker_killed(before)
    # The provider took the interrupt; its worker died before saying so. An interrupt always
    # ends the Turn: answered with it (the runtime gone, it is settled here), or, if the
    # lost worker's news settled it first, with that.
    done = settle(c, t.sid, turn["turnId"])
    assert done["outcome"] in ("interrupted", "failed"), done
    if status == 200:
        assert body["turn"]["phase"] == "settled", body
    else:
        assert status == 502 and body["reason"] == "provider_lost", (status, body)
    assert [i["status"] for i in done["interactions"]] == ["superseded"], done
    return str(done["outcome"])


def worker_binder_available(t: Trial) -> str:
    c = t.client()
    t.session(c)
    first = run_turn(c, t.sid, "first")
    assert first["outcome"] == "completed"
    before = t.worker()
    t.arm(c)
    target = str(uuid.uuid4())
    params = fork_params(t.sid, first["turnId"], target=target)
    source_pid = c.call("session.get", {"workspaceId": WS, "agentSessionId": t.sid})["session"][
        "providerSessionId"
    ]
    # `runtime.attest` leaves nothing behind and is retried on the next worker: the fork goes
    # on from a fresh verdict and commits its one child.
    op = _terminal(c, c.call("fork.create", params)["operation"])
    t.worker_killed(before)
    assert op["status"] == "committed", op
    assert session_exists(c, target)
    assert len(children_of(t.home, source_pid)) == 1
    return "committed"


def worker_resolve_transient_loaded(t: Trial) -> str:
    c = t.client()
    t.session(c)
    first = run_turn(c, t.sid, "first")
    c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "once:error"}})
    op = _terminal(c, c.call("fork.create", fork_params(t.sid, first["turnId"]))["operation"])
    assert op["status"] == "unknown", op
    # No live runtime of the source: the inspection reads through a transient one.
    t.d.stop()
    t.d = DaemonProcess(t.home).start()
    c = t.client()
    t.arm(c)
    with pytest.raises(ApiError) as lost:
        c.call("fork.resolve", resolve_params(op["operationId"], "inspect"))
    # The worker the inspection started died under it (SIGKILL is -9).
    assert lost.value.status == 502 and "status -9" in str(lost.value), lost.value
    t.worker_killed(None)
    # An inspection changes nothing: the operation stays `unknown`, and the next inspection
    # reads the same one child, still adoptable.
    try:
        got = c.call("fork.resolve", resolve_params(op["operationId"], "inspect"))
    except ApiError as exc:
        raise AssertionError(
            f"{exc}; workers: {c.call('host.status')['workers']}; fired: "
            f"{sorted(os.listdir(t.home / 'run' / 'workers' / 'failpoints-state'))}"
        ) from exc
    assert got["operation"]["status"] == "unknown", got
    assert got["evidence"]["verdict"] == "adoptable", got
    assert len(got["evidence"]["children"]) == 1, got
    return "unknown"


def recovery_before_commits(t: Trial) -> str:
    """A start-up point: the daemon killed after its provider accepted a fork, before its
    commit (a `provider_accepted` leftover); the next start, armed from the environment,
    dies at `host.recovery.before_commits` (the statuses settled, the leftover listed, not
    committed); the one after it commits the leftover: one child, the source served."""
    c = t.client()
    t.session(c)
    first = run_turn(c, t.sid, "first")
    c.call("debug.failpoints", {"points": {"host.fork.before_commit": "once:kill"}})
    target = str(uuid.uuid4())
    with contextlib.suppress(Exception):
        t.d.client(timeout=10.0).call(
            "fork.create", fork_params(t.sid, first["turnId"], target=target)
        )
    assert t.d.wait_exit(60) == -signal.SIGKILL, t.d.tail_log()
    t.d.kill()
    armed = DaemonProcess(t.home, failpoints=f"{t.point}=once:kill")
    with pytest.raises(RuntimeError):  # it died before its ready line
        armed.start()
    assert armed.wait_exit(10) == -signal.SIGKILL
    assert host_fired(armed, t.point)
    armed.kill()
    t.d = DaemonProcess(t.home).start()
    c = t.client()
    assert session_exists(c, target)
    source_pid = c.call("session.get", {"workspaceId": WS, "agentSessionId": t.sid})["session"][
        "providerSessionId"
    ]
    assert len(children_of(t.home, source_pid)) == 1
    return "committed"


def store_wal_sync(t: Trial) -> str:
    """Killed between a durable write's COMMIT and the fsync of the store's log: the write was
    never answered, and it is in the log the kill leaves (a process's death keeps the page
    cache), so the next start reads it: a write may land unanswered, never half."""
    c = t.client()
    t.session(c)
    assert run_turn(c, t.sid, "a transcript")["outcome"] == "completed"
    t.arm(c)
    params = {"workspaceId": WS, "agentSessionId": t.sid, "title": "committed, never synced"}
    with contextlib.suppress(Exception):
        t.d.client(timeout=2.0).call("session.updateTitle", params)
    t.host_killed()
    got = t.client().call("session.get", {"workspaceId": WS, "agentSessionId": t.sid})
    assert got["session"]["title"] == "committed, never synced", got
    return "landed unanswered"


def _terminal(c: Client, op: dict[str, Any]) -> dict[str, Any]:
    def poll() -> dict[str, Any] | None:
        got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
        return got["operation"] if got["operation"]["status"] != "accepted" else None

    return dict(op if op["status"] != "accepted" else wait_for(poll, 60))


@dataclass(frozen=True, slots=True)
class Case:
    drive: Callable[[Trial], str]
    """Drives the daemon to the point, restarts what died, asserts the end state; its name."""
    providers: tuple[str, ...] = ("tutti-agent",)
    """Host points are provider-independent; a driver's point runs on each driver that has it."""
    git: bool = False
    """The Session's folder is a git repository (its Turns are checkpointed)."""
    never_got: int | None = None
    """The kill leaves a settled Turn its provider never had (so no provider binding), its
    start's fate unknown to the host when it settled (not host-only then, schema v24): the
    Session's next cold start reads the provider's history, *final* once no process that may
    hold the start is alive, proves the Turn absent and marks it host-only; the fork's
    provider prefix leaves it out and every later fork commits (docs/reliability.md, table
    1c). Its sequence (1-based); a Turn the provider had is re-bound from its history."""


CASES: dict[str, Case] = {
    "host.turn.before_claim": Case(turn_before_claim),
    "host.turn.before_warm_start": Case(turn_before_warm_start, never_got=2),
    "host.checkpoint.before": Case(checkpoint_before, git=True),
    "host.checkpoint.after": Case(checkpoint_after, git=True),
    "host.session.delete.after_commit": Case(delete_after_commit),
    "host.session.delete.discard": Case(delete_discard),
    "host.recovery.before_commits": Case(recovery_before_commits),
    "host.store.wal_sync": Case(store_wal_sync),
    "worker.turn.before_start": Case(
        worker_turn_before_start, ("tutti-agent", "codex", "claude-code"), never_got=2
    ),
    "worker.history.before_read": Case(worker_history_before_read),
    "worker.session.after_start": Case(worker_session_after_start, ("tutti-agent", "claude-code")),
    "worker.interaction.after_answer": Case(worker_interaction_after_answer),
    "worker.turn.after_interrupt": Case(worker_turn_after_interrupt),
    "worker.binder.available": Case(
        worker_binder_available, ("tutti-agent", "codex", "claude-code")
    ),
    "worker.resolve.transient_loaded": Case(worker_resolve_transient_loaded, ("codex",)),
}
"""Every point this file kills at (tests/layers checks that each point docs/protocol.md names
is killed at here, in the fork matrix or in the crash soak)."""


def _cells() -> list[Any]:
    cells = []
    for point, case in CASES.items():
        for provider in case.providers:
            marks: list[Any] = []
            if provider == "claude-code":
                marks.append(pytest.mark.claude)
            if provider == "codex":
                marks.append(pytest.mark.codex)
            cells.append(pytest.param(point, provider, marks=marks, id=f"{provider}-{point}"))
    return cells


@pytest.mark.parametrize(("point", "provider"), _cells())
def test_kill_at_point_leaves_the_owed_end_state_and_every_law(
    tmp_path: Path, point: str, provider: str
) -> None:
    reason = unwired_reason(provider)
    assert reason is None, f"NOT WIRED: {reason}"
    case = CASES[point]
    home = tmp_path / "home"
    with provider_env(provider, home) as cwd:
        if case.git:
            cwd = make_repo(tmp_path / "repo")
        t = Trial(provider, point, home, cwd)
        try:
            outcome = case.drive(t)
            assert_invariants(home)
            t.serves_the_next_turn()
            if case.never_got is not None:
                # Proven absent by the next Turn's cold start, before that Turn was sent.
                marks = host_only_marks(home, t.sid)
                assert marks == [int(n == case.never_got) for n in range(1, len(marks) + 1)]
            forked = t.forks_next()
            assert_invariants(home)
        except BaseException:
            print(t.d.tail_log())
            raise
        finally:
            t.d.stop()
    LEDGER.record(
        "crash-points",
        f"{provider} {point}",
        outcomes=Counter({outcome: 1}),
        invariant_checks=2,
        note=f"next fork {forked}",
    )
