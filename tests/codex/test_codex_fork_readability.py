"""The Codex fork's readability proof inside the worker, against the real
`codex app-server` 0.171.0: no app-server is spawned to prove the bound child, the child still
resumes from its own home and runs a turn, and a copy damaged between bind and proof makes the
fork `unknown`."""

from __future__ import annotations

from pathlib import Path

import pytest
from codex_helpers import (
    CodexSession,
    EventLog,
    MakeDriver,
    fork_request,
    home_of,
    open_session,
    run_turns,
    start,
)

from domain.enums import DeliveryDisposition
from drivers.binder import iter_rollouts

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]


def test_fork_proves_the_child_in_the_worker_without_spawning_and_the_child_runs(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    spawned = driver.spawns
    target = home_of(tmp_path, "child")
    result = driver.fork(fork_request(src, src.turns[:1], target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and result.binding is not None
    receipt = result.binding.receipt
    assert receipt["verifiedReadable"] is True
    assert receipt["readabilityProof"] == "in_worker"
    # The fork ran on the source's live app-server; the proof started no other.
    assert driver.spawns == spawned
    started = start(
        driver, tmp_path, "child", thread_id=result.child.provider_session_id, context=src.context
    )
    assert started["providerSessionId"] == result.child.provider_session_id
    run_turns(driver, log, "child", ("three",))


def test_copy_tampered_between_bind_and_proof_is_unknown(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver({"worker.bind.after_copy": "tamper"})
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    target = home_of(tmp_path, "child")
    result = driver.fork(fork_request(src, src.turns[:1], target))
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert result.error is not None and "not readable from its home" in result.error
    assert result.binding is None
    # Both copies (the Referenced child and its ancestor) were cut to their session_meta.
    copied = list(iter_rollouts(target))
    assert len(copied) == 2
    assert all(len(p.read_bytes().splitlines()) == 1 for p in copied)


def test_a_child_never_started_can_be_forked_again_from_its_own_home(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """No app-server loads the child's home at fork time any more, so Codex has not indexed
    its inherited Turns there: the transient runtime that forks a never-started child loads
    its lineage first (as every start of a child does)."""
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    child_home = home_of(tmp_path, "child")
    first = driver.fork(fork_request(src, src.turns[:1], child_home))
    assert first.disposition is DeliveryDisposition.ACCEPTED, first.error
    assert first.child is not None
    child = CodexSession(
        "child",
        child_home,
        first.child.provider_session_id,
        src.version,
        src.turns[:1],
        dict(src.context),
    )
    second = make_driver().fork(fork_request(child, child.turns, home_of(tmp_path, "grand")))
    assert second.disposition is DeliveryDisposition.ACCEPTED, second.error
    assert second.child is not None and second.child.provider_turn_ids == tuple(src.turns[:1])


def test_readability_proof_app_server_loads_the_child_lineage_in_a_fresh_app_server(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """`readability_proof = "app_server"`: the generic driver's fallback proof, with Codex's
    lineage-load hook (a fresh app-server on the target home loads the Referenced ancestors
    before it lists the child's turns) — accepted, proven by one extra app-server."""
    driver = make_driver(readability_proof="app_server")
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    spawned = driver.spawns
    target = home_of(tmp_path, "child")
    result = driver.fork(fork_request(src, src.turns[:2], target))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None
    assert result.binding.receipt["readabilityProof"] == "app_server"
    assert driver.spawns == spawned + 1
