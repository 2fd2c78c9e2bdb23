"""Store contention through the real daemon: another
process holds SQLite's write lock on the store file. Requests past the store's busy budget
answer 503 `unavailable`/`store_busy` (retryable), never 500; a Turn whose events could not be
written while the lock was held lands every one of them, in order, once the lock is gone; a
settlement is durable before the Turn counts as settled; a store that stays unwritable past
the retry limit settles the Turn `failed` with the reason."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    run_turn,
    settle,
    submit,
    timeline,
    turn_of,
    wait_for,
)
from tests.support.invariants import assert_invariants
from tests.support.store_lock import WriteLockHolder
from tests.support.worktree_forks import tree_state

pytestmark = pytest.mark.timeout(180)


def _daemon(tmp_path: Path, **daemon_keys: object) -> DaemonProcess:
    home = tmp_path / "home"
    home.mkdir(parents=True)
    keys = {"store_busy_timeout_ms": 300, **daemon_keys}
    (home / "agenthost.toml").write_text(
        "[daemon]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    )
    return DaemonProcess(home).start()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = _daemon(tmp_path)
    try:
        yield d
    finally:
        d.stop()


def store_path(d: DaemonProcess) -> Path:
    return d.home / "store.sqlite3"


def test_locked_store_answers_503_store_busy_never_500(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "before the lock")
    with WriteLockHolder(store_path(daemon)):
        replies = [
            c.call_raw("session.create", {"workspaceId": WS, "provider": "tutti-agent"}),
            c.call_raw(
                "session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": "x"}
            ),
            c.call_raw(
                "turn.submit",
                {
                    "workspaceId": WS,
                    "agentSessionId": sid,
                    "requestId": str(uuid.uuid4()),
                    "input": [{"type": "text", "text": "during the lock"}],
                },
            ),
            c.call_raw(
                "fork.create",
                fork_params(WS, sid, timeline(c, sid)[0]["turnId"]),
                timeout=20,
            ),
        ]
    for status, body in replies:
        assert status == 503, body
        assert body["code"] == "unavailable"
        assert body["reason"] == "store_busy"
        assert body["retryable"] is True
    # The daemon keeps serving once the lock is gone, and nothing is left half-done.
    done = run_turn(c, sid, "after the lock")
    assert done["outcome"] == "completed"
    assert all(t["phase"] == "settled" for t in timeline(c, sid))
    daemon.stop()
    assert_invariants(daemon.home)
    # A busy store is retryable and expected: one warning line a refusal, no traceback.
    log = daemon.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
    assert "on Submit: the store is busy" in log


def test_turn_events_written_while_locked_all_land_in_order(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/tool search the-args")
    holder = WriteLockHolder(store_path(daemon)).acquire()
    try:
        # Hold the lock well past the busy budget while the provider streams and completes.
        time.sleep(2.0)
    finally:
        holder.release()
    done = settle(c, sid, turn["turnId"], timeout=60)
    assert done["outcome"] == "completed", done
    kinds = [m["kind"] for m in done["messages"]]
    assert kinds[0] == "user"
    assert "assistant" in kinds and kinds[-1] == "assistant", kinds
    assert done["finalAssistantMessageId"] == done["messages"][-1]["messageId"]
    assert done["rootProviderTurnId"]
    assert done["providerForkBindingState"] == "bound"
    assert_invariants(daemon.home, live_grace_s=5)
    daemon.stop()
    assert_invariants(daemon.home)


def test_turn_settles_failed_when_store_stays_unwritable(tmp_path: Path) -> None:
    d = _daemon(tmp_path, store_retry_limit_seconds=1)
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        # The turn ends at the provider well after the lock is taken (a 300 ms turn once ended
        # before it, on a loaded machine) and its writes then wait past the 1 s retry limit.
        turn = submit(c, sid, "/slow 1500 late")
        with WriteLockHolder(store_path(d)):
            time.sleep(4.5)
        done = settle(c, sid, turn["turnId"], timeout=60)
        assert done["outcome"] == "failed", done
        assert "unwritable" in (done.get("error") or ""), done
        # The Session is usable afterwards.
        assert run_turn(c, sid, "again")["outcome"] == "completed"
    finally:
        d.stop()
    assert_invariants(d.home)


def test_interrupt_works_on_a_turn_whose_settle_is_pending(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/slow 200 quick")
    with WriteLockHolder(store_path(daemon)):
        time.sleep(1.5)  # the Turn completes at the provider; its writes wait for the lock
        status, body = c.call_raw(
            "turn.interrupt", {"workspaceId": WS, "agentSessionId": sid, "turnId": turn["turnId"]}
        )
        # Not durable yet: a retryable 503, never "no active turn", never 500.
        assert status == 503 and body["reason"] == "store_busy", body
    done = settle(c, sid, turn["turnId"], timeout=60)
    assert done["phase"] == "settled"
    wait_for(lambda: turn_of(c, sid, turn["turnId"])["phase"] == "settled")


def test_fork_checkpoint_on_a_locked_store_releases_its_fence_by_itself(tmp_path: Path) -> None:
    """The provider answers while another process holds the write lock: the saga's checkpoint
    (or its abort record) cannot be written. Once the lock is gone the saga ends
    by itself (no fork.get, no restart) and the source's fence is released."""
    home = tmp_path / "home"
    home.mkdir(parents=True)
    (home / "agenthost.toml").write_text("[daemon]\nstore_busy_timeout_ms = 300\n")
    d = DaemonProcess(home, failpoints="worker.fork.before_provider_call=sleep:2000").start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        boundary = run_turn(c, sid, "fork me")
        target = str(uuid.uuid4())
        replies: list[tuple[int, dict]] = []
        import threading

        sender = threading.Thread(
            target=lambda: replies.append(
                d.client().call_raw(
                    "fork.create",
                    {
                        "workspaceId": WS,
                        "agentSessionId": sid,
                        "requestId": str(uuid.uuid4()),
                        "targetAgentSessionId": target,
                        "point": {"type": "throughTurn", "turnId": boundary["turnId"]},
                    },
                    timeout=30,
                )
            )
        )
        sender.start()
        time.sleep(0.8)  # prepared and dispatching are durable; the worker is in its sleep
        with WriteLockHolder(store_path(d)):
            time.sleep(3.0)  # the provider answers meanwhile; no checkpoint can be written
        sender.join(30)
        assert replies and replies[0][0] in (200, 202), replies
        op_id = replies[0][1]["operation"]["operationId"]

        def fenced_write_accepted() -> bool:
            status, _ = c.call_raw(
                "session.updateSettings",
                {"workspaceId": WS, "agentSessionId": sid, "settings": {"k": "v"}},
            )
            return status == 200

        # Without any fork.get: the fence goes by itself once the store is writable.
        wait_for(fenced_write_accepted, 30, interval=0.2)
        assert_invariants(d.home, live_grace_s=10)  # no fence without its saga, live
        op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
        assert op["status"] == "committed", op
    finally:
        d.stop()
    assert_invariants(d.home)


def _set_fsize(pid: int, limit: int | str) -> None:
    import subprocess

    # The soft limit only, so it can be raised again.
    subprocess.run(["prlimit", f"--pid={pid}", f"--fsize={limit}:"], check=True)


def test_full_disk_answers_503_and_turns_settle_once_space_returns(
    daemon: DaemonProcess,
) -> None:
    """A full disk, made real with RLIMIT_FSIZE on the daemon process (its writes past the
    limit fail with EFBIG, as on a full file system): requests that must write answer 503
    `store_busy`, never 500; the Turn running meanwhile settles once space returns."""
    assert __import__("shutil").which("prlimit") is not None, "needs prlimit (util-linux)"
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "warm")
    assert daemon.proc is not None
    turn = submit(c, sid, "/slow 1500 through a full disk")
    files = [p for p in daemon.home.glob("store.sqlite3*") if p.is_file()]
    # No file of the store may grow any further.
    _set_fsize(daemon.proc.pid, max(p.stat().st_size for p in files))
    statuses = []
    try:
        for i in range(40):
            status, body = c.call_raw(
                "session.updateTitle",
                {"workspaceId": WS, "agentSessionId": sid, "title": "t" * 400 + str(i)},
            )
            statuses.append((status, body.get("reason")))
            assert status != 500, body
            if status == 503:
                break
        time.sleep(2.0)  # the Turn completes at the provider meanwhile
    finally:
        _set_fsize(daemon.proc.pid, "unlimited")
    assert (503, "store_busy") in statuses, statuses
    done = settle(c, sid, turn["turnId"], timeout=60)
    assert done["outcome"] == "completed", done
    assert done["finalAssistantMessageId"]
    assert run_turn(c, sid, "space again")["outcome"] == "completed"
    daemon.stop()
    assert_invariants(daemon.home)


def test_a_resolution_whose_rollback_met_a_busy_store_does_not_block_the_next_resolve(
    daemon: DaemonProcess,
) -> None:
    """A `fork.resolve` that fails after its resolution row is durable rolls the row back so a
    new resolve may start; a busy store refused that rollback, and every later resolve of the
    operation was refused "being resolved" (409) until the daemon restarted. Now the next
    resolve finds no resolve of it running in this daemon and rolls the stale row back first."""
    from tests.daemon.test_fork_resolve import resolve, unknown_fork
    from tests.daemon.test_fork_saga import three_turn_source
    from transport.client import ApiError

    c = daemon.client()
    sid, turns = three_turn_source(c)
    op = unknown_fork(c, sid, turns[1]["turnId"], "worker.fork.after_provider_call")
    op_id = op["operationId"]
    # The resolution row lands, then the actor waits 3 s: the store is locked meanwhile.
    c.call("debug.failpoints", {"points": {"host.resolve.after_begin": "once:sleep:3000"}})
    answers: list[BaseException | dict[str, Any]] = []

    def first() -> None:
        try:
            answers.append(resolve(daemon.client(), op_id, "abandon"))
        except ApiError as exc:
            answers.append(exc)

    runner = threading.Thread(target=first)
    runner.start()
    assert wait_for(lambda: resolution_state(daemon, op_id) == "started", 20)
    with WriteLockHolder(store_path(daemon)):
        runner.join(30)
    assert not runner.is_alive()
    (answer,) = answers
    assert isinstance(answer, ApiError) and answer.reason == "store_busy", answer
    assert resolution_state(daemon, op_id) == "started"  # its rollback was refused too
    done = resolve(c, op_id, "abandon")
    assert done["operation"]["status"] == "abandoned", done
    daemon.stop()
    assert_invariants(daemon.home)


def test_leftover_commits_after_ready_that_meet_a_busy_store_land_once_it_frees(
    tmp_path: Path,
) -> None:
    """The `provider_accepted` leftovers a start commits after its ready line
    (`DeferredCommits`) hold their sources fenced until committed. A batch that met a busy
    store was logged and dropped ("the next start retries"): its sources stayed fenced, every
    Turn of them refused, until a `fork.get` of each or a restart. Now the batch is retried
    with backoff until it lands: with the lock held through several busy waits and then let
    go, every leftover ends committed, with no error counted."""
    from actors.recovery import DeferredCommits, recover_fork_operations
    from domain.fork_states import ForkStatus
    from storage.store import Store
    from tests.actors.test_recovery import WS as STORE_WS
    from tests.actors.test_recovery import _accepted

    path = tmp_path / "store.sqlite3"
    store = Store.open(path, busy_timeout_ms=100)
    try:
        accepted = [_accepted(store) for _ in range(5)]
        report = recover_fork_operations(store, commit_before_ready=0)
        assert len(report.deferred) == 5
        deferred = DeferredCommits(store, report.deferred, batch=2)
        with WriteLockHolder(path):
            deferred.start()
            # Several busy waits of the first batch pass while the lock is held.
            assert not deferred.wait(1.5)
        assert deferred.wait(30)
        deferred.close()
        assert (deferred.committed, deferred.errors, deferred.pending) == (5, 0, 0)
        assert deferred.retries >= 2, deferred.retries
        for op_id in accepted:
            assert store.fork_queries.get_fork_operation(STORE_WS, op_id).status is (
                ForkStatus.COMMITTED
            )
    finally:
        store.close()


def test_a_failed_forks_tree_whose_removal_met_a_busy_store_is_recorded_removed(
    tmp_path: Path,
) -> None:
    """A `worktree` fork that fails has its tree removed and then recorded `removed`. A busy
    store that refused the record was logged and dropped ("start-up tries again"): the live
    daemon kept the failed operation's tree recorded `made` though it was gone (law
    `worktree`) until a restart. Now the record is retried with backoff until it lands."""
    from tests.reliability.reliability_harness import host_fired
    from tests.support.worktree_forks import source_in, trees_beside, worktree_fork_params
    from tests.support.worktree_repos import make_repo

    repo = make_repo(tmp_path / "project")
    d = _daemon(tmp_path)
    try:
        c = d.client(timeout=60)
        sid, turn = source_in(c, repo)
        # The fork fails once its tree is recorded (nothing dispatched); its tree is removed,
        # then the actor waits 3 s before recording that: the store is locked meanwhile.
        c.call(
            "debug.failpoints",
            {
                "points": {
                    "host.workspace.after_record": "once:error",
                    "host.workspace.after_remove": "once:sleep:3000",
                }
            },
        )
        params = worktree_fork_params(
            sid, turn["turnId"], request_id=str(uuid.uuid4()), target=str(uuid.uuid4())
        )
        answers: list[dict[str, Any]] = []
        runner = threading.Thread(
            target=lambda: answers.append(d.client().call_raw("fork.create", params)[1])
        )
        runner.start()
        assert wait_for(lambda: host_fired(d, "host.workspace.after_remove"), 30)
        with WriteLockHolder(store_path(d)):
            assert trees_beside(repo) == []
            time.sleep(3.5)  # past the failpoint's sleep: the record meets the lock
        runner.join(30)
        assert not runner.is_alive() and answers
        op_id = answers[0]["operation"]["operationId"]

        def state() -> str:
            got = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
            assert got["status"] == "failed", got
            return str(got["workspace"]["state"])

        assert wait_for(lambda: state() == "removed", 20), state()
        assert_invariants(d.home)
    finally:
        d.stop()
    assert_invariants(d.home)


def test_a_tree_removing_delete_whose_record_met_a_busy_store_still_ends_the_session(
    tmp_path: Path,
) -> None:
    """`session.delete {worktree: "remove"}` of a worktree fork's child: the Session deleted
    (the tree marked `removing`), the tree removed, then recorded `removed`. A busy store that
    refused that last record raised out of the delete: the client was answered 503 for a
    delete that had happened, the deleted Session's runtime was never stopped nor its runtime
    dir removed, and the tree stayed `removing` until a restart. Now the record is retried
    until it lands and the delete ends as any other."""
    from tests.daemon.test_worktree_delete import fork_child
    from tests.reliability.reliability_harness import host_fired
    from tests.support.worktree_repos import make_repo

    repo = make_repo(tmp_path / "project")
    d = _daemon(tmp_path)
    try:
        c = d.client(timeout=60)
        child, where = fork_child(c, repo)
        run_turn(c, child, "in the child")  # its runtime is live, its runtime dir made
        runtime_dir = d.home / "runtimes" / WS / child
        assert runtime_dir.is_dir()
        point = "host.session.delete.after_tree_removed"
        c.call("debug.failpoints", {"points": {point: "once:sleep:3000"}})
        params = {"workspaceId": WS, "agentSessionId": child, "worktree": "remove"}
        answers: list[tuple[int, Any]] = []
        runner = threading.Thread(
            target=lambda: answers.append(d.client(timeout=60).call_raw("session.delete", params))
        )
        runner.start()
        assert wait_for(lambda: host_fired(d, point), 30)
        with WriteLockHolder(store_path(d)):
            time.sleep(3.5)  # past the failpoint's sleep: the record meets the lock
        runner.join(30)
        assert not runner.is_alive()
        ((status, result),) = answers
        assert status == 200 and result["worktree"]["state"] == "removed", (status, result)
        assert not Path(where["path"]).exists()
        assert wait_for(lambda: not runtime_dir.exists(), 20)
        assert wait_for(lambda: tree_state(d, child) == "removed", 20), tree_state(d, child)
    finally:
        d.stop()
    assert_invariants(d.home)


def test_an_answer_the_provider_took_is_recorded_though_the_store_was_busy(
    daemon: DaemonProcess,
) -> None:
    """`interaction.respond`: the worker hands the answer to the provider, then the store
    records it. A busy store that refused the record answered 503 (retryable) though the
    provider had the answer: a retry met the provider's "not pending" (409), the record stayed
    `pending` (the Turn's watchdog waiting on the person) until the Turn's settlement superseded
    it, and the answer the provider took was never recorded. Now the record is retried until it
    lands and the request answered then: 200, `resolved` with the answer."""
    from tests.reliability.reliability_harness import worker_fired

    c = daemon.client(timeout=60)
    sid = create_session(c)["agentSessionId"]
    turn = submit(c, sid, "/approve ls")
    pending = wait_for(lambda: turn_of(c, sid, turn["turnId"])["interactions"])
    point = "worker.interaction.after_answer"
    # The provider takes the answer, then the worker waits 3 s before it replies: the store
    # is locked meanwhile, so the record meets the lock.
    c.call("debug.failpoints", {"points": {point: "once:sleep:3000"}})
    params = {
        "workspaceId": WS,
        "agentSessionId": sid,
        "turnId": turn["turnId"],
        "requestId": pending[0]["requestId"],
        "response": {"decision": "approve"},
    }
    answers: list[tuple[int, Any]] = []
    runner = threading.Thread(
        target=lambda: answers.append(
            daemon.client(timeout=60).call_raw("interaction.respond", params)
        )
    )
    runner.start()
    assert wait_for(lambda: worker_fired(daemon, point), 30)
    with WriteLockHolder(store_path(daemon)):
        time.sleep(4.0)  # past the failpoint's sleep: the record meets the lock
    runner.join(30)
    assert not runner.is_alive()
    ((status, result),) = answers
    assert status == 200, result
    answered = result["interaction"]
    assert (answered["status"], answered["output"]) == ("resolved", {"decision": "approve"})
    done = settle(c, sid, turn["turnId"])
    assert [i["status"] for i in done["interactions"]] == ["resolved"], done
    daemon.stop()
    assert_invariants(daemon.home)


def test_a_turn_orphaned_by_a_kill_is_settled_at_start_though_the_store_was_busy(
    tmp_path: Path,
) -> None:
    """Start-up settles each Turn a previous process left active (`settle_orphaned_turns`). A
    busy store that refused one was logged and skipped ("one bad row must not stop the rest"):
    the daemon served with the Turn `active` that nothing ran, its Session refusing every
    submit (`agent_session_busy`) until an interrupt or the next restart. Now a refused
    settlement is retried with backoff (the start waits): the lock let go, the Turn is
    settled `interrupted`."""
    from actors.recovery import settle_orphaned_turns
    from storage.store import Store
    from tests.storage.store_builders import WS as STORE_WS
    from tests.storage.store_builders import new_session

    path = tmp_path / "store.sqlite3"
    store = Store.open(path, busy_timeout_ms=100)
    try:
        sid = new_session(store)
        turn, _ = store.turns.claim_submit(STORE_WS, sid, "req-1", "left active by a kill")
        holder = WriteLockHolder(path).acquire()
        timer = threading.Timer(1.0, holder.release)
        timer.start()
        try:
            settled = settle_orphaned_turns(store)
        finally:
            timer.join()
        assert settled == 1
        got = store.turns.get_turn(STORE_WS, sid, turn.turn_id)
        assert (got.phase, got.outcome) == ("settled", "interrupted"), got
    finally:
        store.close()


def test_a_failed_forks_tree_a_kill_left_is_recorded_removed_at_start_though_the_store_was_busy(
    tmp_path: Path,
) -> None:
    """A kill between a failed fork's tree removal and its `removed` record leaves it `made`,
    gone on disk; start-up removes what is left and records it (`remove_failed_trees`). A busy
    store that refused that record was logged and dropped: the daemon served with the tree
    recorded `made` though gone (law `worktree`) until the next start. Now the record is
    retried with backoff (the start waits): the lock let go, the tree is recorded `removed`."""
    import apsw

    from actors.fork_workspace import remove_failed_trees
    from storage.store import Store
    from tests.support.worktree_forks import (
        kill_after_a_failed_forks_tree_removed,
        source_in,
        trees_beside,
    )
    from tests.support.worktree_repos import make_repo
    from workspace.shadow import ShadowStore
    from workspace.worktree import ForkTrees

    repo = make_repo(tmp_path / "project")
    d = _daemon(tmp_path)
    try:
        kill_after_a_failed_forks_tree_removed(d, *source_in(d.client(timeout=60), repo))
    finally:
        d.stop()
    assert trees_beside(repo) == []
    path = store_path(d)

    def states() -> list[str]:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            rows = conn.execute(
                "SELECT workspace_state FROM fork_operations WHERE status = 'failed'"
            ).fetchall()
        finally:
            conn.close()
        return [str(r[0]) for r in rows]

    assert states() == ["made"]
    store = Store.open(path, busy_timeout_ms=100)
    try:
        trees = ForkTrees(ShadowStore(d.home / "checkpoints"), None)
        holder = WriteLockHolder(path).acquire()
        timer = threading.Timer(1.0, holder.release)
        timer.start()
        try:
            removed = remove_failed_trees(store, trees)
        finally:
            timer.join()
        assert removed == 1
    finally:
        store.close()
    assert states() == ["removed"]
    assert trees_beside(repo) == []
    assert_invariants(d.home)


def test_a_start_on_a_store_another_process_holds_waits_for_it(tmp_path: Path) -> None:
    """A start whose store another process holds (a backup, a second reader gone wrong) past
    its busy budget failed at once ("cannot start: database is locked": opening the store
    migrates in a write transaction, even with nothing to migrate), and start-up recovery's
    fork writes were not retried either. Now each start-up write the store refuses is retried
    with backoff (past 30 s the start fails): the lock let go, the daemon starts and serves."""
    d = _daemon(tmp_path)
    try:
        c = d.client(timeout=60)
        sid = create_session(c, title="before the restart")["agentSessionId"]
        assert run_turn(c, sid, "one")["outcome"] == "completed"
        d.kill()
        holder = WriteLockHolder(store_path(d)).acquire()
        timer = threading.Timer(1.5, holder.release)
        timer.start()
        try:
            d.start()
        finally:
            timer.join()
        assert run_turn(d.client(timeout=60), sid, "two")["outcome"] == "completed"
        assert_invariants(d.home)
    finally:
        d.stop()


def resolution_state(d: DaemonProcess, op_id: str) -> str | None:
    """The operation's `fork_resolutions` row's state, read beside the daemon (WAL)."""
    import apsw

    conn = apsw.Connection(str(store_path(d)), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute(
            "SELECT state FROM fork_resolutions WHERE operation_id = ?", (op_id,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else str(row[0])


def test_a_start_on_a_full_disk_fails_at_once_naming_the_store(tmp_path: Path) -> None:
    """A start whose store's disk is full (made real with RLIMIT_FSIZE on the new daemon: a
    write past 4 KiB of any file fails, EFBIG, as on a full file system) took the full disk
    for a busy store: it retried its writes (the store's opening first) for 30 s ("deferred",
    a line each backoff) and failed "the store is busy or full, try again". A full disk is no
    other process's lock: the start fails at once, its message naming the store and the full
    disk; the next start with space settles the Turn the kill left and serves."""
    import resource
    import signal

    d = _daemon(tmp_path)
    c = d.client(timeout=60)
    sid = create_session(c, title="before the kill")["agentSessionId"]
    submit(c, sid, "/slow 60000 left active by the kill")
    d.kill()  # the Turn left active: the next start must settle it (a write)
    d.log_path = tmp_path / "full-start.log"  # a new log, under the limit

    def fsize() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    full = DaemonProcess(d.home, preexec_fn=fsize)
    full.log_path = d.log_path
    with pytest.raises(RuntimeError):  # it exited before its ready line
        full.start(timeout=60)
    assert full.wait_exit(10) not in (0, -signal.SIGKILL)
    log = full.log_path.read_text()
    assert log.count("deferred") == 0, log  # the busy store's retry, not once
    said = [line for line in log.splitlines() if "cannot start" in line]
    assert len(said) == 1, log
    assert str(store_path(d)) in said[0] and "full" in said[0], said[0]

    # Space again: the next start settles the Turn and serves.
    d.log_path = d.home / "daemon.log"
    d.start()
    try:
        c = d.client(timeout=60)
        # The Turn the kill left is settled `interrupted` (else the Session refused the next).
        assert run_turn(c, sid, "after the full disk")["outcome"] == "completed"
        assert_invariants(d.home)
    finally:
        d.stop()
