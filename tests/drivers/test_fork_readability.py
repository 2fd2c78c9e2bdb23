"""The bound child's readability proof without a process spawn: the tutti-agent
driver proves the child readable from the target home with tutti_agent's own reader inside the
worker, a damaged copy still makes the fork `unknown`, and the rollout lineage reader (the one
the Codex driver proves with) judges real tutti-agent Referenced lineages — same file format —
as the app-server does."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from drv_helpers import TUTTI_BIN, EventLog, completed
from test_tutti_driver import fork_request, open_session

from domain.enums import DeliveryDisposition
from domain.worker_messages import ForkResult
from drivers.app_server.driver import AppServerDriver
from drivers.app_server.fork import ReaderNotApplicable
from drivers.app_server.process import AppServerProcess, private_env
from drivers.binder import RolloutBinder, iter_rollouts, parse_rollout
from drivers.codex.lineage import codex_turns, prove_codex_child, read_rollout_lineage
from drivers.failpoints import Failpoints
from drivers.tutti_agent import create_driver as tutti_agent_driver
from drivers.tutti_agent import prove_tutti_child

PROXY = str(Path(__file__).with_name("tamper_proxy.py"))
Make = Callable[..., AppServerDriver]


def counted(log_path: Path) -> list[str]:
    """The real app-server behind a relay that logs every client request method."""
    return [sys.executable, PROXY, "none", str(log_path), "--", TUTTI_BIN]


def spawns(log_path: Path) -> int:
    """App-servers started through `counted` (each one is initialized exactly once)."""
    return log_path.read_text().splitlines().count("initialize") if log_path.exists() else 0


def run_child_turn(driver: AppServerDriver, target: Path, root: Path, child_id: str) -> None:
    child_log = EventLog()
    driver.start_session(
        {
            "agentSessionId": "child",
            "home": str(target),
            "cwd": str(root),
            "settings": {},
            "model": None,
            "providerSessionId": child_id,
        }
    )
    driver.start_turn({"agentSessionId": "child", "turnId": "C1", "text": "next"}, child_log)
    assert child_log.wait_for(completed("C1"))["outcome"] == "completed"


@pytest.mark.timeout(60)
def test_fork_proves_the_child_readable_in_the_worker_without_spawning_an_app_server(
    make_driver: Make, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=counted(calls))
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path)
    assert spawns(calls) == 1  # the source Session's own app-server
    target = tmp_path / "runtimes" / "child" / "tutti-agent-home"
    result = driver.fork(fork_request(home, thread_id, version, turns[:2], target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None and result.child is not None
    assert result.binding.receipt["verifiedReadable"] is True
    assert result.binding.receipt["readabilityProof"] == "in_worker"
    # Proven without a second process: the fork ran on the source's live app-server alone.
    assert spawns(calls) == 1
    # The proof is not weaker than the child's real use: it resumes and runs a turn.
    run_child_turn(driver, target, tmp_path, result.child.provider_session_id)


@pytest.mark.timeout(60)
def test_app_server_proof_stays_available_as_a_setting(make_driver: Make, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    driver = make_driver(command=counted(calls), readability_proof="app_server")
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None
    assert result.binding.receipt["readabilityProof"] == "app_server"
    assert spawns(calls) == 2


def test_unknown_readability_proof_setting_is_refused() -> None:
    with pytest.raises(Exception, match="readability_proof"):
        tutti_agent_driver({"readability_proof": "trust_me"}, Failpoints())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("proof", ["in_worker", "app_server"])
def test_copy_tampered_between_bind_and_proof_is_unknown(
    make_driver: Make, tmp_path: Path, proof: str
) -> None:
    """`worker.bind.after_copy=tamper` cuts the copied rollout back to its session_meta after
    the binder made it durable: the proof must refuse the child, so the fork is `unknown`."""
    driver = make_driver({"worker.bind.after_copy": "tamper"}, readability_proof=proof)
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a", "b"))
    target = tmp_path / "t"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert result.error is not None and "not readable from its home" in result.error
    assert result.binding is None
    assert result.child is not None and result.child.provider_turn_ids == tuple(turns)
    # The tamper really happened: the copy holds only its first line.
    [copied] = list(iter_rollouts(target))
    assert len(copied.read_bytes().splitlines()) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("proof", ["in_worker", "app_server"])
def test_a_child_whose_boundary_turn_lost_its_end_is_unknown(
    make_driver: Make, tmp_path: Path, proof: str
) -> None:
    """The provider's child cut at a line before its boundary Turn's `task_complete` after
    `thread/fork` answered (`worker.fork.after_provider_call` held), so the binder copies it
    as it is: it lists the prefix's Turn ids, the last one in progress, and either proof
    refuses it (each requires every prefix Turn ended): the fork is `unknown`, never
    `accepted`."""
    points = Failpoints({"worker.fork.after_provider_call": "hang"})
    driver = tutti_agent_driver({"command": TUTTI_BIN, "readability_proof": proof}, points)
    try:
        home, thread_id, version, turns = open_session(
            driver, EventLog(), tmp_path, texts=("a", "b")
        )
        results: list[ForkResult] = []
        forking = threading.Thread(
            target=lambda: results.append(
                driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "t"))
            )
        )
        forking.start()
        deadline = time.monotonic() + 30
        while len(list(iter_rollouts(home))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # the answer sent (the point holds the fork after it)
        [child] = [p for p in iter_rollouts(home) if thread_id not in p.name]
        lines = child.read_bytes().split(b"\n")
        ends = [i for i, raw in enumerate(lines) if b'"task_complete"' in raw]
        child.write_bytes(b"\n".join(lines[: ends[-1]]) + b"\n")
        points.set({"worker.fork.after_provider_call": "off"})
        forking.join(30)
        [result] = results
        assert result.disposition is DeliveryDisposition.UNKNOWN, result
        assert result.error is not None and "in progress" in result.error
        assert result.binding is None
    finally:
        points.set({"worker.fork.after_provider_call": "off"})
        driver.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("proof", ["in_worker", "app_server"])
def test_a_copy_changed_after_the_bind_with_its_turns_intact_is_unknown(
    make_driver: Make, tmp_path: Path, proof: str
) -> None:
    """A bound copy whose reply text is changed between the bind and the proof (its Turns'
    ids and statuses intact, `worker.bind.after_copy` held): the child the proof would accept
    is not the one the binder wrote and verified, so the fork is `unknown`."""
    points = Failpoints({"worker.bind.after_copy": "hang"})
    driver = tutti_agent_driver({"command": TUTTI_BIN, "readability_proof": proof}, points)
    try:
        home, thread_id, version, turns = open_session(
            driver, EventLog(), tmp_path, texts=("a", "b")
        )
        target = tmp_path / "t"
        results: list[ForkResult] = []
        forking = threading.Thread(
            target=lambda: results.append(
                driver.fork(fork_request(home, thread_id, version, turns, target))
            )
        )
        forking.start()
        deadline = time.monotonic() + 30
        while not list(iter_rollouts(target)) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # the copy written whole (the point holds the bind after it)
        [copied] = list(iter_rollouts(target))
        data = copied.read_bytes()
        assert data.count(b"echo: b") >= 1
        copied.write_bytes(data.replace(b"echo: b", b"forged!"))  # same length, same Turns
        points.set({"worker.bind.after_copy": "off"})
        forking.join(30)
        [result] = results
        assert result.disposition is DeliveryDisposition.UNKNOWN, result
        assert result.error is not None and "no longer holds the bytes" in result.error
        assert result.binding is None
    finally:
        points.set({"worker.bind.after_copy": "off"})
        driver.close()


# --------------------------------------------------------------------- the readers, directly


def _referenced_child(tmp_path: Path, make_driver: Make) -> tuple[Path, str, str, list[str]]:
    """A real tutti-agent Referenced child (the Codex 0.171 layout) bound into `tmp/target`."""
    driver = make_driver()
    home, thread_id, _, turns = open_session(driver, EventLog(), tmp_path, texts=("a", "b", "c"))
    driver.stop_session({"agentSessionId": "src"})
    server = AppServerProcess(
        [TUTTI_BIN, "app-server"], env=private_env(None, "TUTTI_AGENT_HOME", home)
    )
    server.start()
    try:
        server.initialize("t", "0")
        forked = server.request(
            "thread/fork",
            {"threadId": thread_id, "lastTurnId": turns[1], "persistence": "referenced"},
        )
    finally:
        server.close()
    child_id = forked["thread"]["id"]
    target = tmp_path / "target"
    RolloutBinder().bind(home, target, child_id)
    return target, child_id, thread_id, turns[:2]


def _rollout_of(home: Path, thread_id: str) -> Path:
    [path] = [p for p in iter_rollouts(home) if p.name.endswith(f"-{thread_id}.jsonl")]
    return path


@pytest.mark.timeout(60)
def test_lineage_reader_reads_a_referenced_child_from_its_home_alone(
    make_driver: Make, tmp_path: Path
) -> None:
    target, child_id, source_id, prefix = _referenced_child(tmp_path, make_driver)
    lineage = read_rollout_lineage(target, child_id)
    assert [s.thread_id for s in lineage.segments] == [source_id, child_id]
    assert [t for t, _ in codex_turns(lineage.records)] == prefix
    assert prove_codex_child(target, child_id, source_id, prefix) is None
    import tutti_agent

    assert prove_tutti_child(target, child_id, source_id, prefix, tutti_agent.__version__) is None
    # Each reader refuses a prefix the child does not show, and a wrong source.
    assert prove_codex_child(target, child_id, source_id, prefix[:1]) is not None
    assert prove_codex_child(target, child_id, child_id, prefix) is not None
    assert (
        prove_tutti_child(target, child_id, source_id, prefix[::-1], tutti_agent.__version__)
        is not None
    )
    with pytest.raises(ReaderNotApplicable):
        prove_tutti_child(target, child_id, source_id, prefix, "0.0.0-other")


@pytest.mark.timeout(60)
def test_the_lineage_reader_takes_the_binds_decoded_lines_only_for_the_bytes_it_wrote(
    make_driver: Make, tmp_path: Path
) -> None:
    """Every bound file is read back whole; one that holds exactly the bytes the bind decoded
    takes the bind's decoded lines (the same objects, not decoded again), one changed since
    is decoded from its own bytes and judged on them."""
    target, child_id, source_id, prefix = _referenced_child(tmp_path, make_driver)
    ancestor, child = _rollout_of(target, source_id), _rollout_of(target, child_id)
    known = {
        str(path): parse_rollout(path.read_bytes(), thread)
        for path, thread in ((ancestor, source_id), (child, child_id))
    }
    lineage = read_rollout_lineage(target, child_id, known)
    taken = {id(r["payload"]) for parsed in known.values() for r in parsed.records}
    assert lineage.records and all(id(r.payload) in taken for r in lineage.records)
    assert prove_codex_child(target, child_id, source_id, prefix, known) is None
    # The ancestor changed after the bind (a line dropped: an ordinal gap): its own bytes.
    lines = ancestor.read_bytes().splitlines(keepends=True)
    ancestor.write_bytes(b"".join(lines[:3] + lines[4:]))
    problem = prove_codex_child(target, child_id, source_id, prefix, known)
    assert problem is not None and "ordinal gap" in problem, problem


def _shift_history_base(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    first["payload"]["history_base"]["end_byte_offset"] += 1
    path.write_bytes(json.dumps(first).encode() + b"\n" + b"".join(lines[1:]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "damage",
    ["ancestor_missing", "ancestor_cut", "ancestor_gap", "child_torn", "byte_offset_moved"],
)
def test_lineage_reader_and_tutti_reader_refuse_a_damaged_lineage(
    make_driver: Make, tmp_path: Path, damage: str
) -> None:
    target, child_id, source_id, prefix = _referenced_child(tmp_path, make_driver)
    ancestor, child = _rollout_of(target, source_id), _rollout_of(target, child_id)
    if damage == "ancestor_missing":
        ancestor.unlink()
    elif damage == "ancestor_cut":
        data = ancestor.read_bytes()
        ancestor.write_bytes(data[: data.index(b"\n") + 1])
    elif damage == "child_torn":
        child.write_bytes(child.read_bytes()[:-3])
    elif damage == "ancestor_gap":
        lines = ancestor.read_bytes().splitlines(keepends=True)
        ancestor.write_bytes(b"".join(lines[:3] + lines[4:]))
    else:
        _shift_history_base(child)
    assert prove_codex_child(target, child_id, source_id, prefix) is not None
    import tutti_agent

    # The child's torn line is its settings header, past a complete session_meta: tutti_agent
    # drops a torn tail (its writer truncates it on reopen), so for its own reader the child
    # still reads with every turn; the stricter lineage reader refuses it. Every other damage
    # is refused by both.
    problem = prove_tutti_child(target, child_id, source_id, prefix, tutti_agent.__version__)
    assert (problem is None) == (damage == "child_torn"), problem


@pytest.mark.timeout(60)
def test_a_child_named_before_its_ancestor_is_no_child_until_a_rebind_completes_it(
    make_driver: Make, tmp_path: Path
) -> None:
    """The one half state the binder's two rounds allow (a power loss in the last round made
    the child's name durable and not its ancestor's): both readers refuse the child, so no
    proof or `fork.resolve` inspection takes it for a readable one, and the idempotent
    re-bind an adoption runs completes it (the child kept identical, the ancestor copied)."""
    import tutti_agent

    target, child_id, source_id, prefix = _referenced_child(tmp_path, make_driver)
    _rollout_of(target, source_id).unlink()
    assert prove_codex_child(target, child_id, source_id, prefix) is not None
    assert prove_tutti_child(target, child_id, source_id, prefix, tutti_agent.__version__)
    receipt = RolloutBinder().bind(
        tmp_path / "runtimes" / "src" / "tutti-agent-home", target, child_id
    )
    assert [(r.role, r.action.value) for r in receipt.rollouts] == [
        ("child", "identical"),
        ("ancestor", "copied"),
    ]
    assert prove_codex_child(target, child_id, source_id, prefix) is None
    assert prove_tutti_child(target, child_id, source_id, prefix, tutti_agent.__version__) is None


@pytest.mark.timeout(60)
def test_a_fork_is_accepted_only_once_the_bound_names_are_durable(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The binder's last round (the names' directories: the child's `sessions/`) runs after
    the proof's read-back (a small child's, on the fork's thread) or while it runs (a large
    one's, on the names' pool), and the fork waits for that round before `accepted`: a
    failure of it is `unknown`, like any binder failure after the provider call, though the
    child was proven readable."""
    import os

    import drivers.binder as binder_module

    real = binder_module.fsync_dir
    names_dir = os.fspath(tmp_path / "t" / "sessions")

    def fsync_dir(path: Path | str) -> None:
        if os.fspath(path) == names_dir:
            raise OSError(5, "injected: the names' directory sync failed", str(path))
        real(path)

    monkeypatch.setattr(binder_module, "fsync_dir", fsync_dir)
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a",))
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "t"))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert result.error is not None and "names' sync" in result.error, result.error
    assert result.binding is None
    assert result.child is not None and result.child.provider_turn_ids == tuple(turns)
