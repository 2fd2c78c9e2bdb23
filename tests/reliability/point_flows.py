"""The directed flow of each failpoint the crash soak arms (`FLOWS`): what the point needs made
first (`Flow.ready`: a settled Session, a warm one, an `unknown` operation, a worktree fork's
child, ...) and the requests that reach it (`Flow.send`), sent just after the soak arms the
point `once:kill`, so the point fires instead of waiting for the random load to reach it (an
armed point nothing reached was turned off unfired by the next restart or stall round).

A flow works on Sessions of its own in the soak's folder (a git repository: every Turn is
checkpointed), made through `Reach`; a helper point it arms on its way (`once:error` to leave a
fork `unknown` or failed, `once:kill` of a Turn's start) is armed through `Reach.helper`, so the
soak's tally never counts its firing as the point's own. The crash matrix's helpers make the
requests (`fork_params`, `worktree_fork_params`, `resolve_params`, `source_in`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from tests.reliability.point_choice import SESSION_START
from tests.reliability.reliability_harness import (
    fork_latest_params,
    fork_params,
    resolve_params,
    worker_fired,
)
from tests.support.daemon import WS, DaemonProcess, submit, turn_of, wait_for
from tests.support.worktree_forks import worktree_fork_params
from transport.client import Client

TUTTI = "tutti-agent"
CLAUDE = "claude-code"
ADOPTABLE = "worker.fork.after_provider_call"
"""Armed `once:error` by `unknown_op`: the provider made the child, the worker says nothing
sure of it, so the fork is `unknown` with one child (adoptable)."""
FAILED_TREE = "host.workspace.after_record"
"""Armed `once:error` by `failed_worktree_fork`: the fork fails before dispatch with its tree
recorded, which the saga then removes (`host.workspace.after_remove`)."""
LOST_START = "worker.turn.before_start"
"""Armed `once:kill` by `lost_start`: the worker dies with a Turn's start, whose fate the host
cannot know; the Session's next cold start reads its provider's history to prove it."""
READY_S = 60.0
"""The bound on a flow's preparation (a Turn, a fork settled) on a loaded machine."""


class NotReady(Exception):
    """What a flow needs could not be made now (a Turn failed thrice, a fork ended otherwise
    under the soak's chaos): the point is not armed."""


class Reach(Protocol):
    """What a flow needs of the soak."""

    cwd: str
    daemon: DaemonProcess

    def session(self, c: Client, provider: str) -> str:
        """A new Session of `provider` in the soak's folder, counted as the soak's."""
        ...

    def keep(self, method: str, params: dict[str, Any], answer: Future[Any]) -> None:
        """A request sent and not awaited: its answer (if any comes) is the soak's to keep."""
        ...

    def helper(self, c: Client, point: str, action: str) -> None:
        """Arms `point` with `action` on the flow's way to its own point (not counted)."""
        ...


@dataclass(frozen=True, slots=True)
class Ready:
    """What a flow made before its point was armed."""

    sid: str
    turn_id: str = ""
    op_id: str = ""


@dataclass(frozen=True, slots=True)
class Flow:
    ready: Callable[[Reach, Client], Ready]
    """Made with the point not yet armed (raises `NotReady`, or `ApiError` for a step the
    daemon refused)."""
    send: Callable[[Reach, Client, Ready], None]
    """The requests that reach the point, none awaited (the point kills their answer)."""
    deletes: bool = False
    """The flow deletes its Session (the soak's clients are not to work in it)."""


# -- what a flow needs made first --------------------------------------------------------------


def within(what: str, pred: Callable[[], Any]) -> Any:
    """`pred`'s first true value within `READY_S`, else `NotReady` saying `what` was awaited."""
    try:
        return wait_for(pred, READY_S)
    except AssertionError:
        raise NotReady(f"{what} not within {READY_S:.0f} s") from None


def completed_turn(c: Client, sid: str, text: str) -> dict[str, Any]:
    """A Turn of `sid` that completed: another is tried when one fails (a client's `once:error`
    of a warm start may meet it), up to three."""
    for _ in range(3):
        turn = submit(c, sid, text)
        done = within("a Turn settled", lambda t=turn: _settled(c, sid, t["turnId"]))
        if done["outcome"] == "completed":
            return dict(done)
    raise NotReady(f"no Turn of {sid} completed: {done}")


def fresh(r: Reach, c: Client) -> Ready:
    return Ready(r.session(c, TUTTI))


def settled(r: Reach, c: Client) -> Ready:
    """A Session with one completed Turn: its runtime warm, its Turn forkable (a worktree fork
    too: the Turn wrote a file and was checkpointed)."""
    sid = r.session(c, TUTTI)
    turn = completed_turn(c, sid, f"/write flow-{sid[:8]}.md a point's flow")
    return Ready(sid, str(turn["turnId"]))


def unknown_op(r: Reach, c: Client) -> Ready:
    """A settled Session forked with `ADOPTABLE` armed `once:error`: its operation `unknown`,
    one child made (what `fork.resolve` inspects, adopts or abandons)."""
    made = settled(r, c)
    r.helper(c, ADOPTABLE, "once:error")
    params = fork_params(made.sid, made.turn_id)
    op = c.call("fork.create", params)["operation"]
    status = str(within("the fork's end", lambda: _status(c, op["operationId"])))
    if status != "unknown":
        raise NotReady(f"the fork ended {status}, not unknown")
    return Ready(made.sid, made.turn_id, str(op["operationId"]))


def tree_child(r: Reach, c: Client) -> Ready:
    """A worktree fork's child, committed (its tree made beside the soak's repository)."""
    made = settled(r, c)
    params = worktree_fork_params(
        made.sid, made.turn_id, request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
    )
    op = c.call("fork.create", params)["operation"]
    status = str(within("the worktree fork's end", lambda: _status(c, op["operationId"])))
    if status != "committed":
        raise NotReady(f"the worktree fork ended {status}")
    return Ready(str(op["targetAgentSessionId"]))


def lost_start(r: Reach, c: Client) -> Ready:
    """A settled Session whose next Turn's start died with its worker (`LOST_START` armed
    `once:kill`): that Turn settled unbound, its fate unknown to the host, so the Session's next
    cold start (on the new worker) reads its provider's history."""
    made = settled(r, c)
    r.helper(c, LOST_START, "once:kill")
    lost = submit(c, made.sid, "its worker dies before the start")
    within("the start's worker killed", lambda: worker_fired(r.daemon, LOST_START))
    within("the lost Turn settled", lambda: _settled(c, made.sid, lost["turnId"]))
    return made


def claude_new(r: Reach, c: Client) -> Ready:
    return Ready(r.session(c, CLAUDE))


def _settled(c: Client, sid: str, turn_id: str) -> dict[str, Any] | None:
    turn = turn_of(c, sid, turn_id)
    return dict(turn) if turn["phase"] == "settled" else None


def _status(c: Client, op_id: str) -> str | None:
    op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
    return None if op["status"] == "accepted" else str(op["status"])


# -- the requests that reach a point ----------------------------------------------------------


def fork(r: Reach, c: Client, x: Ready) -> None:
    params = fork_params(x.sid, x.turn_id)
    r.keep("fork.create", params, c.submit("fork.create", params))


def worktree_fork(r: Reach, c: Client, x: Ready) -> None:
    params = worktree_fork_params(
        x.sid, x.turn_id, request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
    )
    r.keep("fork.create", params, c.submit("fork.create", params))


def failed_worktree_fork(r: Reach, c: Client, x: Ready) -> None:
    r.helper(c, FAILED_TREE, "once:error")
    worktree_fork(r, c, x)


def turn(r: Reach, c: Client, x: Ready) -> None:
    params = {
        "workspaceId": WS,
        "agentSessionId": x.sid,
        "requestId": str(uuid.uuid4()),
        "input": [{"type": "text", "text": "a point's Turn"}],
    }
    r.keep("turn.submit", params, c.submit("turn.submit", params))


def delete(r: Reach, c: Client, x: Ready) -> None:
    params = {"workspaceId": WS, "agentSessionId": x.sid}
    r.keep("session.delete", params, c.submit("session.delete", params))


def delete_tree(r: Reach, c: Client, x: Ready) -> None:
    params = {"workspaceId": WS, "agentSessionId": x.sid, "worktree": "remove", "force": True}
    r.keep("session.delete", params, c.submit("session.delete", params))


def resolve(action: str) -> Callable[[Reach, Client, Ready], None]:
    def send(r: Reach, c: Client, x: Ready) -> None:
        params = resolve_params(x.op_id, action)
        r.keep("fork.resolve", params, c.submit("fork.resolve", params))

    return send


def beside_fork(r: Reach, c: Client, x: Ready) -> None:
    """`SESSION_START`'s cell: a new Claude Code Session none of whose Turns ran, forked whole
    (`latestSettled`) and given its first Turn together, so its Claude worker dies answering
    the `session.start` the two raced for (the Turn's start sent again to the next worker, the
    fork refused or `unknown`)."""
    fork_all = fork_latest_params(x.sid)
    r.keep("fork.create", fork_all, c.submit("fork.create", fork_all))
    turn(r, c, x)


FORK = Flow(settled, fork)
FLOWS: dict[str, Flow] = {
    "host.fork.after_prepare": FORK,
    "host.fork.after_dispatching": FORK,
    "host.fork.after_provider_result": FORK,
    "host.fork.before_commit": FORK,
    "host.fork.after_commit": FORK,
    "worker.fork.before_provider_call": FORK,
    "worker.fork.after_provider_call": FORK,
    "worker.bind.before_copy": FORK,
    "worker.bind.after_copy": FORK,
    "host.resolve.after_begin": Flow(unknown_op, resolve("abandon")),
    "host.resolve.after_bind": Flow(unknown_op, resolve("adopt")),
    "host.resolve.after_accept": Flow(unknown_op, resolve("adopt")),
    "host.resolve.after_quarantine": Flow(unknown_op, resolve("abandon")),
    "host.resolve.after_finish": Flow(unknown_op, resolve("adopt")),
    "host.workspace.after_materialize": Flow(settled, worktree_fork),
    "host.workspace.after_rename": Flow(settled, worktree_fork),
    "host.workspace.after_record": Flow(settled, worktree_fork),
    "host.workspace.after_remove": Flow(settled, failed_worktree_fork),
    "host.turn.before_claim": Flow(fresh, turn),
    "host.turn.before_warm_start": Flow(settled, turn),
    "host.checkpoint.before": Flow(fresh, turn),
    "host.checkpoint.after": Flow(settled, turn),
    "host.session.delete.after_commit": Flow(settled, delete, deletes=True),
    "host.session.delete.discard": Flow(settled, delete, deletes=True),
    "host.session.delete.after_tree_removed": Flow(tree_child, delete_tree, deletes=True),
    SESSION_START: Flow(claude_new, beside_fork),
    "worker.history.before_read": Flow(lost_start, turn),
    "worker.session.before_stop": Flow(settled, delete, deletes=True),
    "host.store.wal_sync": Flow(settled, turn),
}
"""Each point the crash soak arms → its flow (`test_point_choice.py`: one for every point)."""
