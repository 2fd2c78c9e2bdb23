"""The invariant checker itself: clean on a real daemon's home, and each law it guards is
reported when a copy of that home is tampered with the way a bug would leave it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import apsw
import msgpack
import pytest
import zmq

from domain.fork_states import (
    BARRIER_RELEASE_SQL,
    BARRIER_RULE_SQL,
    STAGE_RULE_SQL,
    ForkStatus,
    stage_assignment,
)
from domain.procfs import processes_in
from drivers.worker_spawn import SOCKET_DIR_MARKER, SOCKET_DIR_PREFIX, fallback_socket_dir
from tests.reliability.interaction_chaos import took
from tests.reliability.provider_chaos import ProviderChaos, relay_table
from tests.reliability.read_chaos import Reader
from tests.reliability.reliability_harness import fork_params
from tests.support import invariants
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.git_repos import git, make_repo
from tests.support.homes import child_rollouts, rollouts, runtime_home
from tests.support.invariants import (
    DELETE_CALLS_S,
    DELETE_STOP_S,
    FAULT_RSS_BOUND_KIB,
    STORE_LAWS,
    Answered,
    ForkPaging,
    Law,
    LineageRead,
    ListPaging,
    ProviderFault,
    ReadAnswer,
    TimelinePaging,
    Violation,
    WorkspaceAnswer,
    check_event_bounds,
    check_fork_events,
    check_interaction_answers,
    check_interrupts,
    check_invariants,
    check_provider_faults,
    check_read_answers,
    check_session_events,
    check_socket_dirs,
    check_status_bounds,
    check_turn_events,
    check_workspace_answers,
    homes_waiting,
    repository_state,
    worktree_retrying,
)
from transport.server import MAX_EVENT_BYTES
from workspace.shadow import ShadowStore

pytestmark = pytest.mark.timeout(120)


class Base:
    """A stopped daemon's home: one committed fork and one `unknown` fork with a child."""

    def __init__(self, home: Path, source: str, committed: dict, unknown: dict) -> None:
        self.home = home
        self.source = source
        self.committed = committed
        self.unknown = unknown


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    home = tmp_path_factory.mktemp("inv") / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        t1, t2 = run_turn(c, sid, "one"), run_turn(c, sid, "two")

        def terminal(op_id: str) -> dict:
            def poll() -> dict | None:
                op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
                return op if op["status"] != "accepted" else None

            return dict(wait_for(poll))

        committed = terminal(
            c.call("fork.create", fork_params(sid, t1["turnId"]))["operation"]["operationId"]
        )
        c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "once:kill"}})
        unknown = terminal(
            c.call("fork.create", fork_params(sid, t2["turnId"]))["operation"]["operationId"]
        )
    finally:
        d.stop()
    assert committed["status"] == "committed" and unknown["status"] == "unknown"
    return Base(home, sid, committed, unknown)


def tampered(base: Base, tmp_path: Path, sql: str | None = None, *, flag: bool = True) -> Path:
    """`sql` run on a copy of the base's store behind the daemon's back. Schema v22's and
    v23's CHECKs hold the barrier flag and the stage to the status; a tamper that moves a status
    or an ACK time runs past them and, unless `flag` is false (the columns' own laws), then sets
    every flag and stage to the rule, so the tamper breaks only the law it is about."""
    home = tmp_path / "home"
    shutil.copytree(base.home, home, symlinks=True, ignore=shutil.ignore_patterns("run"))
    if sql:
        conn = apsw.Connection(str(home / "store.sqlite3"))
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("PRAGMA ignore_check_constraints=ON")
        conn.execute(sql)
        if flag:
            conn.execute(
                f"UPDATE fork_operations SET barrier = {BARRIER_RULE_SQL}"
                f" WHERE barrier IS NOT {BARRIER_RULE_SQL}"
            )
            conn.execute(
                f"UPDATE fork_operations SET stage = {STAGE_RULE_SQL}"
                f" WHERE stage IS NOT {STAGE_RULE_SQL}"
            )
        conn.close()
    return home


def laws(home: Path) -> set[Law]:
    return {v.law for v in check_invariants(home).violations}


def test_real_home_after_committed_and_unknown_forks_is_clean(base: Base) -> None:
    report = check_invariants(base.home)
    assert report.ok, report.violations
    assert report.operations == {"committed": 1, "unknown": 1}
    assert report.provider_children == 2 and report.readable_children == 1


def test_missing_lineage_row_breaks_child_iff_committed(base: Base, tmp_path: Path) -> None:
    home = tampered(base, tmp_path, "DELETE FROM fork_lineage")
    assert Law.CHILD_IFF_COMMITTED in laws(home)


def test_child_session_of_uncommitted_operation_is_reported(base: Base, tmp_path: Path) -> None:
    op = base.committed["operationId"]
    home = tampered(
        base, tmp_path, f"UPDATE fork_operations SET status = 'unknown' WHERE operation_id = '{op}'"
    )
    found = laws(home)
    assert Law.CHILD_IFF_COMMITTED in found
    assert Law.SINGLE_ACTIVE not in found  # different boundaries: still one holder each


def test_reservation_kept_by_failed_operation_is_reported(base: Base, tmp_path: Path) -> None:
    op = base.unknown["operationId"]
    home = tampered(
        base, tmp_path, f"UPDATE fork_operations SET status = 'failed' WHERE operation_id = '{op}'"
    )
    assert Law.RESERVATION in laws(home)


def test_a_commit_without_its_provider_accepted_step_is_reported(
    base: Base, tmp_path: Path
) -> None:
    op = base.committed["operationId"]
    home = tampered(
        base,
        tmp_path,
        f"UPDATE fork_operations SET accepted_at_ms = NULL WHERE operation_id = '{op}'",
    )
    assert Law.STEP_ORDER in laws(home)


def test_step_times_out_of_order_are_reported(base: Base, tmp_path: Path) -> None:
    op = base.committed["operationId"]
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET dispatched_at_ms = accepted_at_ms + 1"
        f" WHERE operation_id = '{op}'",
    )
    assert Law.STEP_ORDER in laws(home)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal, status,"
        " created_at_ms, finished_at_ms) SELECT workspace_id, source_session_id, 'g-x', 'set',"
        " 'g', 'finished', {mid}, {mid} FROM fork_operations WHERE operation_id = '{op}'",
        "INSERT INTO goal_controls (workspace_id, session_id, control_id, action, goal, status,"
        " created_at_ms) SELECT workspace_id, source_session_id, 'g-x', 'set', 'g', 'active',"
        " created_at_ms - 1 FROM fork_operations WHERE operation_id = '{op}'",
        "INSERT INTO interactions (workspace_id, session_id, interaction_id, request_id, turn_id,"
        " kind, status, input_json, output_json, created_at_ms, resolved_at_ms)"
        " SELECT workspace_id, source_session_id, 'i-x', 'q-x', source_turn_id, 'question',"
        " 'resolved', '{{}}', '{{\"text\": \"a\"}}', created_at_ms - 5, {mid}"
        " FROM fork_operations WHERE operation_id = '{op}'",
    ],
    ids=["goal_set_inside", "goal_active_when_it_opened", "answer_recorded_inside"],
)
def test_a_fenced_control_inside_a_fence_window_is_reported(
    base: Base, tmp_path: Path, sql: str
) -> None:
    """A goal control or an Interaction's answer the fence should have refused, recorded
    inside the window of the `unknown` fork (prepare → `unknown`)."""
    op = base.unknown["operationId"]
    mid = (
        "(SELECT (created_at_ms + completed_at_ms) / 2 FROM fork_operations"
        f" WHERE operation_id = '{op}')"
    )
    home = tampered(base, tmp_path, sql.format(op=op, mid=mid), flag=False)
    found = [v for v in check_invariants(home).violations if v.law == Law.FENCE_WINDOW]
    assert found, check_invariants(home).violations


def test_a_source_deleted_inside_a_fence_window_is_reported(base: Base, tmp_path: Path) -> None:
    """A `session.delete` of the source the fence should have refused, landed between the
    committed fork's prepare and its commit."""
    op = base.committed["operationId"]
    home = tampered(
        base,
        tmp_path,
        "UPDATE sessions SET deleted = 1, updated_at_ms = (SELECT (created_at_ms"
        f" + completed_at_ms) / 2 FROM fork_operations WHERE operation_id = '{op}')"
        " WHERE session_id = (SELECT source_session_id FROM fork_operations"
        f" WHERE operation_id = '{op}')",
        flag=False,
    )
    found = [
        v
        for v in check_invariants(home).violations
        if v.law == Law.FENCE_WINDOW and "deleted" in v.detail
    ]
    assert found, check_invariants(home).violations


def test_two_active_operations_on_one_source_are_reported(base: Base, tmp_path: Path) -> None:
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET status = 'dispatching' WHERE status = 'unknown';"
        "INSERT INTO fork_operations (workspace_id, operation_id, request_id, request_hash,"
        " source_session_id, target_session_id, source_turn_id, source_provider_session_id,"
        " source_provider_turn_id, source_provider_turn_ids, target_title, driver_kind,"
        " driver_version, binding_mode, snapshot_hash, status, created_at_ms)"
        " SELECT workspace_id, 'op-x', 'req-x', request_hash, source_session_id,"
        f" '{uuid.uuid4()}', source_turn_id, source_provider_session_id,"
        " source_provider_turn_id, source_provider_turn_ids, target_title, driver_kind,"
        " driver_version, binding_mode, snapshot_hash, 'prepared', created_at_ms"
        " FROM fork_operations WHERE status = 'dispatching'",
    )
    assert Law.SINGLE_ACTIVE in laws(home)


def test_second_provider_child_of_one_operation_is_reported(base: Base, tmp_path: Path) -> None:
    home = tampered(base, tmp_path)
    source_home = runtime_home(home, WS, base.source)
    original = child_rollouts(source_home)[0]
    meta_line, rest = original.read_text().split("\n", 1)
    meta = json.loads(meta_line)
    old_id = meta["payload"]["id"]
    new_id = str(uuid.uuid4())
    meta["payload"]["id"] = new_id
    extra = original.with_name(original.name.replace(old_id, new_id))
    extra.write_text(json.dumps(meta) + "\n" + rest)
    assert Law.ONE_PROVIDER_CHILD in laws(home)


def test_child_without_its_rollout_in_its_own_home_is_unreadable(
    base: Base, tmp_path: Path
) -> None:
    home = tampered(base, tmp_path)
    target = base.committed["targetAgentSessionId"]
    for path in rollouts(runtime_home(home, WS, target)):
        path.unlink()
    assert Law.CHILD_READABLE in laws(home)


def _committed_child_lines(base: Base, home: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The committed child's one rollout in its own home, and its lines."""
    (path,) = rollouts(runtime_home(home, WS, base.committed["targetAgentSessionId"]))
    return path, [json.loads(line) for line in path.read_text().splitlines()]


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_committed_tutti_child_naming_another_source_is_reported(
    base: Base, tmp_path: Path
) -> None:
    """`child_readable`, Tutti Agent's: the child names the fork's source thread as the one it
    was forked from (the driver's own proof requires it); a child whose `session_meta` names
    another thread reads, but is not the child the fork committed."""
    home = tampered(base, tmp_path)
    assert Law.CHILD_READABLE not in laws(home)
    path, lines = _committed_child_lines(base, home)
    assert lines[0]["payload"]["forked_from_id"]
    lines[0]["payload"]["forked_from_id"] = str(uuid.uuid4())
    _write_lines(path, lines)
    assert Law.CHILD_READABLE in laws(home)


def test_a_committed_tutti_child_whose_boundary_turn_lost_its_end_is_reported(
    base: Base, tmp_path: Path
) -> None:
    """`child_readable`, Tutti Agent's: every Turn of the frozen prefix has ended in the child
    (the driver's proof refuses one in progress); a child cut before its boundary Turn's
    `task_complete` still loads and still lists the prefix's `task_started` lines."""
    home = tampered(base, tmp_path)
    path, lines = _committed_child_lines(base, home)
    ends = [
        i
        for i, line in enumerate(lines)
        if line["type"] == "event_msg" and line["payload"].get("type") == "task_complete"
    ]
    _write_lines(path, lines[: ends[-1]])
    assert Law.CHILD_READABLE in laws(home)


def test_foreign_key_violation_is_a_store_integrity_failure(base: Base, tmp_path: Path) -> None:
    home = tampered(
        base,
        tmp_path,
        "INSERT INTO session_reservations VALUES ('no-such-ws', 'x', 'no-such-op')",
    )
    assert Law.STORE_INTEGRITY in laws(home)


@pytest.mark.parametrize(
    "stop",
    [lambda d: d.stop(), lambda d: d.kill()],
    ids=["after_clean_stop", "after_sigkill"],
)
def test_checker_reads_a_store_left_by_a_stopped_or_killed_daemon(
    tmp_path: Path, stop: Callable[[DaemonProcess], object]
) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    c = d.client()
    sid = create_session(c)["agentSessionId"]
    run_turn(c, sid, "one")
    stop(d)
    report = check_invariants(tmp_path / "home")
    assert report.ok and report.sessions == 1


# -- the laws that see lost writes, orphaned Turns and orphaned fences ----------------------


def test_completed_turn_without_assistant_message_is_reported(base: Base, tmp_path: Path) -> None:
    home = tampered(
        base,
        tmp_path,
        f"UPDATE turns SET final_assistant_message_id = NULL WHERE session_id = '{base.source}'",
    )
    assert Law.COMPLETED_TURN_RECORDED in laws(home)


def test_completed_turn_without_provider_binding_is_reported(base: Base, tmp_path: Path) -> None:
    home = tampered(
        base,
        tmp_path,
        f"UPDATE turns SET root_provider_turn_id = NULL WHERE session_id = '{base.source}'",
    )
    assert Law.COMPLETED_TURN_RECORDED in laws(home)


def test_a_bound_completed_turn_marked_host_only_is_reported(base: Base, tmp_path: Path) -> None:
    # Past the schema's CHECK (a marked Turn has no provider turn id): the law's first half.
    home = tampered(
        base, tmp_path, f"UPDATE turns SET host_only = 1 WHERE session_id = '{base.source}'"
    )
    assert Law.HOST_ONLY_TURN in laws(home)


def test_a_child_copy_that_lost_its_source_turns_mark_is_reported(
    base: Base, tmp_path: Path
) -> None:
    # The source's first Turn made one its provider never got (settled failed, unbound,
    # marked): the committed child's copy of it is not marked.
    home = tampered(
        base,
        tmp_path,
        "UPDATE turns SET host_only = 1, root_provider_turn_id = NULL, outcome = 'failed'"
        f" WHERE session_id = '{base.source}' AND sequence = 1",
    )
    assert Law.HOST_ONLY_TURN in laws(home)
    # The same tamper on the child too: the copies agree again, the law holds.
    child = base.committed["targetAgentSessionId"]
    both = tampered(
        base,
        tmp_path / "both",
        "UPDATE turns SET host_only = 1, root_provider_turn_id = NULL, outcome = 'failed'"
        f" WHERE session_id IN ('{base.source}', '{child}') AND sequence = 1",
    )
    assert Law.HOST_ONLY_TURN not in laws(both)


def test_a_claim_left_active_behind_its_settled_turn_is_reported(
    base: Base, tmp_path: Path
) -> None:
    # The source's claims were finished by their Turns' binds: one set back to `active` would
    # refuse every fork of the Session (`source_submit_claim_active`) for good.
    home = tampered(
        base,
        tmp_path,
        "UPDATE submit_claims SET status = 'active', finished_at_ms = NULL"
        f" WHERE session_id = '{base.source}'",
    )
    assert Law.TURN_CLAIM in laws(home)


def test_a_claim_whose_text_is_not_its_turns_input_is_reported(base: Base, tmp_path: Path) -> None:
    # A submit replayed with its Turn's real input would be refused, and one with this text
    # answered with the Turn.
    home = tampered(
        base,
        tmp_path,
        f"UPDATE submit_claims SET text = text || ' changed' WHERE session_id = '{base.source}'",
    )
    assert Law.TURN_CLAIM in laws(home)


def test_one_provider_turn_bound_to_two_turns_of_a_session_is_reported(
    base: Base, tmp_path: Path
) -> None:
    # The source's second Turn bound to its first's provider turn, as a re-bind that matched
    # a provider turn another Turn holds would leave it; the child's copies of the source's
    # Turns (another Session) share their provider turns and are no finding.
    clean = tampered(base, tmp_path / "clean")
    assert Law.PROVIDER_TURN_ONCE not in laws(clean)
    home = tampered(
        base,
        tmp_path / "two",
        "UPDATE turns SET root_provider_turn_id = (SELECT root_provider_turn_id FROM turns"
        f" WHERE session_id = '{base.source}' AND sequence = 1)"
        f" WHERE session_id = '{base.source}' AND sequence = 2",
    )
    assert Law.PROVIDER_TURN_ONCE in laws(home)


def test_two_active_turns_of_one_session_are_reported(base: Base, tmp_path: Path) -> None:
    one = tampered(
        base,
        tmp_path / "one",
        "UPDATE turns SET phase = 'active', outcome = NULL, settled_at_ms = NULL"
        f" WHERE session_id = '{base.source}' AND sequence = 2",
    )
    # One active Turn, its claim finished by its bind: what a kill mid-Turn leaves.
    assert Law.TURN_CLAIM not in laws(one)
    two = tampered(
        base,
        tmp_path / "two",
        "UPDATE turns SET phase = 'active', outcome = NULL, settled_at_ms = NULL"
        f" WHERE session_id = '{base.source}'",
    )
    assert Law.TURN_CLAIM in laws(two)


def test_an_active_turn_of_a_deleted_session_is_reported(base: Base, tmp_path: Path) -> None:
    child = base.committed["targetAgentSessionId"]
    home = tampered(
        base,
        tmp_path,
        f"UPDATE sessions SET deleted = 1 WHERE session_id = '{child}';"
        "UPDATE turns SET phase = 'active', outcome = NULL, settled_at_ms = NULL"
        f" WHERE session_id = '{child}' AND sequence = 1",
    )
    assert Law.TURN_CLAIM in laws(home)


def test_active_turn_nothing_works_on_is_reported_when_live(base: Base, tmp_path: Path) -> None:
    home = tampered(
        base,
        tmp_path,
        "UPDATE turns SET phase = 'active', outcome = NULL, settled_at_ms = NULL,"
        " created_at_ms = created_at_ms - 600000"
        f" WHERE session_id = '{base.source}' AND sequence = 2;"
        # Every Message aged, the rows fork children link to included: the guard that keeps
        # those frozen is dropped for this raw edit.
        "DROP TRIGGER messages_linked_frozen;"
        "UPDATE messages SET created_at_ms = created_at_ms - 600000",
    )
    live = {v.law for v in check_invariants(home, live_grace_s=30).violations}
    assert Law.ACTIVE_TURN_WORKED in live
    # A stopped home's active Turn is recovery's to settle at the next start: no violation.
    assert Law.ACTIVE_TURN_WORKED not in laws(home)


def test_fence_held_by_a_gone_saga_is_reported_when_live(base: Base, tmp_path: Path) -> None:
    op = base.unknown["operationId"]
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET status = 'dispatching', completed_at_ms = NULL,"
        " created_at_ms = created_at_ms - 600000, dispatched_at_ms = dispatched_at_ms - 600000"
        f" WHERE operation_id = '{op}'",
    )
    live = {v.law for v in check_invariants(home, live_grace_s=30).violations}
    assert Law.FENCE_HAS_SAGA in live
    assert Law.FENCE_HAS_SAGA not in laws(home)


def test_a_deleted_sessions_runtime_folder_left_is_reported_when_live(
    base: Base, tmp_path: Path
) -> None:
    child = base.committed["targetAgentSessionId"]
    aged = tampered(
        base,
        tmp_path / "aged",
        "UPDATE sessions SET deleted = 1, updated_at_ms = updated_at_ms - 600000"
        f" WHERE session_id = '{child}'",
    )
    (folder,) = (aged / "runtimes").glob(f"*/{child}")
    assert folder.is_dir()
    live = {v.law for v in check_invariants(aged, live_grace_s=30).violations}
    assert Law.DELETED_HOME_GONE in live
    # A stopped home's unfinished delete is its next start's sweep to finish: no violation.
    assert Law.DELETED_HOME_GONE not in laws(aged)
    # Its provider home alone, empty (what an app-server started in it made again after the
    # removal): reported too.
    (home_dir,) = folder.iterdir()
    shutil.rmtree(home_dir)
    home_dir.mkdir()
    live = {v.law for v in check_invariants(aged, live_grace_s=30).violations}
    assert Law.DELETED_HOME_GONE in live
    # Gone: none.
    shutil.rmtree(folder)
    live = {v.law for v in check_invariants(aged, live_grace_s=30).violations}
    assert Law.DELETED_HOME_GONE not in live
    # Gone, but a process still works in it (its HOME there, as a provider's CLI has): reported
    # live, not on the stopped home; once it has ended, none.
    env = {**os.environ, "HOME": str(folder / "claude-config" / ".home")}
    worker = subprocess.Popen(["sleep", "60"], env=env)
    try:
        found = [
            v.detail
            for v in check_invariants(aged, live_grace_s=30).violations
            if v.law is Law.DELETED_HOME_GONE
        ]
        assert any(f"process {worker.pid} still works" in m for m in found), found
        assert Law.DELETED_HOME_GONE not in laws(aged)
    finally:
        worker.kill()
        worker.wait()
    live = {v.law for v in check_invariants(aged, live_grace_s=30).violations}
    assert Law.DELETED_HOME_GONE not in live
    # Deleted a moment ago (its runtime may still be stopping): none yet. Stamped now, as a
    # delete stamps it: the module's base may be older than the law's bound by this test.
    now_ms = int(time.time() * 1000)
    fresh = tampered(
        base,
        tmp_path / "fresh",
        f"UPDATE sessions SET deleted = 1, updated_at_ms = {now_ms} WHERE session_id = '{child}'",
    )
    live = {v.law for v in check_invariants(fresh, live_grace_s=30).violations}
    assert Law.DELETED_HOME_GONE not in live


def test_a_process_of_a_stopped_runtime_left_running_is_reported_when_live(
    base: Base, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process under the home's `runtimes/` carrying a runtime's marker with no process of
    that runtime under a live worker (its stop, or its worker's death, left it) is reported on
    the live home; one whose runtime's process is a live worker's child is not, nor a stopped
    home (its next start's sweep ends it)."""
    monkeypatch.setattr(invariants, "STOPPED_LEFT_WAIT_S", 0.2)
    (folder,) = (base.home / "runtimes").glob(f"*/{base.source}")
    env = {
        **os.environ,
        "HOME": str(folder / "tutti-agent-home" / ".home"),
        "AGENTHOST_RUNTIME": "stopped-one",
    }
    left = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    # A running runtime: its provider (a `sh` here) a child of a "worker" (a process whose
    # environment holds the worker's variable), and what it started.
    running_env = {**env, "AGENTHOST_RUNTIME": "running-one"}
    worker_env = {**os.environ, "AGENTHOST_WORKER_PARENT_PID": str(os.getpid())}
    script = (
        "import json, subprocess, sys; subprocess.run(['sleep', '60'], env=json.loads(sys.argv[1]))"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(running_env)],
        env=worker_env,
        start_new_session=True,
    )
    try:
        runtimes = base.home / "runtimes"
        wait_for(lambda: processes_in(str(runtimes), marked="AGENTHOST_RUNTIME")[1:], 10)
        found = [
            v.detail
            for v in check_invariants(base.home, live_grace_s=30).violations
            if v.law is Law.STOPPED_RUNTIME_LEFT
        ]
        assert len(found) == 1 and f"process {left.pid} of runtime stopped-one" in found[0]
        assert Law.STOPPED_RUNTIME_LEFT not in laws(base.home)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        for proc in (left, worker):
            proc.kill()
            proc.wait()


def test_a_deleted_sessions_folder_whose_removal_waits_for_a_call_is_judged_by_its_bound(
    base: Base, tmp_path: Path
) -> None:
    """A folder the live daemon lists as waiting for a worker call in flight at its delete
    (`host.status` → `homeRemovals`) may stay past the stop's bound, within the call's
    (`DELETE_CALLS_S`); past that, or not listed, it is reported."""
    child = base.committed["targetAgentSessionId"]
    age_ms = int((DELETE_STOP_S + DELETE_CALLS_S / 2) * 1000)
    aged = tampered(
        base,
        tmp_path / "aged",
        f"UPDATE sessions SET deleted = 1, updated_at_ms = updated_at_ms - {age_ms}"
        f" WHERE session_id = '{child}'",
    )
    status = {
        "homeRemovals": [
            {"workspaceId": WS, "agentSessionId": child, "calls": 1, "held": 0, "waitingMs": 1}
        ]
    }
    assert homes_waiting(status) == [(WS, child)]
    # Not listed: past the stop's bound, reported.
    live = {v.law for v in check_invariants(aged, live_grace_s=30).violations}
    assert Law.DELETED_HOME_GONE in live
    # Listed as waiting for a call: within that call's bound, not reported.
    live = {
        v.law
        for v in check_invariants(
            aged, live_grace_s=30, waiting_homes=homes_waiting(status)
        ).violations
    }
    assert Law.DELETED_HOME_GONE not in live
    # Listed with no call in flight (only calls held for it): the stop's bound again.
    status["homeRemovals"][0]["calls"] = 0
    assert homes_waiting(status) == []
    # Listed, but deleted longer ago than the stop's and the call's bounds: reported.
    older = tampered(
        base,
        tmp_path / "older",
        "UPDATE sessions SET deleted = 1, updated_at_ms = updated_at_ms"
        f" - {int((DELETE_STOP_S + DELETE_CALLS_S) * 1000) + 60_000}"
        f" WHERE session_id = '{child}'",
    )
    live = {
        v.law
        for v in check_invariants(older, live_grace_s=30, waiting_homes=[(WS, child)]).violations
    }
    assert Law.DELETED_HOME_GONE in live


def test_fresh_real_home_is_clean_under_the_live_laws(base: Base) -> None:
    assert check_invariants(base.home, live_grace_s=0.0).ok


# -- the laws beyond the seed: one boundary, one dispatch, no evidence lost ------------------


def _unknown_child(base: Base, home: Path) -> Path:
    """The `unknown` operation's provider child, where the provider wrote it (the source home)."""
    committed_child = base.committed["session"]["providerSessionId"]
    found = [
        p
        for p in child_rollouts(runtime_home(home, WS, base.source))
        if committed_child not in p.name
    ]
    assert len(found) == 1, found
    return found[0]


_COPY_OP = (
    "INSERT INTO fork_operations (workspace_id, operation_id, request_id, request_hash,"
    " source_session_id, target_session_id, point_kind, source_turn_id,"
    " source_provider_session_id, source_provider_turn_id, source_provider_turn_ids,"
    " target_title, driver_kind, driver_version, binding_mode, snapshot_hash, status,"
    " created_at_ms, completed_at_ms)"
    " SELECT workspace_id, '{new}', 'req-{new}', request_hash, source_session_id,"
    " '{target}', {point}, source_turn_id, source_provider_session_id,"
    " source_provider_turn_id, {prefix}, target_title, driver_kind, driver_version,"
    " binding_mode, snapshot_hash, '{status}', created_at_ms, completed_at_ms"
    " FROM fork_operations WHERE operation_id = '{of}'"
)


def test_latest_settled_operation_on_an_unknown_boundary_is_a_second_barrier_holder(
    base: Base, tmp_path: Path
) -> None:
    home = tampered(
        base,
        tmp_path,
        _COPY_OP.format(
            new="op-latest",
            target=uuid.uuid4(),
            point="'latest_settled'",
            prefix="source_provider_turn_ids",
            status="dispatching",
            of=base.unknown["operationId"],
        ),
    )
    assert Law.BOUNDARY_BARRIER in laws(home)


def test_a_barrier_flag_not_the_rule_is_reported(base: Base, tmp_path: Path) -> None:
    """Schema v22: the flag set behind the store's back, past its CHECK: a holder the barrier's
    index no longer finds, and a released operation it still finds."""
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET barrier = 0"
        f" WHERE operation_id = '{base.unknown['operationId']}'",
        flag=False,
    )
    assert Law.BARRIER_FLAG in laws(home)
    # And an ACKed commit flagged as holding it.
    home = tampered(
        base,
        tmp_path / "2",
        "UPDATE fork_operations SET client_observed_at_ms = 1, barrier = 1"
        f" WHERE operation_id = '{base.committed['operationId']}'",
        flag=False,
    )
    assert Law.BARRIER_FLAG in laws(home)


def test_a_stage_not_the_status_is_reported(base: Base, tmp_path: Path) -> None:
    """Schema v23: the stage set behind the store's back, past its CHECK: an `unknown`
    operation the title's count and the prefixes would no longer see (0), and a committed one
    the fence probe would find active (2)."""
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET stage = 0"
        f" WHERE operation_id = '{base.unknown['operationId']}'",
        flag=False,
    )
    assert Law.STAGE_COLUMN in laws(home)
    home = tampered(
        base,
        tmp_path / "2",
        "UPDATE fork_operations SET stage = 2"
        f" WHERE operation_id = '{base.committed['operationId']}'",
        flag=False,
    )
    assert Law.STAGE_COLUMN in laws(home)


def test_a_deleted_tree_path_not_the_deleted_trees_is_reported(base: Base, tmp_path: Path) -> None:
    """Schema v25: a path `session.create` would refuse on a fork that deleted no tree, and a
    tree recorded `removed` without its path (a Session could start in it)."""
    op = base.committed["operationId"]
    home = tampered(
        base,
        tmp_path,
        f"UPDATE fork_operations SET deleted_tree_path = '/t/x' WHERE operation_id = '{op}'",
    )
    assert Law.DELETED_TREE_PATH in laws(home)
    home = tampered(
        base,
        tmp_path / "2",
        "UPDATE fork_operations SET workspace_mode = 'worktree',"
        " workspace_json = '{\"path\": \"/t/x\"}', workspace_state = 'removed'"
        f" WHERE operation_id = '{op}'",
    )
    assert Law.DELETED_TREE_PATH in laws(home)


def test_a_failed_forks_worktree_left_registered_or_its_branch_left_is_reported(
    base: Base, tmp_path: Path
) -> None:
    """A failed fork's tree recorded `removed` is gone from the person's repository too: a
    worktree registration left (a `worktree add` killed mid-checkout leaves one locked, which
    `git worktree prune` keeps) or its branch still at the commit it was made from is named;
    the same record with neither is clean."""
    repo = make_repo(tmp_path / "project")
    head = git(repo, "rev-parse", "HEAD")
    short = "abcd1234"
    top = tmp_path / "project.agenthost" / short
    work = top.parent / f".partial-{short}" / short
    branch = f"agenthost/t-{short}"
    plan = {
        "operationId": base.unknown["operationId"],
        "path": str(top),
        "childCwd": str(top),
        "branch": branch,
        "sourceCwd": str(repo),
        "checkpoint": head,
        "headCommit": head,
        "repoRoot": str(repo),
    }

    def worktree_laws(name: str) -> list[str]:
        home = tampered(
            base,
            tmp_path / name,
            "UPDATE fork_operations SET status = 'failed', completed_at_ms = 1,"
            f" workspace_mode = 'worktree', workspace_json = '{json.dumps(plan)}',"
            " workspace_state = 'removed', deleted_tree_path = NULL"
            f" WHERE operation_id = '{base.unknown['operationId']}'",
        )
        return [v.detail for v in check_invariants(home).violations if v.law is Law.WORKTREE]

    assert worktree_laws("clean") == []
    git(repo, "branch", branch)
    assert worktree_laws("branch") == [f"failed {plan['operationId']} left {branch} in {repo}"]
    git(repo, "branch", "-D", branch)
    git(repo, "worktree", "add", "-q", "-b", branch, str(work))
    git(repo, "worktree", "lock", "--reason", "initializing", str(work))
    shutil.rmtree(top.parent)
    git(repo, "update-ref", "-d", f"refs/heads/{branch}")
    found = worktree_laws("registered")
    assert found == [f"failed {plan['operationId']} left {work} in {repo}"], found


def test_a_failed_forks_tree_kept_past_the_grace_is_reported_unless_the_daemon_retries_it(
    base: Base, tmp_path: Path
) -> None:
    """A failed fork's tree still on disk (`made`) long after the failure breaks the worktree
    law, unless the live daemon's `host.status` lists it as being retried (git could not
    remove it, or a Session works in it: `worktree_retrying`); a tree listed for another
    reason, or another tree listed, does not excuse it."""
    top = tmp_path / "trees" / "abcd1234"
    (top / "src").mkdir(parents=True)
    plan = {"operationId": base.unknown["operationId"], "path": str(top), "childCwd": str(top)}
    home = tampered(
        base,
        tmp_path / "home",
        "UPDATE fork_operations SET status = 'failed', completed_at_ms = 1,"
        f" workspace_mode = 'worktree', workspace_json = '{json.dumps(plan)}',"
        " workspace_state = 'made', deleted_tree_path = NULL"
        f" WHERE operation_id = '{base.unknown['operationId']}'",
    )

    def worktree_laws(*trees: dict[str, str]) -> list[str]:
        retrying = worktree_retrying({"worktreeRemovals": {"trees": list(trees)}})
        report = check_invariants(home, retrying_trees=retrying)
        return [v.detail for v in report.violations if v.law is Law.WORKTREE]

    kept = f"failed {plan['operationId']} kept its tree {top} (state made)"
    assert worktree_laws() == [kept]
    assert worktree_laws({"path": str(top), "reason": "not_tried"}) == [kept]
    assert worktree_laws({"path": str(top.parent), "reason": "git_failed"}) == [kept]
    assert worktree_laws({"path": str(top), "reason": "git_failed"}) == []
    assert worktree_laws({"path": str(top), "reason": "in_use"}) == []


def test_a_retried_failed_tree_git_half_removed_is_no_finding_a_live_one_without_git_is(
    base: Base, tmp_path: Path
) -> None:
    """A failed fork's tree the live daemon retries may be half-removed: git took its `.git`
    file, then failed on a file it could not unlink. That is no worktree law broken (the
    retries remove the rest); a committed fork's tree without its `.git` file still is."""
    repo = make_repo(tmp_path / "project")
    head = git(repo, "rev-parse", "HEAD")
    top = tmp_path / "project.agenthost" / "abcd1234"
    top.mkdir(parents=True)
    (top / "left.txt").write_text("a file git could not unlink\n")

    def worktree_laws(name: str, op: dict, status: str, retrying: list[str]) -> list[str]:
        plan = {
            "operationId": op["operationId"],
            "path": str(top),
            "childCwd": str(top),
            "headCommit": head,
            "repoRoot": str(repo),
        }
        home = tampered(
            base,
            tmp_path / name,
            f"UPDATE fork_operations SET status = '{status}', completed_at_ms = 1,"
            f" workspace_mode = 'worktree', workspace_json = '{json.dumps(plan)}',"
            " workspace_state = 'made', deleted_tree_path = NULL"
            f" WHERE operation_id = '{op['operationId']}'",
        )
        report = check_invariants(home, retrying_trees=retrying)
        return [v.detail for v in report.violations if v.law is Law.WORKTREE]

    assert worktree_laws("failed", base.unknown, "failed", [str(top)]) == []
    live = worktree_laws("committed", base.committed, "committed", [])
    assert live == [f"{base.committed['operationId']}: {top} is not a worktree of {repo}"], live


def test_provider_child_no_operation_may_own_is_reported(base: Base, tmp_path: Path) -> None:
    op = base.unknown["operationId"]
    # The child stays, its operation is recorded as having never dispatched a fork.
    home = tampered(
        base,
        tmp_path,
        f"UPDATE fork_operations SET status = 'failed' WHERE operation_id = '{op}';"
        f"DELETE FROM session_reservations WHERE operation_id = '{op}'",
    )
    assert Law.CHILD_OWNED in laws(home)


def test_provider_child_showing_another_prefix_than_its_owner_froze_is_reported(
    base: Base, tmp_path: Path
) -> None:
    op = base.unknown["operationId"]
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET source_provider_turn_ids = '[\"not-a-turn\"]'"
        f" WHERE operation_id = '{op}'",
    )
    assert Law.CHILD_OWNED in laws(home)


def test_two_children_of_one_prefix_beside_another_operation_are_reported(
    base: Base, tmp_path: Path
) -> None:
    # A second `unknown` operation of the source through another prefix, with no child yet;
    # the first operation's prefix forked twice: two children show it. As many unrecorded
    # children as operations that may own one, each showing some operation's prefix — but
    # one prefix twice.
    home = tampered(
        base,
        tmp_path,
        _COPY_OP.format(
            new="op-other",
            target=uuid.uuid4(),
            point="point_kind",
            prefix="'[\"another-turn\"]'",
            status="unknown",
            of=base.unknown["operationId"],
        ),
    )
    assert Law.CHILD_OWNED not in laws(home)
    child = _unknown_child(base, home)
    lines = child.read_text().splitlines(keepends=True)
    meta = json.loads(lines[0])
    old_id, new_id = meta["payload"]["id"], str(uuid.uuid4())
    meta["payload"]["id"] = new_id
    twin = child.with_name(child.name.replace(old_id, new_id))
    twin.write_text(json.dumps(meta) + "\n" + "".join(lines[1:]))
    assert Law.CHILD_OWNED in laws(home)


def test_deleted_source_of_an_unknown_operation_is_lost_evidence(
    base: Base, tmp_path: Path
) -> None:
    home = tampered(
        base, tmp_path, f"UPDATE sessions SET deleted = 1 WHERE session_id = '{base.source}'"
    )
    assert Law.UNKNOWN_EVIDENCE in laws(home)
    home2 = tampered(base, tmp_path / "2")
    shutil.rmtree(runtime_home(home2, WS, base.source))
    assert Law.UNKNOWN_EVIDENCE in laws(home2)


def test_another_operations_child_in_an_abandoned_quarantine_is_reported(
    base: Base, tmp_path: Path
) -> None:
    # An abandoned operation through Turn 1 whose quarantine took the unknown fork's child
    # (through Turn 2): the abandon claimed a child of another live operation.
    home = tampered(
        base,
        tmp_path,
        _COPY_OP.format(
            new="op-abandoned",
            target=uuid.uuid4(),
            point="point_kind",
            prefix="source_provider_turn_ids",
            status="abandoned",
            of=base.committed["operationId"],
        ),
    )
    child = _unknown_child(base, home)
    source_home = runtime_home(home, WS, base.source)
    dest = source_home / "quarantine" / "op-abandoned" / child.relative_to(source_home)
    dest.parent.mkdir(parents=True)
    child.rename(dest)
    assert Law.QUARANTINE in laws(home)


def _source_checkpoint(home: Path, source: str) -> dict:
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        rows = conn.execute(
            "SELECT checkpoint_json FROM turns WHERE session_id = ? ORDER BY sequence", (source,)
        ).fetchall()
    finally:
        conn.close()
    return dict(json.loads(rows[0][0]))


def test_a_checkpoint_its_ref_no_longer_keeps_is_reported(base: Base, tmp_path: Path) -> None:
    """A Turn's tree is kept by its Session's ref of that tree (`<session>/+<commit>`), or by
    the Turn's own ref as older stores wrote it: with neither, it is reported."""
    record = _source_checkpoint(base.home, base.source)
    assert record["after"] and record["before"]  # the base's Turns were checkpointed
    home = tampered(base, tmp_path)
    assert Law.CHECKPOINT_KEPT not in laws(home)
    repo = ShadowStore(home / "checkpoints").repo_dir(Path(record["cwd"]))
    env = {"GIT_DIR": str(repo)}
    refs = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname)", f"refs/agenthost/{base.source}/"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    shared = f"refs/agenthost/{base.source}/+{record['after']}"
    assert shared in refs
    subprocess.run(["git", "update-ref", "-d", shared], env=env, check=True)
    assert Law.CHECKPOINT_KEPT in laws(home)
    # An older store's per-Turn refs keep it as well.
    for turn_id, which, tree in _source_trees(home, base.source):
        if tree == record["after"]:
            own = f"refs/agenthost/{base.source}/{turn_id}/{which}"
            subprocess.run(["git", "update-ref", own, tree], env=env, check=True)
    assert Law.CHECKPOINT_KEPT not in laws(home)


def test_a_checkpoint_whose_ref_names_a_tree_the_store_lacks_is_reported(
    base: Base, tmp_path: Path
) -> None:
    """A ref names its tree whether or not the object is there (a loose ref file is written
    without a look at the objects): a record naming a tree its ref keeps but the store does
    not hold — what a capture naming a tree `git gc` had collected would leave — is
    reported, as no fork could make its files from it."""
    record = _source_checkpoint(base.home, base.source)
    conn = apsw.Connection(str(base.home / "store.sqlite3"))
    try:
        # The Turn `_source_checkpoint` read (the source's first).
        turn_id = str(
            conn.execute(
                "SELECT turn_id FROM turns WHERE session_id = ? ORDER BY sequence LIMIT 1",
                (base.source,),
            ).fetchall()[0][0]
        )
    finally:
        conn.close()
    ghost = hashlib.sha1(b"a tree no checkpoint store holds").hexdigest()
    broken = json.dumps({**record, "after": ghost}).replace("'", "''")
    home = tampered(
        base,
        tmp_path,
        f"UPDATE turns SET checkpoint_json = '{broken}' WHERE session_id = '{base.source}'"
        f" AND turn_id = '{turn_id}'",
    )
    assert Law.CHECKPOINT_KEPT in laws(home)  # no ref keeps it yet
    repo = ShadowStore(home / "checkpoints").repo_dir(Path(record["cwd"]))
    ref = repo / "refs" / "agenthost" / base.source / f"+{ghost}"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(ghost + "\n")
    found = [v.detail for v in check_invariants(home).violations if v.law is Law.CHECKPOINT_KEPT]
    assert found and all("no tree in the store" in d for d in found), found


def _source_trees(home: Path, source: str) -> list[tuple[str, str, str]]:
    """(turn, `before`|`after`, tree) of every tree the source's Turn records name."""
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        rows = conn.execute(
            "SELECT turn_id, checkpoint_json FROM turns WHERE session_id = ?"
            " AND checkpoint_json IS NOT NULL",
            (source,),
        ).fetchall()
    finally:
        conn.close()
    out = []
    for turn_id, text in rows:
        rec = json.loads(text)
        out += [(str(turn_id), w, str(rec[w])) for w in ("before", "after") if rec.get(w)]
    return out


def test_a_settled_turn_recorded_without_its_after_checkpoint_is_reported(
    base: Base, tmp_path: Path
) -> None:
    record = _source_checkpoint(base.home, base.source)
    broken = json.dumps({**record, "after": None}).replace("'", "''")
    home = tampered(
        base,
        tmp_path,
        f"UPDATE turns SET checkpoint_json = '{broken}' WHERE session_id = '{base.source}'",
    )
    assert Law.CHECKPOINT_KEPT in laws(home)


def test_a_turns_changed_files_unlike_its_own_before_and_after_are_reported(
    base: Base, tmp_path: Path
) -> None:
    """A record lists its Turn's changes against that Turn's own `before`: a record given
    another Turn's list is caught."""
    record = _source_checkpoint(base.home, base.source)
    assert record["before"] == record["after"] and record["changedFiles"] == []
    assert Law.CHECKPOINT_CHANGES not in laws(tampered(base, tmp_path / "clean"))
    other = [{"path": "written-by-another-turn.txt", "kind": "added"}]
    broken = json.dumps({**record, "changedFiles": other}).replace("'", "''")
    home = tampered(
        base,
        tmp_path,
        f"UPDATE turns SET checkpoint_json = '{broken}' WHERE session_id = '{base.source}'",
    )
    assert Law.CHECKPOINT_CHANGES in laws(home)


def _write_ref(home: Path, cwd: str, name: str, tree: str) -> None:
    """A loose ref file under `refs/agenthost/` of `cwd`'s shadow store, as `keep` writes it."""
    ref = ShadowStore(home / "checkpoints").repo_dir(Path(cwd)) / "refs" / "agenthost" / name
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(tree + "\n")


def test_a_restore_undo_ref_naming_a_tree_the_store_lacks_is_reported(
    base: Base, tmp_path: Path
) -> None:
    """A live Session's `restore-<ns>/before` ref must name a tree the store holds (the undo
    a person restores from); one of a deleted Session's is no longer its law."""
    record = _source_checkpoint(base.home, base.source)
    home = tampered(base, tmp_path)
    _write_ref(home, record["cwd"], f"{base.source}/restore-1/before", record["after"])
    assert Law.RESTORE_UNDO_KEPT not in laws(home)
    ghost = hashlib.sha1(b"an undo no checkpoint store holds").hexdigest()
    _write_ref(home, record["cwd"], f"{base.source}/restore-2/before", ghost)
    found = [v.detail for v in check_invariants(home).violations if v.law is Law.RESTORE_UNDO_KEPT]
    assert len(found) == 1 and "restore-2" in found[0], found
    conn = apsw.Connection(str(home / "store.sqlite3"))
    conn.execute("UPDATE sessions SET deleted = 1 WHERE session_id = ?", (base.source,))
    conn.close()
    assert Law.RESTORE_UNDO_KEPT not in laws(home)


def test_restore_and_diff_answers_unlike_the_store_are_reported(base: Base, tmp_path: Path) -> None:
    """`check_workspace_answers`: a restore's answered undo kept by no `restore-*/before` ref
    of its Session, a restore that restored another tree than asked, and `changedFiles` that
    are not the diff of the answer's two trees are each reported; the true answers are not."""
    record = _source_checkpoint(base.home, base.source)
    home = tampered(base, tmp_path)
    tree, cwd = str(record["after"]), str(record["cwd"])
    restore = WorkspaceAnswer(
        "workspace.restore", base.source, cwd, tree, tree, frozenset(), asked=tree
    )
    diff = WorkspaceAnswer("session.workspaceDiff", base.source, cwd, tree, tree, frozenset())

    def found(*answers: WorkspaceAnswer) -> list[Law]:
        return [v.law for v in check_workspace_answers(home, answers)]

    assert found(restore) == [Law.RESTORE_UNDO_KEPT]  # no ref keeps the undo yet
    _write_ref(home, cwd, f"{base.source}/restore-1/before", tree)
    assert found(restore, diff) == []
    other = frozenset({("written-by-another-turn.txt", "added")})
    assert found(replace(diff, changed=other)) == [Law.WORKSPACE_ANSWER]
    assert found(replace(restore, changed=other)) == [Law.WORKSPACE_ANSWER]
    ghost = hashlib.sha1(b"another tree").hexdigest()
    assert found(replace(restore, asked=ghost)) == [Law.WORKSPACE_ANSWER]
    # The law of a kept undo is a live Session's.
    assert found(replace(restore, session="gone-session", tree_from=ghost)) == []


def test_a_cloned_message_unlike_its_source_is_reported(base: Base, tmp_path: Path) -> None:
    home = tampered(
        base,
        tmp_path,
        # The child reads its cloned Messages through its history link: each read with ids
        # of another prefix than the operation's.
        "UPDATE history_links SET message_prefix = 'ffffffff' || substr(message_prefix, 9)",
    )
    assert Law.CHILD_HISTORY_COPIED in laws(home)


def test_a_committed_snapshot_that_no_longer_loads_is_reported(base: Base, tmp_path: Path) -> None:
    """Snapshot version 5 stores each Turn as an array of `turn_fields`; a committed operation
    whose stored document no longer names them — its hash re-stamped, so only the shape is
    wrong — cannot be projected: the checker reports it."""
    home = tampered(base, tmp_path)
    conn = apsw.Connection(str(home / "store.sqlite3"))
    op = base.committed["operationId"]
    row = conn.execute(
        "SELECT s.op_seq, s.snapshot_json FROM fork_operations o JOIN fork_snapshots s"
        " USING (op_seq) WHERE o.operation_id = ?",
        (op,),
    ).fetchone()
    assert row is not None
    document = msgpack.unpackb(row[1], raw=False)
    assert document["version"] == 5 and document["turn_fields"][-1] == "final_assistant_position"
    document["turn_fields"] = document["turn_fields"][:-1]
    frozen = msgpack.packb(document, use_bin_type=True)
    conn.execute("UPDATE fork_snapshots SET snapshot_json = ? WHERE op_seq = ?", (frozen, row[0]))
    conn.execute(
        "UPDATE fork_operations SET snapshot_hash = ? WHERE operation_id = ?",
        (hashlib.sha256(frozen).hexdigest(), op),
    )
    conn.close()
    assert Law.CHILD_IFF_COMMITTED in laws(home)


def test_a_linked_row_changed_behind_the_guard_is_reported(base: Base, tmp_path: Path) -> None:
    """The source's rows a child reads are frozen by the store's triggers; changed with the
    guard dropped, the history the child shows is not what its operation froze."""
    home = tampered(
        base,
        tmp_path,
        "DROP TRIGGER messages_linked_frozen;"
        "UPDATE messages SET text = text || ' (tampered)' WHERE session_id IN"
        " (SELECT source_session_id FROM fork_operations WHERE status = 'committed')",
    )
    found = laws(home)
    assert Law.HISTORY_LINK_INTACT in found
    assert Law.CHILD_HISTORY_COPIED not in found  # the source changed too: not decidable


def test_a_link_to_a_session_with_fewer_rows_is_reported(base: Base, tmp_path: Path) -> None:
    home = tampered(
        base,
        tmp_path,
        "UPDATE history_links SET through_position = through_position - 1",
    )
    assert Law.HISTORY_LINK_INTACT in laws(home)


def test_an_active_operation_without_its_witness_is_reported(base: Base, tmp_path: Path) -> None:
    """The `unknown` operation made active again (its witness went with `unknown`): an active
    operation prepared with the fence's witness, and no witness row counting for it."""
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET status = 'provider_accepted' WHERE status = 'unknown'",
    )
    assert Law.FENCE_WITNESS in laws(home)


def test_a_boundary_changed_behind_a_silent_witness_is_reported(base: Base, tmp_path: Path) -> None:
    """The witness's trigger dropped, the active operation's boundary changed: its witness
    counted nothing, so a commit would link a boundary prepare never digested."""
    accepted = "(SELECT {} FROM fork_operations WHERE status = 'provider_accepted')"
    home = tampered(
        base,
        tmp_path,
        "UPDATE fork_operations SET status = 'provider_accepted' WHERE status = 'unknown';"
        "INSERT INTO history_fences (session_key, op_seq, changes)"
        " SELECT k.session_key, o.op_seq, 0 FROM fork_operations o JOIN session_keys k"
        " ON k.workspace_id = o.workspace_id AND k.session_id = o.source_session_id"
        " WHERE o.status = 'provider_accepted';"
        "DROP TRIGGER messages_fenced_update;"
        # The second Turn's Messages: the committed child links only the first Turn's.
        "UPDATE messages SET text = text || ' (tampered)' WHERE session_id = "
        + accepted.format("source_session_id")
        + " AND turn_id = "
        + accepted.format("source_turn_id"),
    )
    report = check_invariants(home)
    found = {v.law for v in report.violations}
    assert Law.FENCE_WITNESS in found, report.violations
    assert any("counted no change" in v.detail for v in report.violations), report.violations


def test_a_witness_left_after_its_operation_ended_is_reported(base: Base, tmp_path: Path) -> None:
    """The release trigger dropped: a witness row still counting for the committed operation,
    whose fence is long released (a later prepare would find the source witnessed twice)."""
    op = base.committed["operationId"]
    home = tampered(
        base,
        tmp_path,
        "INSERT INTO history_fences (session_key, op_seq, changes)"
        " SELECT k.session_key, o.op_seq, 0 FROM fork_operations o JOIN session_keys k"
        " ON k.workspace_id = o.workspace_id AND k.session_id = o.source_session_id"
        f" WHERE o.operation_id = '{op}'",
    )
    report = check_invariants(home)
    assert [v.law for v in report.violations] == [Law.FENCE_WITNESS], report.violations
    assert "no active operation" in report.violations[0].detail


def test_a_repository_changed_beyond_a_forks_worktree_and_branch_is_reported(
    base: Base, tmp_path: Path
) -> None:
    """Law 10: what a worktree fork adds (an `agenthost/` branch) and what a Turn writes (the
    working tree) are allowed; a moved HEAD, a new ref, a changed config or index are not."""
    repo = make_repo(tmp_path / "project")
    before = repository_state(repo)

    def kept() -> list[str]:
        report = check_invariants(base.home, repositories={repo: before})
        return [v.detail for v in report.violations if v.law is Law.REPOSITORY_KEPT]

    git(repo, "branch", "agenthost/a-fork-1234abcd")
    (repo / "a.txt").write_text("a Turn wrote this\n")
    (repo / "new.txt").write_text("and this\n")
    assert kept() == []
    git(repo, "config", "user.name", "someone")
    assert [d.split(":")[1].strip() for d in kept()] == ["its config changed"]
    git(repo, "add", "new.txt")
    assert any("its index changed" in d for d in kept())
    git(repo, "commit", "-q", "-m", "behind the person's back")
    found = kept()
    assert any("its head_commit changed" in d for d in found), found
    assert any("its refs changed" in d for d in found), found


def test_fork_events_lost_stale_or_without_the_child_are_reported(base: Base) -> None:
    """The fork-event law over a subscriber's record: the committed fork of the base, heard
    whole; then its last event dropped, its events reordered, its child's announcement
    dropped, its last event not the committed row — each is named."""
    end = base.committed
    op_id, child = end["operationId"], end["targetAgentSessionId"]
    frozen = end | {"status": "accepted", "phase": "frozen"}
    dispatching = end | {"status": "accepted", "phase": "dispatching"}
    whole = [
        {"type": "fork.operation", "operation": frozen},
        {"type": "fork.operation", "operation": dispatching},
        {"type": "fork.operation", "operation": end},
        {"type": "session.upserted", "session": {"agentSessionId": child}},
    ]
    assert check_fork_events(whole, {op_id: end}) == []
    lost = check_fork_events(whole[:2] + whole[3:], {op_id: end})
    assert [v.law for v in lost] == [Law.FORK_EVENTS_HEARD] and "last heard" in lost[0].detail
    stale = check_fork_events([whole[0], whole[2], whole[1], whole[3]], {op_id: end})
    assert [v.law for v in stale] == [Law.FORK_EVENTS_HEARD] * 2, stale
    assert "out of order" in stale[0].detail
    unannounced = check_fork_events(whole[:3], {op_id: end})
    assert [v.detail for v in unannounced] == [f"{op_id}: its child {child} was never announced"]
    never = check_fork_events(whole[3:], {op_id: end})
    assert [v.detail for v in never] == [f"{op_id} (committed): never heard"]
    # The last event at the end's status but not the committed row (a carried row published
    # stale or built wrong): its child, phase or error not the end's.
    wrong = dict(end) | {"targetAgentSessionId": "another", "error": {"reason": "x"}}
    built_wrong = check_fork_events(
        [*whole[:2], {"type": "fork.operation", "operation": wrong}, whole[3]], {op_id: end}
    )
    assert [v.detail for v in built_wrong] == [
        f"{op_id}: last heard differs from the end in error, targetAgentSessionId"
    ], built_wrong


def test_a_fork_heard_at_two_ends_is_reported(base: Base) -> None:
    """An operation none resolved reaches one end: an event of another end heard before its
    own (a `failed` published for a fork that committed) is named, though every end ranks
    alike and the last one heard is the end, field for field."""
    end = base.committed
    op_id, child = end["operationId"], end["targetAgentSessionId"]

    def heard(*ops: dict[str, Any]) -> list[dict[str, Any]]:
        announced = {"type": "session.upserted", "session": {"agentSessionId": child}}
        return [*({"type": "fork.operation", "operation": op} for op in ops), announced]

    frozen = end | {"status": "accepted", "phase": "frozen"}
    failed = end | {"status": "failed", "phase": "failed"}
    assert check_fork_events(heard(frozen, end, end), {op_id: end}) == []
    two = check_fork_events(heard(frozen, failed, end), {op_id: end})
    assert [v.detail for v in two] == [f"{op_id}: heard two ends: failed → committed"], two


def test_a_streamed_reply_heard_without_any_delta_is_reported() -> None:
    """A Turn whose reply streamed (`streaming`) heard with every delta of it lost passes
    no longer as "a reply that was not streamed"; one delta lost was already named, and a
    Turn not named as streaming may reply without deltas."""
    reply = "echo: a streamed reply"
    active = {"type": "turn.updated", "turn": {"turnId": "t", "phase": "active"}}
    settled = {
        "type": "turn.updated",
        "turn": {
            "turnId": "t",
            "phase": "settled",
            "messages": [{"kind": "user", "text": "hi"}, {"kind": "assistant", "text": reply}],
        },
    }
    deltas = [
        {"type": "message.delta", "turnId": "t", "kind": "assistant", "delta": reply[at : at + 4]}
        for at in range(0, len(reply), 4)
    ]
    assert check_turn_events([active, *deltas, settled], ["t"], streaming={"t"}) == []
    one_lost = check_turn_events([active, *deltas[1:], settled], ["t"], streaming={"t"})
    assert [v.law for v in one_lost] == [Law.TURN_EVENTS_HEARD], one_lost
    all_lost = check_turn_events([active, settled], ["t"], streaming={"t"})
    assert [v.detail for v in all_lost] == [
        f"t: its reply {reply!r} was streamed, no delta of it heard"
    ], all_lost
    assert check_turn_events([active, settled], ["t"]) == []  # not said to stream


def test_session_events_law_names_a_stale_or_lost_state() -> None:
    """What a subscriber heard of two writers renaming one Session (`<writer>:<n>`): in each
    writer's order with the end's title last passes; an older title of a writer heard after a
    newer one (a carried row published stale), or a last title not the end's, is named."""

    def upsert(title: str) -> dict[str, Any]:
        return {"type": "session.upserted", "session": {"agentSessionId": "s", "title": title}}

    end = {"agentSessionId": "s", "title": "w1:2"}
    whole = [upsert("w0:0"), upsert("w1:0"), upsert("w0:1"), upsert("w1:1"), upsert("w1:2")]
    assert check_session_events(whole, {"s": end}) == []
    stale = check_session_events([*whole[:3], upsert("w0:0"), *whole[3:]], {"s": end})
    assert [v.law for v in stale] == [Law.SESSION_EVENTS_HEARD]
    assert "heard w0:0 after w0:1" in stale[0].detail
    lost = check_session_events(whole[:4], {"s": end})
    assert [v.detail for v in lost] == ["s: last heard title 'w1:1', ended 'w1:2'"]
    assert [v.detail for v in check_session_events([], {"s": end})] == ["s: never heard"]


def test_a_store_missing_a_schema_trigger_or_index_is_reported(base: Base, tmp_path: Path) -> None:
    """A store whose witness trigger, frozen-row trigger or barrier index went (a migration that
    lost one, a hand edit): nothing else would show it until a fork relied on it."""
    assert Law.STORE_SCHEMA not in laws(base.home)
    home = tampered(
        base,
        tmp_path,
        "DROP TRIGGER messages_fenced_update; DROP TRIGGER messages_linked_frozen;"
        " DROP INDEX fork_operations_barrier_held;"
        " CREATE INDEX not_in_the_schema ON messages (kind)",
    )
    found = [v.detail for v in check_invariants(home).violations if v.law is Law.STORE_SCHEMA]
    assert len(found) == 4, found
    assert any("trigger messages_fenced_update" in d for d in found), found
    assert any("index not_in_the_schema is no part" in d for d in found), found


def test_a_store_whose_table_lost_a_check_is_reported(base: Base, tmp_path: Path) -> None:
    """A store whose `fork_operations` lost the CHECK that holds `stage` to the status and whose
    `turns` lost the one that keeps a `host_only` Turn without a provider turn id (what an edit
    of a table's SQL that matched nothing leaves: SQLite cannot ALTER a CHECK, so the
    migrations edit the text): every row still obeys them, so only the tables' SQL shows it,
    until a writer's mistake that the CHECK would have refused lands."""
    from storage.schema import STAGE_COLUMN

    assert Law.STORE_SCHEMA not in laws(base.home)
    host_only_check = " CHECK (host_only = 0 OR (host_only = 1 AND root_provider_turn_id IS NULL))"
    home = tmp_path / "home"
    shutil.copytree(base.home, home, symlinks=True, ignore=shutil.ignore_patterns("run"))
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute("PRAGMA writable_schema = ON")
        for table, old, new in (
            ("fork_operations", STAGE_COLUMN[1], STAGE_COLUMN[0]),
            ("turns", host_only_check, ""),
        ):
            conn.execute(
                "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?",
                (old, new, table),
            )
            assert conn.changes() == 1
        conn.execute(f"PRAGMA schema_version = {version + 1}")
        conn.execute("PRAGMA writable_schema = OFF")
    finally:
        conn.close()
    found = [v.detail for v in check_invariants(home).violations if v.law is Law.STORE_SCHEMA]
    assert len(found) == 2, found
    assert any("table fork_operations" in d for d in found), found
    assert any("table turns" in d for d in found), found


def test_an_operation_without_its_snapshot_is_reported(base: Base, tmp_path: Path) -> None:
    """The `unknown` fork's snapshot gone: an adopt would commit it and fail closed."""
    assert Law.SNAPSHOT_KEPT not in laws(base.home)
    home = tampered(
        base,
        tmp_path,
        "DELETE FROM fork_snapshots WHERE op_seq = (SELECT op_seq FROM fork_operations"
        f" WHERE operation_id = '{base.unknown['operationId']}')",
    )
    report = check_invariants(home)
    assert [v.law for v in report.violations] == [Law.SNAPSHOT_KEPT], report.violations
    assert "has no snapshot" in report.violations[0].detail


def test_a_failed_fork_that_keeps_its_snapshot_is_reported(tmp_path: Path) -> None:
    """A fork the provider refused (`failed`) whose snapshot is still there: what every such
    fork left before schema v27, a whole boundary's document kept for good."""
    from storage.models import ForkPrepareRequest
    from storage.store import Store
    from tests.storage.store_builders import new_session, settled_turn

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    store = Store.open(home / "store.sqlite3")
    try:
        sid = new_session(store, ws=WS)
        last = settled_turn(store, sid, ws=WS, provider_turn_id="p1").turn_id
        op = store.fork_prepare.prepare_fork(
            WS,
            ForkPrepareRequest(
                source_session_id=sid,
                request_id=str(uuid.uuid4()),
                target_session_id=str(uuid.uuid4()),
                turn_id=last,
                driver_kind="tutti-agent",
                driver_version="0.0.10",
                binding_mode="host_copy",
            ),
        )[0]
        conn = store.db.connection()
        (frozen,) = conn.execute("SELECT snapshot_json FROM fork_snapshots").fetchone()
        store.fork_transitions.mark_fork_dispatching(WS, op.operation_id)
        store.fork_transitions.mark_fork_failed(WS, op.operation_id, "refused")
    finally:
        store.close()
    assert not [v for v in check_invariants(home).violations if v.law in STORE_LAWS]
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        conn.execute(
            "INSERT INTO fork_snapshots (op_seq, snapshot_json)"
            " SELECT op_seq, ? FROM fork_operations WHERE operation_id = ?",
            (frozen, op.operation_id),
        )
    finally:
        conn.close()
    found = [v for v in check_invariants(home).violations if v.law in STORE_LAWS]
    assert [v.law for v in found] == [Law.SNAPSHOT_KEPT], found
    assert "(failed) still keeps its snapshot" in found[0].detail


def test_a_kept_digest_that_is_not_the_rows_is_reported(base: Base, tmp_path: Path) -> None:
    """The forks' prepares kept their boundary digests (schema v17); a kept row that is no longer
    the rows' pass would let the next prepare freeze a boundary it never digested."""
    conn = apsw.Connection(str(base.home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        kept = conn.execute("SELECT count(*) FROM history_digests").fetchone()[0]
    finally:
        conn.close()
    assert kept >= 1
    home = tampered(base, tmp_path, "UPDATE history_digests SET count = count + 1")
    report = check_invariants(home)
    assert len(report.violations) == kept, report.violations  # one for each row
    assert {v.law for v in report.violations} == {Law.HISTORY_DIGEST_KEPT}, report.violations


def _sleeper(env_home: Path | None, *argv: str) -> subprocess.Popen[bytes]:
    """A real process that sleeps; its environment names `env_home` (when given), its command
    line carries `argv` (what a worker's would, for the count)."""
    import os
    import sys

    env = dict(os.environ)
    if env_home is not None:
        env["AGENTHOST_HOME"] = str(env_home)
    return _laid_out(
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)", *argv],
            env=env,
            stdin=subprocess.DEVNULL,
        )
    )


def _laid_out(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """`proc` once its environment can be read: Popen returns at exec's point of no return,
    an instant before the kernel lays the new environment out (read before it, it is empty,
    and the check would see no home: a clean-clone CI run met that)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/environ", "rb") as fh:
            if fh.read():
                return proc
        time.sleep(0.01)
    raise AssertionError(f"process {proc.pid} laid out no environment in 10 s")


def test_processes_of_a_home_outside_its_daemon_are_orphans(tmp_path: Path) -> None:
    from tests.support.invariants import check_processes

    home = tmp_path / "home"
    stray = _sleeper(home)  # names the home, is no child of any daemon of it
    other = _sleeper(tmp_path / "elsewhere")  # another home's: not this one's business
    try:
        found = check_processes(home, None, grace_s=0)
        assert [v.law for v in found] == [Law.PROCESS_OWNED], found
        assert str(stray.pid) in found[0].detail
        # Under a live "daemon" (here: this test's process tree is excluded, so use the
        # stray itself as the daemon): its own process is no orphan.
        assert check_processes(home, stray.pid, grace_s=0) == []
    finally:
        for proc in (stray, other):
            proc.kill()
            proc.wait(10)
    assert check_processes(home, None, grace_s=0) == []


def test_a_git_a_killed_daemon_left_is_an_orphan_to_the_next_daemon(tmp_path: Path) -> None:
    """A git of a daemon's shadow store names the home only by its HOME (the store's root,
    not `AGENTHOST_HOME`), in a session of its own: left by a killed daemon, it runs outside
    the next daemon's tree, and the check names it."""
    import os

    from tests.support.invariants import check_processes

    home = tmp_path / "home"
    daemon = _sleeper(None)  # the live daemon: the git below is no child of it
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home / "checkpoints")}
    git = _laid_out(subprocess.Popen(["sleep", "120"], env=env, start_new_session=True))
    try:
        found = check_processes(home, daemon.pid, grace_s=0)
        assert [v.law for v in found] == [Law.PROCESS_OWNED], found
        assert f"process {git.pid} " in found[0].detail
    finally:
        os.killpg(git.pid, 9)
        git.wait(10)
    assert check_processes(home, daemon.pid, grace_s=0) == []
    daemon.kill()
    daemon.wait(10)


def test_two_workers_of_one_provider_under_a_daemon_are_reported(tmp_path: Path) -> None:
    import sys

    from tests.support.invariants import check_processes

    home = tmp_path / "home"
    # A "daemon" that starts two workers of one provider and one of another.
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "argv = lambda p: [sys.executable, '-c', 'import time; time.sleep(120)',"
            " '-m', 'drivers.worker', '--provider', p]\n"
            "kids = [subprocess.Popen(argv(p)) for p in ('tutti-agent', 'tutti-agent', 'codex')]\n"
            "print('up', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert daemon.stdout is not None and daemon.stdout.readline().strip() == b"up"
        found = check_processes(home, daemon.pid, grace_s=0)
        want = f"2 live workers of tutti-agent under daemon {daemon.pid}"
        assert [v.detail for v in found] == [want]
    finally:
        import psutil

        for kid in psutil.Process(daemon.pid).children(recursive=True):
            kid.kill()
        daemon.kill()
        daemon.wait(10)


_RUNTIME_TREE = """
import os, subprocess, sys, time
home, mode = sys.argv[1], sys.argv[2]
sleep = [sys.executable, '-c', 'import time; time.sleep(120)']
if mode == 'daemon':  # the daemon: one worker of codex
    kid = subprocess.Popen([sys.executable, sys.argv[0], home, 'worker',
                            '-m', 'drivers.worker', '--provider', 'codex'])
elif mode == 'worker':  # two runtimes' app-servers, each its own group, one with a child
    def env(s):
        h = os.path.join(home, 'runtimes', 'ws', s, 'codex-home', '.home')
        return dict(os.environ, HOME=h, CODEX_HOME=os.path.dirname(h))
    a = subprocess.Popen([sys.executable, sys.argv[0], home, 'server'],
                         env=env('s1'), process_group=0)
    b = subprocess.Popen(sleep, env=env('s2'), process_group=0)
    # A process of s2's runtime the worker started outside its app-server's group.
    c = subprocess.Popen(sleep, env=env('s2'))
    print('pids', a.pid, b.pid, c.pid, flush=True)
else:  # an app-server with a child of its own (a launcher's native program)
    kid = subprocess.Popen(sleep)
    print('native', kid.pid, flush=True)
time.sleep(120)
"""


def test_a_runtime_process_without_its_app_server_is_reported(tmp_path: Path) -> None:
    """A worker's app-servers are at most the daemon's live runtimes of its provider, and each
    process of a runtime's private HOME is its app-server or in its tree or group: a server
    whose runtime is closed, a process of a runtime outside its server's group, a launcher's
    child left once the launcher was killed are each named. The process check says nothing
    of the first two (all run under the daemon)."""
    import os
    import signal
    import sys

    import psutil

    from tests.support.invariants import check_processes, check_runtime_processes

    home = tmp_path / "home"
    script = tmp_path / "tree.py"
    script.write_text(_RUNTIME_TREE)
    env = dict(os.environ, AGENTHOST_HOME=str(home))
    daemon = subprocess.Popen(
        [sys.executable, str(script), str(home), "daemon"], env=env, stdout=subprocess.PIPE
    )
    try:
        assert daemon.stdout is not None
        first = daemon.stdout.readline().split()
        second = daemon.stdout.readline().split()
        lines = {bytes(w[0]): [int(x) for x in w[1:]] for w in (first, second)}
        (server, stray_server, stray), (native,) = lines[b"pids"], lines[b"native"]
        for pid in (server, stray_server, stray, native):
            _laid_out_pid(pid)
        assert check_processes(home, daemon.pid, grace_s=0) == []  # all under the daemon

        def found(live: int) -> list[str]:
            got = check_runtime_processes(home, daemon.pid, lambda: {"codex": live}, grace_s=0)
            assert {v.law for v in got} <= {Law.RUNTIME_PROCESSES_ENDED}, got
            return sorted(v.detail for v in got)

        s2 = str(home / "runtimes" / "ws" / "s2" / "codex-home" / ".home")
        stray_s2 = f"process {stray} of the runtime home {s2} lives without its app-server"
        assert found(2) == [stray_s2]
        # One runtime closed (the daemon holds one live): its server lives on.
        assert found(1) == [stray_s2, "processes of 2 codex runtimes live, the daemon holds 1 live"]
        os.kill(stray, signal.SIGKILL)
        _dead(stray)
        assert found(2) == []
        # The launcher killed alone: its native child lives on, out of every server's tree.
        os.kill(server, signal.SIGKILL)
        _dead(server)
        s1 = str(home / "runtimes" / "ws" / "s1" / "codex-home" / ".home")
        orphan = f"process {native} of the runtime home {s1} lives without its app-server"
        assert found(2) == [orphan]
        # ... and its runtime closed: processes of two runtimes, one live.
        assert found(1) == [orphan, "processes of 2 codex runtimes live, the daemon holds 1 live"]
    finally:
        for kid in psutil.Process(daemon.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                kid.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(native, signal.SIGKILL)
        daemon.kill()
        daemon.wait(10)


def test_a_live_daemon_s_runtime_is_its_app_server_and_ends_with_its_session(
    tmp_path: Path,
) -> None:
    """On a real daemon the check sees a Session's app-server (told the daemon holds no live
    runtime, it names it) and finds it clean with what `host.status` says; once the Session
    is deleted, its runtime is closed and nothing of it is left."""
    from tests.support.invariants import (
        check_daemon_runtimes,
        check_runtime_processes,
        live_runtimes,
    )

    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        assert d.proc is not None
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "one")

        def live() -> dict[str, int]:
            return live_runtimes(c.call("host.status"))

        assert live() == {"tutti-agent": 1}
        assert check_runtime_processes(home, d.proc.pid, live) == []
        none = check_runtime_processes(home, d.proc.pid, dict, grace_s=0)
        assert [v.detail for v in none] == [
            "processes of 1 tutti-agent runtimes live, the daemon holds 0 live"
        ]
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
        assert check_runtime_processes(home, d.proc.pid, live) == []
        assert check_runtime_processes(home, d.proc.pid, dict, grace_s=0) == []
        # A daemon killed meanwhile answers no `host.status`: nothing of it is live.
        from transport.client import Client

        pid, quick = d.proc.pid, Client(d.api, timeout=2)
        d.kill()
        try:
            assert check_daemon_runtimes(home, pid, quick) == []
        finally:
            quick.close()
    finally:
        d.stop()


_DETACHED_TREE = """
import os, subprocess, sys, time
home, mode = sys.argv[1], sys.argv[2]
h = os.path.join(home, 'runtimes', 'ws', 's1', 'codex-home', '.home')
env = dict(os.environ, HOME=h, CODEX_HOME=os.path.dirname(h), AGENTHOST_RUNTIME='live-one')
me = [sys.executable, sys.argv[0], home]
if mode == 'daemon':  # the daemon: one worker of codex (its environment a worker's)
    worker_env = dict(os.environ, AGENTHOST_WORKER_PARENT_PID=str(os.getpid()))
    subprocess.Popen(me + ['worker', '-m', 'drivers.worker', '--provider', 'codex'], env=worker_env)
elif mode == 'worker':  # its runtime's app-server, marked, leading its own group
    subprocess.Popen(me + ['server'], env=env, process_group=0)
elif mode == 'server':  # a tool of it detaches three processes and exits
    out = subprocess.run(me + ['tool'], env=env, stdout=subprocess.PIPE, check=True).stdout
    print('pids', os.getpid(), out.decode().strip(), flush=True)
else:  # the runtime's marker, none, a stopped runtime's; each in a session of its own
    unmarked = {k: v for k, v in env.items() if k != 'AGENTHOST_RUNTIME'}
    envs = [env, unmarked, dict(env, AGENTHOST_RUNTIME='stopped-one')]
    sleep = ['sleep', '120']
    kids = [subprocess.Popen(sleep, env=e, start_new_session=True, stdout=subprocess.DEVNULL)
            for e in envs]
    print(*(k.pid for k in kids), flush=True)
    sys.exit(0)
time.sleep(120)
"""


def test_a_live_runtimes_detached_tool_process_is_owned_one_unmarked_or_stopped_is_not(
    tmp_path: Path,
) -> None:
    """A process a live runtime's tool detached (`setsid … &`: out of its app-server's tree
    and group, reparented out of the daemon's tree) that carries that runtime's marker is
    neither an orphan (`process_owned`) nor a runtime process without its app-server
    (`runtime_processes_ended`): its runtime's stop ends it. The same process with no marker,
    or a stopped runtime's, is named by both; and so is the first once its runtime's
    app-server is gone."""
    import psutil

    from tests.support.invariants import check_processes, check_runtime_processes

    home = tmp_path / "home"
    script = tmp_path / "tree.py"
    script.write_text(_DETACHED_TREE)
    env = dict(os.environ, AGENTHOST_HOME=str(home))
    daemon = subprocess.Popen(
        [sys.executable, str(script), str(home), "daemon"], env=env, stdout=subprocess.PIPE
    )
    left: list[int] = []
    try:
        assert daemon.stdout is not None
        words = daemon.stdout.readline().split()
        assert words[:1] == [b"pids"], words
        server, *left = (int(w) for w in words[1:])
        live, unmarked, stopped = left
        for pid in (server, *left):
            _laid_out_pid(pid)
        s1 = str(home / "runtimes" / "ws" / "s1" / "codex-home" / ".home")

        def named() -> tuple[list[int], list[int]]:
            owned = check_processes(home, daemon.pid, grace_s=0)
            assert {v.law for v in owned} <= {Law.PROCESS_OWNED}, owned
            ended = check_runtime_processes(home, daemon.pid, lambda: {"codex": 1}, grace_s=0)
            assert {v.law for v in ended} <= {Law.RUNTIME_PROCESSES_ENDED}, ended
            without = f" of the runtime home {s1} lives without its app-server"
            assert all(v.detail.endswith(without) for v in ended), ended
            return (
                sorted(p for p in left for v in owned if f"process {p} " in v.detail),
                sorted(p for p in left for v in ended if f"process {p} " in v.detail),
            )

        others = sorted([unmarked, stopped])
        assert named() == (others, others)
        # The runtime stopped (its app-server gone): what its tool left is no longer its.
        os.kill(server, signal.SIGKILL)
        _dead(server)
        assert named() == (sorted(left), sorted(left))
    finally:
        for kid in psutil.Process(daemon.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                kid.kill()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        daemon.kill()
        daemon.wait(10)


def _dead(pid: int) -> None:
    """Wait until `pid` (no child of this process: its parent never reaps it) is a zombie."""
    import psutil

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still runs 10 s after its SIGKILL")


def _laid_out_pid(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as fh:
            if fh.read():
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} laid out no environment in 10 s")


def test_session_events_law_names_a_touch_built_on_the_wrong_row() -> None:
    """A Turn's claim and settlement carry only their touch, built on the row the events thread
    holds: a last `session.upserted` whose active Turn, time or title is not the end's (a touch
    applied to a row it did not change) is named."""

    def upsert(**fields: Any) -> dict[str, Any]:
        return {"type": "session.upserted", "session": {"agentSessionId": "s", **fields}}

    end = {"agentSessionId": "s", "title": "new", "activeTurnId": None, "updatedAtUnixMs": 7}
    whole = [
        upsert(title="new", activeTurnId=None, updatedAtUnixMs=5),
        upsert(title="new", activeTurnId="t", updatedAtUnixMs=6),
        upsert(title="new", activeTurnId=None, updatedAtUnixMs=7),
    ]
    assert check_session_events(whole, {"s": end}) == []
    still = [*whole[:2], upsert(title="new", activeTurnId="t", updatedAtUnixMs=7)]
    assert [v.detail for v in check_session_events(still, {"s": end})] == [
        "s: last heard activeTurnId 't', ended None"
    ]
    renamed_lost = [*whole[:2], upsert(title="old", activeTurnId=None, updatedAtUnixMs=7)]
    assert [v.detail for v in check_session_events(renamed_lost, {"s": end})] == [
        "s: last heard title 'old', ended 'new'"
    ]
    late = [*whole[:2], upsert(title="new", activeTurnId=None, updatedAtUnixMs=6)]
    assert [v.detail for v in check_session_events(late, {"s": end})] == [
        "s: last heard updatedAtUnixMs 6, ended 7"
    ]


def test_a_file_in_a_claude_spare_home_is_reported(base: Base, tmp_path: Path) -> None:
    """A spare home made ahead holds its empty directories only: no transcript ever moves into
    one (it is renamed into the child's place first)."""
    home = tampered(base, tmp_path)
    projects = home / "runtimes" / WS / ".claude-spare-t-1" / "claude-config" / "projects" / "p"
    projects.mkdir(parents=True)
    assert Law.SPARE_HOME_EMPTY not in laws(home)  # an empty spare is lawful
    (projects / f"{uuid.uuid4()}.jsonl").write_text("{}\n")
    assert Law.SPARE_HOME_EMPTY in laws(home)


_HOLDER = """
import os, resource, socket, sys
run, soft = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
for name in ("api.sock", "w-codex-1.sock"):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(run, name))
    listener.listen()
    held.append(listener)
print("listening", flush=True)
for listener, top in zip(held, (soft - 1, soft - 2)):
    conn, _ = listener.accept()
    os.dup2(conn.fileno(), top)  # the connection at the top of the table
    conn.close()
print("accepted", flush=True)
sys.stdin.readline()
os.close(soft - 1)  # the ipc endpoint's connection leaves the reserve; the link stays
print("moved", flush=True)
sys.stdin.readline()
"""


def test_a_connection_in_the_descriptor_reserve_is_reported(tmp_path: Path) -> None:
    import socket
    import sys

    from tests.support.invariants import check_descriptor_reserve

    run = tmp_path / "run"
    run.mkdir()
    soft = 256
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(run), str(soft)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    clients: list[socket.socket] = []
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "listening"
        assert check_descriptor_reserve(holder.pid, run, 128, again_s=0) == []
        for name in ("api.sock", "w-codex-1.sock"):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(run / name))
            clients.append(c)
        assert holder.stdout.readline().strip() == "accepted"
        found = check_descriptor_reserve(holder.pid, run, 128)
        assert [v.law for v in found] == [Law.DESCRIPTOR_RESERVE], found
        assert f"descriptor {soft - 1} " in found[0].detail
        assert str(run / "api.sock") in found[0].detail
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "moved"
        # The worker link alone in the reserve is no violation: the reserve is theirs.
        assert check_descriptor_reserve(holder.pid, run, 128) == []
    finally:
        for c in clients:
            c.close()
        holder.kill()
        holder.wait(10)


def test_a_status_queue_past_its_capacity_is_reported(tmp_path: Path) -> None:
    """`status_bounds` over a real daemon's `host.status` (a Turn run: its runtime slots
    reported): none as answered; tampered — the log queue one line past its capacity, a
    provider's live runtimes one past its limit, its starting ones one past theirs — each
    reported."""
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client(timeout=30)
        run_turn(c, create_session(c)["agentSessionId"], "hello")
        status = c.call("host.status")
    finally:
        d.stop()
    assert status["log"] is not None and status["runtimes"]["tutti-agent"]["live"] == 1, status
    assert check_status_bounds(status) == []
    log = dict(status["log"], queued=status["log"]["capacity"] + 1)
    slots = dict(status["runtimes"]["tutti-agent"])
    slots["live"] = slots["limit"] + 1
    slots["starting"] = slots["startLimit"] + 1
    tampered = dict(status, log=log, runtimes={"tutti-agent": slots})
    found = check_status_bounds(tampered)
    assert [v.law for v in found] == [Law.STATUS_BOUNDS] * 3, found
    assert "log queue" in found[0].detail and "live" in found[1].detail, found
    assert "starting" in found[2].detail, found
    # A part missing is reported, never skipped (a renamed key would turn the check off): no
    # `log`, a null one, no `runtimes`, a provider's slots without a bound.
    clean = status["runtimes"]["tutti-agent"]
    no_bound = {k: v for k, v in clean.items() if k != "startLimit"}
    for part in (
        {k: v for k, v in status.items() if k != "log"},
        dict(status, log=None),
        {k: v for k, v in status.items() if k != "runtimes"},
        dict(status, runtimes={"tutti-agent": no_bound}),
    ):
        found = check_status_bounds(part)
        assert [v.law for v in found] == [Law.STATUS_BOUNDS], (part, found)


class Asked:
    """A stopped daemon's home with a resolved Interaction (an approval answered 200, then
    answered again: 409) and a superseded one (a question left to an interrupt, the Turn
    interrupted again once settled), with what the client was answered and the Turns at the
    end."""

    def __init__(
        self,
        home: Path,
        answers: list[Answered],
        interrupts: list[Answered],
        turns: dict[str, dict[str, Any]],
    ) -> None:
        self.home = home
        self.answers = answers
        self.interrupts = interrupts
        self.turns = turns


def _control(
    c: Any, method: str, sid: str, turn_id: str, extra: dict[str, Any], seen: Any = None
) -> Answered:
    params = {"workspaceId": WS, "agentSessionId": sid, "turnId": turn_id} | extra
    status, body = c.call_raw(method, params)
    return Answered(
        sid,
        turn_id,
        str(extra.get("requestId", "")),
        dict(extra.get("response", {})),
        status,
        body,
        seen,
    )


@pytest.fixture(scope="module")
def asked(tmp_path_factory: pytest.TempPathFactory) -> Asked:
    home = tmp_path_factory.mktemp("asked") / "home"
    d = DaemonProcess(home).start()
    answers: list[Answered] = []
    interrupts: list[Answered] = []
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        approve = submit(c, sid, "/approve ls")["turnId"]
        req = wait_for(lambda: turn_of(c, sid, approve)["interactions"])[0]["requestId"]
        for decision in ("approve", "decline"):
            answers.append(
                _control(
                    c,
                    "interaction.respond",
                    sid,
                    approve,
                    {"requestId": req, "response": {"decision": decision}},
                )
            )
        settle(c, sid, approve)
        ask = submit(c, sid, "/ask what colour?")["turnId"]
        wait_for(lambda: turn_of(c, sid, ask)["interactions"])
        interrupts.append(_control(c, "turn.interrupt", sid, ask, {}))
        seen = settle(c, sid, ask)
        interrupts.append(_control(c, "turn.interrupt", sid, ask, {}, seen))
        turns = {t["turnId"]: t for t in [turn_of(c, sid, approve), turn_of(c, sid, ask)]}
    finally:
        d.stop()
    return Asked(home, answers, interrupts, turns)


def _asked_tampered(asked: Asked, tmp_path: Path, sql: str) -> Path:
    home = tmp_path / "home"
    shutil.copytree(asked.home, home, symlinks=True, ignore=shutil.ignore_patterns("run"))
    conn = apsw.Connection(str(home / "store.sqlite3"))
    conn.execute(sql)
    conn.close()
    return home


def test_a_home_with_answered_and_interrupted_interactions_is_clean(asked: Asked) -> None:
    assert [a.status for a in asked.answers] == [200, 409]
    statuses = [i["status"] for t in asked.turns.values() for i in t["interactions"]]
    assert sorted(statuses) == ["resolved", "superseded"]
    assert [a.status for a in asked.interrupts] == [200, 200]
    report = check_invariants(asked.home)
    assert report.ok, report.violations
    assert check_interaction_answers(asked.answers, asked.turns) == []
    assert check_interrupts(asked.interrupts, asked.turns) == []


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE interactions SET status = 'pending', resolved_at_ms = NULL"
        " WHERE status = 'superseded'",
        "UPDATE interactions SET output_json = NULL WHERE status = 'resolved'",
        "UPDATE interactions SET resolved_at_ms = created_at_ms - 1 WHERE status = 'resolved'",
    ],
    ids=["pending_on_settled_turn", "resolved_without_answer", "resolved_before_opened"],
)
def test_an_interaction_record_its_turn_cannot_leave_is_reported(
    asked: Asked, tmp_path: Path, sql: str
) -> None:
    assert Law.INTERACTION_STATE in laws(_asked_tampered(asked, tmp_path, sql))


def test_an_interaction_answered_twice_or_recorded_otherwise_is_reported(asked: Asked) -> None:
    first, second = asked.answers
    twice = [first, Answered(**{**_fields(second), "status": 200})]
    other = [Answered(**{**_fields(first), "response": {"decision": "decline"}}), second]
    for answers in (twice, other):
        found = check_interaction_answers(answers, asked.turns)
        assert [v.law for v in found][:1] == [Law.INTERACTION_ANSWERED], found
    assert check_interaction_answers(asked.answers, asked.turns, took) == []
    declined = check_interaction_answers(
        asked.answers, asked.turns, lambda turn: {"decision": "decline"}
    )
    assert [v.law for v in declined] == [Law.INTERACTION_ANSWERED], declined


def test_an_answer_the_provider_took_recorded_superseded_is_reported(asked: Asked) -> None:
    """The provider took the approval (its Turn completed `approved: ls`) while the request
    was answered 503 and the record was then superseded by the settlement: the answer the
    provider took never landed, though no 200 was given for the law to hold it to."""
    first, second = asked.answers
    lost = [Answered(**{**_fields(first), "status": 503}), second]
    turn = asked.turns[first.turn_id]
    assert took(turn) == {"decision": "approve"}, turn["messages"]
    (record,) = turn["interactions"]
    dropped = {"status": "superseded", "output": None}
    turns = asked.turns | {first.turn_id: turn | {"interactions": [record | dropped]}}
    found = check_interaction_answers(lost, turns, took)
    assert [v.detail for v in found] == [
        f"turn {first.turn_id} interaction {first.request_id}: the provider took"
        " {'decision': 'approve'}, recorded superseded"
    ], found
    # Its reply lost (a kill) and its record landed: clean.
    unanswered = [Answered(**{**_fields(first), "status": None}), second]
    assert check_interaction_answers(unanswered, asked.turns, took) == []


def test_an_interrupted_turn_left_active_or_settled_otherwise_is_reported(asked: Asked) -> None:
    first, again = asked.interrupts
    active = {k: t | {"phase": "active"} for k, t in asked.turns.items()}
    assert [v.law for v in check_interrupts([first], active)] == [Law.INTERRUPT_ANSWERED]
    body = {"turn": again.body["turn"] | {"outcome": "completed"}}
    changed = Answered(**{**_fields(again), "body": body})
    found = check_interrupts([changed], asked.turns)
    assert [v.law for v in found] == [Law.INTERRUPT_ANSWERED] * 2, found
    fenced = {"code": "conflict", "reason": "agent_session_fork_in_progress"}
    refused = Answered(**{**_fields(again), "status": 409, "body": fenced})
    found = check_interrupts([refused], asked.turns)
    assert [v.law for v in found] == [Law.INTERRUPT_ANSWERED], found


def _fields(a: Answered) -> dict[str, Any]:
    return {name: getattr(a, name) for name in Answered.__slots__}


def test_a_provider_fault_left_active_mis_settled_or_unbounded_is_reported(tmp_path: Path) -> None:
    """`provider_fault_settles` over real rounds (a real daemon, its Tutti Agent app-server
    behind the relay: an endless line, garbage, notifications with no object) is clean; each
    observation changed as a broken bound would leave it is reported."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text(relay_table(tmp_path / "arms"))
    chaos = ProviderChaos(tmp_path / "arms", 0)
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        chaos.setup(c)
        for fault in ("endless", "garbage", "notobject"):
            chaos.next_fault = ("endless", "garbage", "close", "close_mid", "notobject").index(
                fault
            )
            assert chaos.round(c, lambda: 0) is not None, chaos.calls
        turns = {
            str(t["turnId"]): t
            for sid in chaos.sids
            for t in c.call(
                "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 100}
            )["turns"]
        }
    finally:
        d.stop()
    endless, garbage, _ = chaos.faults
    assert check_provider_faults(chaos.faults, turns) == [], (chaos.faults, chaos.summary())
    assert endless.relay_pid is not None and endless.rss_growth_kib is not None, endless
    untyped = {endless.turn_id: turns[endless.turn_id] | {"errorReason": None}}
    tampered = [
        ([endless], {endless.turn_id: turns[endless.turn_id] | {"phase": "active"}}),
        ([replace(endless, in_bound=False)], turns),
        ([endless], untyped),
        ([endless], {endless.turn_id: turns[endless.turn_id] | {"outcome": "completed"}}),
        ([replace(endless, relay_alive=True)], turns),
        ([replace(endless, next_pid=endless.relay_pid)], turns),
        ([replace(endless, next_outcome="failed")], turns),
        # Its next Turn refused (not run, not disturbed): no Turn ran after the fault.
        (
            [replace(endless, next_outcome=None, next_pid=None, next_refused="409 busy")],
            turns,
        ),
        ([replace(endless, rss_growth_kib=FAULT_RSS_BOUND_KIB + 1)], turns),
        (
            [garbage],
            {
                garbage.turn_id: turns[garbage.turn_id]
                | {"outcome": "failed", "errorReason": "provider_protocol_error"}
            },
        ),
    ]
    for faults, seen in tampered:
        found = check_provider_faults(faults, seen)
        assert [v.law for v in found] == [Law.PROVIDER_FAULT_SETTLES], (faults, found)


# The reads' laws: `list_pages`, `timeline_pages`, `lineage_answer`, over real reads
# of a real daemon (`read_chaos.Reader`), then each answer changed as a broken read would give it.


@dataclass
class Read:
    home: Path
    source: str
    child: str
    grandchild: str
    reads: list[ReadAnswer]


@pytest.fixture(scope="module")
def read(tmp_path_factory: pytest.TempPathFactory) -> Read:
    home = tmp_path_factory.mktemp("reads") / "home"
    d = DaemonProcess(home).start()
    reader = Reader(home)
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turns = [run_turn(c, sid, f"t{n}")["turnId"] for n in range(5)]

        def fork(source: str, turn: str) -> str:
            op_id = c.call("fork.create", fork_params(source, turn))["operation"]["operationId"]

            def poll() -> dict[str, Any] | None:
                op = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
                return op if op["status"] != "accepted" else None

            op = wait_for(poll)
            assert op["status"] == "committed", op
            return str(op["targetAgentSessionId"])

        child = fork(sid, turns[1])
        second = fork(sid, turns[2])
        grandchild = fork(child, run_turn(c, child, "own")["turnId"])
        gone = create_session(c)["agentSessionId"]
        for _ in range(4):
            create_session(c)
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": gone})
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": second})
        reads: list[ReadAnswer] = [
            reader.page_list(c),
            reader.page_timeline(c, sid),
            reader.lineage(c, child),
            reader.lineage(c, sid),
            reader.page_forks(c, sid),
        ]
    finally:
        d.stop()
    return Read(home, sid, child, grandchild, reads)


def read_laws(reads: list[ReadAnswer]) -> set[Law]:
    return {v.law for v in check_read_answers(reads)}


def test_real_reads_keep_the_reads_laws(read: Read) -> None:
    listing, timeline, up, down, forks = read.reads
    assert isinstance(listing, ListPaging) and len(listing.pages) >= 3  # 7 live, limit 3
    assert isinstance(timeline, TimelinePaging) and len(timeline.pages) >= 3  # 5 Turns, limit 2
    assert isinstance(down, LineageRead) and down.answer["descendants"]
    assert isinstance(forks, ForkPaging) and len(forks.pages) == 2  # 2 forks, maxNodes 1
    assert check_read_answers(read.reads) == []


def test_a_list_paging_that_repeats_misses_or_shows_a_deleted_session_is_reported(
    read: Read,
) -> None:
    listing = read.reads[0]
    assert isinstance(listing, ListPaging)
    (first, more), *rest = listing.pages
    twice = replace(listing, pages=((first, more), (first[:1] + rest[0][0][1:], True), *rest[1:]))
    missed = replace(listing, pages=((first[1:], more), *rest))
    deleted = next(iter(listing.before.deleted))
    dead = replace(listing, pages=((first + (deleted,), more), *rest))
    empty = replace(listing, pages=(((), True), *listing.pages))
    for bad in (twice, missed, dead, empty):
        assert read_laws([bad]) == {Law.LIST_PAGES}, bad.pages


def test_a_timeline_paging_that_repeats_reorders_or_leaves_a_gap_is_reported(
    read: Read,
) -> None:
    timeline = read.reads[1]
    assert isinstance(timeline, TimelinePaging)
    (first, more), *rest = timeline.pages
    twice = replace(timeline, pages=((first, more), (first, True), *rest))
    gap = replace(timeline, pages=((first[:1], more), *rest))
    swapped = replace(timeline, pages=((first[::-1], more), *rest))
    moved = replace(timeline, pages=(((first[0], (first[1][0], 99)), more), *rest))
    # A page cut short (its byte bound) is no finding; an empty one that pages on, or one
    # past its limit, is.
    short = replace(timeline, pages=((first[:1], True), ((first[1],), True), *rest))
    assert read_laws([short]) == set(), short.pages
    empty = replace(timeline, pages=(((), True), (first, more), *rest))
    over = replace(timeline, pages=(((*first, *rest[0][0]), more), *rest[1:]))
    for bad in (twice, gap, swapped, moved, empty, over):
        assert read_laws([bad]) == {Law.TIMELINE_PAGES}, bad.pages


def test_a_lineage_answer_that_disagrees_with_the_store_is_reported(read: Read) -> None:
    up, down = read.reads[2], read.reads[3]
    assert isinstance(up, LineageRead) and isinstance(down, LineageRead)
    no_ancestors = replace(up, answer={**up.answer, "ancestors": []})
    nodes = down.answer["descendants"]
    child = next(n for n in nodes if n["agentSessionId"] == read.child)
    missing = replace(down, answer={**down.answer, "descendants": [child | {"children": []}]})
    deleted = next(n for n in nodes if n["deleted"])
    revived = [n | {"deleted": False} if n is deleted else n for n in nodes]
    shown_live = replace(down, answer={**down.answer, "descendants": revived})
    reordered = replace(down, answer={**down.answer, "descendants": nodes[::-1]})
    renumbered = [n | {"ordinal": n["ordinal"] + 1} if n is child else n for n in nodes]
    wrong_ordinal = replace(down, answer={**down.answer, "descendants": renumbered})
    moved = [child | {"children": []}, *child["children"], *(n for n in nodes if n is not child)]
    misplaced = replace(down, answer={**down.answer, "descendants": moved})
    for bad in (no_ancestors, missing, shown_live, reordered, wrong_ordinal, misplaced):
        assert read_laws([bad]) == {Law.LINEAGE_ANSWER}, bad.answer


def test_a_fork_paging_that_misses_repeats_or_goes_back_is_reported(read: Read) -> None:
    forks = read.reads[4]
    assert isinstance(forks, ForkPaging)
    first, second = forks.pages
    missed = replace(forks, pages=(first,))
    twice = replace(forks, pages=(first, first + second))
    back = replace(forks, pages=(second, first))
    for bad in (missed, twice, back):
        assert read_laws([bad]) == {Law.LINEAGE_ANSWER}, bad.pages


def test_a_claude_stream_left_whole_behind_a_message_it_cannot_read_is_reported() -> None:
    """`provider_fault_settles`, Claude Code's row: its SDK cannot read on from a wrong-shaped
    message (`notobject`), so a Turn `completed` behind one is reported, where an app-server
    reader skips the same fault (a Tutti Agent or Codex Turn `completed` is clean, a `failed`
    one reported); Claude's `garbage` is skipped like theirs."""
    done = {"phase": "settled", "outcome": "completed", "errorReason": None}
    failed = done | {"outcome": "failed", "errorReason": "provider_protocol_error"}

    def seen(provider: str, fault: str, turn: dict[str, Any]) -> list[Violation]:
        f = ProviderFault(
            "s", fault, "t", in_bound=True, disturbed=False, relay_pid=7, provider=provider
        )
        return check_provider_faults([f], {"t": turn})

    assert seen("claude-code", "notobject", failed) == []
    assert [v.law for v in seen("claude-code", "notobject", done)] == [Law.PROVIDER_FAULT_SETTLES]
    assert "claude-code notobject" in seen("claude-code", "notobject", done)[0].detail
    assert seen("claude-code", "garbage", done) == []
    for provider in ("tutti-agent", "codex"):
        assert seen(provider, "notobject", done) == []
        assert [v.law for v in seen(provider, "notobject", failed)] == [Law.PROVIDER_FAULT_SETTLES]


def test_a_start_given_up_whose_turn_failed_or_whose_stopped_server_lives_is_reported() -> None:
    """`provider_fault_settles`, the `stop_start` round's row (a Turn interrupted while its
    app-server, stopped as it started, held its `session.start`): `interrupted`, the relay
    gone and the next Turn completed on a new one is clean; `failed` (the start held past the
    interrupt until the liveness check ended it), the stopped relay still running, or the next
    Turn on it or failed, is reported."""
    done = {"phase": "settled", "outcome": "interrupted", "errorReason": None}
    f = ProviderFault(
        "s",
        "stop_start",
        "t",
        in_bound=True,
        disturbed=False,
        relay_pid=7,
        next_outcome="completed",
        next_pid=8,
        provider="tutti-agent",
    )
    assert check_provider_faults([f], {"t": done}) == []
    failed = done | {"outcome": "failed", "errorReason": "provider_stopped"}
    tampered = [
        ([f], {"t": failed}),
        ([replace(f, relay_alive=True)], {"t": done}),
        ([replace(f, next_pid=7)], {"t": done}),
        ([replace(f, next_outcome="failed")], {"t": done}),
        ([replace(f, in_bound=False)], {"t": done}),
    ]
    for faults, seen in tampered:
        found = check_provider_faults(faults, seen)
        assert [v.law for v in found] == [Law.PROVIDER_FAULT_SETTLES], (faults, found)


@pytest.mark.codex
def test_a_committed_codex_child_cut_short_in_its_own_home_is_unreadable(tmp_path: Path) -> None:
    """`child_readable`, Codex's: a committed child's own home holds its rollout and every one
    it references, and the logical history they make starts with the Turns the fork recorded
    for it. The `worker.bind.after_copy` tamper's damage (each rollout of the child's home cut
    to its session_meta line; here the ancestor's copy, which holds the Turns the child reads
    through) keeps every identity and link, but the boundary Turn is gone."""
    from model_fakes.responses import ResponsesServer
    from tests.daemon.test_fork_saga import fork, until_terminal
    from tests.reliability.reliability_harness import codex_binary

    program = codex_binary()
    assert program is not None, "no codex program (AGENTHOST_CODEX_BIN)"
    home = tmp_path / "home"
    home.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with ResponsesServer() as server:
        (home / "agenthost.toml").write_text(
            f'[providers.codex]\ncommand = "{program}"\nmodel = "mock-model"\n'
            f'model_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, provider="codex", title="c", cwd=str(cwd))["agentSessionId"]
            turns = [run_turn(c, sid, text) for text in ("one", "two")]
            op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
            assert op["status"] == "committed", op
        finally:
            d.stop()
    assert Law.CHILD_READABLE not in laws(home)
    child_home = runtime_home(home, WS, op["targetAgentSessionId"], "codex-home")
    [child] = child_rollouts(child_home)
    [ancestor] = [p for p in rollouts(child_home) if p != child]
    data = ancestor.read_bytes()
    ancestor.write_bytes(data[: data.index(b"\n") + 1])
    assert Law.CHILD_READABLE in laws(home)


def test_an_app_server_log_past_its_bound_is_reported(tmp_path: Path) -> None:
    """`provider_logs_bounded` over a real daemon's home after a Turn: its app-server's
    stderr log is within the bound; one byte past the bound and its closing line is reported,
    in the log and in the one moved aside."""
    from drivers.app_server.process import STDERR_LOG_BYTES
    from tests.support.invariants import PROVIDER_LOG_SLACK

    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        assert run_turn(c, sid, "hello")["outcome"] == "completed"
    finally:
        d.stop()
    [log] = home.glob(f"runtimes/{WS}/{sid}/*/.app-server.log")
    assert Law.PROVIDER_LOGS_BOUNDED not in laws(home)
    with log.open("ab") as f:
        f.write(b"x" * (STDERR_LOG_BYTES + PROVIDER_LOG_SLACK + 1 - log.stat().st_size))
    assert Law.PROVIDER_LOGS_BOUNDED in laws(home)
    log.rename(log.with_name(log.name + ".1"))
    assert Law.PROVIDER_LOGS_BOUNDED in laws(home)
    log.with_name(log.name + ".1").write_bytes(b"x" * (STDERR_LOG_BYTES + PROVIDER_LOG_SLACK))
    assert Law.PROVIDER_LOGS_BOUNDED not in laws(home)


def test_an_event_past_its_cap_is_reported(tmp_path: Path) -> None:
    """`events_bounded` over the events a real daemon published for a Session whose settings
    are too big to carry and a Turn whose model streamed its reply as one delta too big for an
    event: within the cap; one byte more of any type is reported."""
    from model_fakes.responses import ResponsesServer

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    reply = "d" * (600 << 10)
    largest: dict[str, int] = {}
    with ResponsesServer(lambda body: reply, delta_chars=len(reply)) as model:
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{model.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(d.events)
        try:
            time.sleep(0.5)  # ZeroMQ's slow joiner
            c = d.client(timeout=60)
            sid = create_session(c, settings={"blob": "s" * (300 << 10)})["agentSessionId"]
            c.call("session.pin", {"workspaceId": WS, "agentSessionId": sid, "pinned": True})
            assert run_turn(c, sid, "big")["outcome"] == "completed"
            while sub.poll(1000):
                body = sub.recv_multipart()[-1]
                kind = str(msgpack.unpackb(body, raw=False)["type"])
                largest[kind] = max(largest.get(kind, 0), len(body))
        finally:
            sub.close()
            ctx.term()
            d.stop()
    assert largest.get("session.upserted"), largest
    assert largest.get("message.delta"), largest
    assert check_event_bounds(largest) == []
    tampered = {kind: MAX_EVENT_BYTES + 1 for kind in largest}
    found = check_event_bounds(tampered)
    assert [v.law for v in found] == [Law.EVENTS_BOUNDED] * len(largest), found


def test_a_child_quarantined_for_an_unknown_operation_no_abandon_began_is_reported(
    base: Base, tmp_path: Path
) -> None:
    # Only an abandon moves a child aside; an `unknown` operation's child in its quarantine
    # with no abandon of it begun was moved by something else.
    home = tampered(base, tmp_path)
    child = _unknown_child(base, home)
    source_home = runtime_home(home, WS, base.source)
    op = base.unknown["operationId"]
    dest = source_home / "quarantine" / op / child.relative_to(source_home)
    dest.parent.mkdir(parents=True)
    child.rename(dest)
    found = [v.detail for v in check_invariants(home).violations if v.law is Law.QUARANTINE]
    assert found == [f"{dest} quarantined for unknown operation"], found


def test_a_file_an_abandon_quarantined_then_removed_is_reported(base: Base, tmp_path: Path) -> None:
    # The unknown fork abandoned as `fork.resolve` does: its child moved aside and the move
    # recorded in the resolution's evidence. Removing the file is then reported; the file
    # where it was moved, or kept under `.evidence`, is not.
    op = base.unknown["operationId"]
    home = tampered(base, tmp_path)
    child = _unknown_child(base, home)
    source_home = runtime_home(home, WS, base.source)
    dest = source_home / "quarantine" / op / child.relative_to(source_home)
    dest.parent.mkdir(parents=True)
    child.rename(dest)
    result = json.dumps({"action": "abandon", "evidence": {"quarantinedNow": [str(dest)]}})
    conn = apsw.Connection(str(home / "store.sqlite3"))
    try:
        conn.execute(
            "UPDATE fork_operations SET status = 'abandoned', completed_at_ms = 0"
            f"{BARRIER_RELEASE_SQL}"
            f"{stage_assignment(ForkStatus.UNKNOWN, ForkStatus.ABANDONED)}"
            " WHERE operation_id = ?",
            (op,),
        )
        conn.execute("DELETE FROM session_reservations WHERE operation_id = ?", (op,))
        conn.execute(
            "INSERT INTO fork_resolutions (workspace_id, operation_id, request_id, action,"
            " state, child_id, evidence_json, result_json, created_at_ms, updated_at_ms)"
            " VALUES (?, ?, 'r', 'abandon', 'done', NULL, '{}', ?, 0, 0)",
            (WS, op, result),
        )
    finally:
        conn.close()

    def quarantine_laws() -> list[str]:
        return [v.detail for v in check_invariants(home).violations if v.law is Law.QUARANTINE]

    assert quarantine_laws() == []
    # Its source deleted: `runtimes/.evidence/<ws>/<sid>/<provider home>/quarantine/<op>`.
    where = dest.relative_to(home / "runtimes").parts[:4]
    kept = home.joinpath("runtimes", ".evidence", *where, op)
    kept.parent.mkdir(parents=True)
    (source_home / "quarantine" / op).rename(kept)
    assert quarantine_laws() == []
    shutil.rmtree(kept)
    assert quarantine_laws() == [f"{dest}, quarantined by {op}, was removed"]


def _claude_source_forked(
    tmp_path: Path,
) -> tuple[Path, str, list[dict[str, Any]], dict[str, Any]]:
    """A stopped daemon's home whose Claude Code Session ran two Turns and was forked through
    the second (committed): (home, the source's id, its two Turns, the fork's operation)."""
    from model_fakes.messages import MessagesServer
    from tests.daemon.test_fork_saga import fork, until_terminal

    home = tmp_path / "home"
    home.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with MessagesServer() as server:
        (home / "agenthost.toml").write_text(
            f'[providers.claude-code]\nmodel_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, provider="claude-code", title="c", cwd=str(cwd))[
                "agentSessionId"
            ]
            turns = [run_turn(c, sid, text) for text in ("one", "two")]
            op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
            assert op["status"] == "committed", op
        finally:
            d.stop()
    return home, sid, turns, op


@pytest.mark.claude
def test_a_committed_claude_child_cut_short_in_its_own_home_is_unreadable(
    tmp_path: Path,
) -> None:
    """`child_readable`, Claude's: the committed child's transcript in its own home holds the
    Turns the fork recorded for it (their root user messages, in order). One cut back to its
    first line still names the child's session, but its boundary Turn is gone."""
    home, _sid, _turns, op = _claude_source_forked(tmp_path)
    assert Law.CHILD_READABLE not in laws(home)
    target = op["targetAgentSessionId"]
    (child,) = home.glob(f"runtimes/{WS}/{target}/claude-config/projects/*/*.jsonl")
    child.write_bytes(child.read_bytes().splitlines(keepends=True)[0])
    assert Law.CHILD_READABLE in laws(home)


@pytest.mark.claude
def test_a_completed_claude_turn_missing_from_its_transcript_is_reported(tmp_path: Path) -> None:
    """`claude_turn_in_transcript`: a completed Claude Turn is a Turn of its Session's
    transcript (rooted at its provider turn id, with the reply, holding its binding's
    checkpoint); a committed child's cloned Turns are read in the child's own transcript. The
    last Turn's reply cut out of the source's transcript is reported, and so is the first
    Turn's root user message cut out."""
    home, sid, turns, _op = _claude_source_forked(tmp_path)
    assert [t["outcome"] for t in turns] == ["completed", "completed"]

    def found() -> list[str]:
        violations = check_invariants(home).violations
        return [v.detail for v in violations if v.law is Law.CLAUDE_TURN_IN_TRANSCRIPT]

    assert found() == []
    (source,) = home.glob(f"runtimes/{WS}/{sid}/claude-config/projects/*/*.jsonl")
    whole = source.read_bytes().splitlines(keepends=True)
    entries = [json.loads(line) for line in whole]
    roots = [i for i, e in enumerate(entries) if e.get("uuid") == turns[1]["rootProviderTurnId"]]
    assert len(roots) == 1, turns[1]
    source.write_bytes(
        b"".join(
            line
            for i, (line, e) in enumerate(zip(whole, entries, strict=True))
            if i < roots[0] or e.get("type") != "assistant"
        )
    )
    (cut,) = found()
    assert f"turn {turns[1]['turnId']}" in cut and "holds no assistant message" in cut, cut
    source.write_bytes(
        b"".join(
            line
            for line, e in zip(whole, entries, strict=True)
            if e.get("uuid") != turns[0]["rootProviderTurnId"]
        )
    )
    (gone,) = found()
    assert f"turn {turns[0]['turnId']}" in gone and "no Turn rooted at" in gone, gone


@pytest.mark.codex
def test_a_completed_codex_turn_cut_from_its_rollout_is_reported(tmp_path: Path) -> None:
    """`codex_turn_in_rollout`: a completed Codex Turn has its end in its Session's logical
    history read from its own home; a committed child's cloned Turns in the ancestor's copy
    in the child's home. The source's rollout cut back to before its last Turn (whole lines
    left) is reported, naming that Turn; the child's copy is left whole and reports nothing."""
    from model_fakes.responses import ResponsesServer
    from tests.codex.codex_helpers import codex_bin
    from tests.daemon.test_fork_saga import fork, until_terminal

    home = tmp_path / "home"
    home.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with ResponsesServer() as server:
        (home / "agenthost.toml").write_text(
            f'[providers.codex]\ncommand = "{codex_bin()}"\nmodel = "mock-model"\n'
            f'model_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            sid = create_session(c, provider="codex", title="c", cwd=str(cwd))["agentSessionId"]
            turns = [run_turn(c, sid, text) for text in ("one", "two")]
            op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
            assert op["status"] == "committed", op
        finally:
            d.stop()
    assert [t["outcome"] for t in turns] == ["completed", "completed"]
    _cut_last_turn_is_reported(
        home,
        sid,
        Law.CODEX_TURN_IN_ROLLOUT,
        runtime_home(home, WS, sid, "codex-home"),
        lambda payload: payload["turn_attribution"]["turn_id"],
    )


def test_a_completed_tutti_turn_cut_from_its_rollout_is_reported(tmp_path: Path) -> None:
    """`tutti_turn_in_rollout`: a completed Tutti Agent Turn has its end in its thread's
    rollout in its own home; a committed child's cloned Turns in the child's whole copy. The
    source's rollout cut back to before its last Turn (whole lines left) is reported, naming
    that Turn; the child's copy is left whole and reports nothing."""
    from tests.daemon.test_fork_saga import fork, until_terminal

    home = tmp_path / "home"
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        turns = [run_turn(c, sid, text) for text in ("one", "two")]
        op = until_terminal(c, fork(c, sid, turns[1]["turnId"])[1])
        assert op["status"] == "committed", op
    finally:
        d.stop()
    assert [t["outcome"] for t in turns] == ["completed", "completed"]
    _cut_last_turn_is_reported(
        home,
        sid,
        Law.TUTTI_TURN_IN_ROLLOUT,
        runtime_home(home, WS, sid),
        lambda payload: payload["turn_id"],
    )


def _cut_last_turn_is_reported(
    home: Path,
    sid: str,
    law: Law,
    source_home: Path,
    turn_of: Callable[[dict[str, Any]], str],
) -> None:
    """Nothing of `law` found; then the source's own rollout in `source_home` (not a fork
    child's) cut back to before its last `task_started` line (`turn_of` its payload: that
    Turn's provider id), whole lines left: reported once, naming the Session and that Turn."""

    def found() -> list[str]:
        return [v.detail for v in check_invariants(home).violations if v.law is law]

    assert found() == []
    (source,) = [p for p in rollouts(source_home) if p not in child_rollouts(source_home)]
    lines = source.read_bytes().split(b"\n")
    at = max(i for i, line in enumerate(lines) if b'"task_started"' in line)
    last = turn_of(json.loads(lines[at])["payload"])
    source.write_bytes(b"\n".join(lines[:at]) + b"\n")
    (cut,) = found()
    assert f"session {sid}" in cut and f"no end of Turn {last}" in cut, cut


def test_a_second_socket_dir_of_a_home_or_one_after_its_clean_stop_breaks_socket_dir_bounded(
    base: Base, tmp_path: Path
) -> None:
    home = tampered(base, tmp_path)
    run_dir = home / "run" / "workers"
    named = fallback_socket_dir(run_dir)
    named.mkdir(mode=0o700)
    # What a start that found the named one unsafe makes instead, marked with its run dir.
    fresh = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
    try:
        assert Law.SOCKET_DIR_BOUNDED not in laws(home)  # one, as a SIGKILLed daemon leaves
        assert check_socket_dirs(home, stopped_cleanly=True) != []
        (fresh / SOCKET_DIR_MARKER).write_text(str(run_dir))
        assert Law.SOCKET_DIR_BOUNDED in laws(home)
    finally:
        shutil.rmtree(named)
        shutil.rmtree(fresh)
    assert check_socket_dirs(home, stopped_cleanly=True) == []
