"""A Codex Session's rollout cut back by hand to before a Turn the host bound and settled,
every line left whole (not torn), while its app-server runs and still shows that Turn from
memory: the worker finds the Turn's end missing from the home's files before it sends the
app-server anything — a fork through the Turn is `not_started`, no `thread/fork` sent and no
child made; a Turn naming it (`boundTurnId`) fails `provider_history_missing`, the model not
asked. A Turn the home's files hold is not refused: a fork child's start naming a Turn only
its copy of its ancestor's rollout holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from codex_helpers import (
    EventLog,
    MakeDriver,
    calls,
    fork_request,
    home_of,
    open_session,
    relayed,
)

from domain.enums import DeliveryDisposition
from domain.errors import ProviderNotCalled
from drivers.binder import iter_rollouts
from model_fakes.responses import ResponsesServer

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]


def cut_last_turn(rollout: Path) -> str:
    """Cut the rollout back to the line before its last Turn's `task_started` (a valid JSONL
    prefix); that Turn's id returned."""
    lines = rollout.read_bytes().split(b"\n")
    at = max(i for i, line in enumerate(lines) if b'"task_started"' in line)
    turn_id = str(json.loads(lines[at])["payload"]["turn_attribution"]["turn_id"])
    rollout.write_bytes(b"\n".join(lines[:at]) + b"\n")
    return turn_id


def test_a_cut_rollout_refuses_the_fork_and_the_turn_through_the_lost_turn_only(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, model: ResponsesServer
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("none", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one", "two", "three"))
    # A child of the whole rollout first: its home's copy of the source holds Turn two.
    kept = driver.fork(fork_request(src, src.turns[:2], home_of(tmp_path, "child")))
    assert kept.disposition is DeliveryDisposition.ACCEPTED, kept.error
    assert kept.child is not None
    (rollout,) = [p for p in iter_rollouts(src.home) if src.thread_id in p.name]
    assert cut_last_turn(rollout) == src.turns[2]
    cut = rollout.read_bytes()

    lost = driver.fork(fork_request(src, src.turns, home_of(tmp_path, "lost")))
    assert lost.disposition is DeliveryDisposition.NOT_STARTED, lost.error
    assert "provider_history_missing" in (lost.error or ""), lost.error
    assert src.turns[2] in (lost.error or "")
    assert len(calls(calls_log, "thread/fork")) == 1  # the first fork's only
    assert list(iter_rollouts(home_of(tmp_path, "lost"))) == []

    asked = len(model.requests)
    with pytest.raises(ProviderNotCalled, match="provider_history_missing") as refused:
        driver.start_turn(
            {
                "agentSessionId": src.name,
                "turnId": "T4",
                "text": "four",
                "boundHistory": True,
                "boundTurnId": src.turns[2],
            },
            log,
        )
    assert src.turns[2] in str(refused.value)
    assert len(model.requests) == asked
    assert rollout.read_bytes() == cut

    # The child's own start names its last Turn, which only its ancestor's copy holds.
    started = driver.start_session(
        {
            "agentSessionId": "child",
            "home": str(home_of(tmp_path, "child")),
            "cwd": str(tmp_path),
            "settings": {},
            "model": None,
            "providerSessionId": kept.child.provider_session_id,
            "runtimeContext": dict(src.context),
            "boundHistory": True,
            "boundTurnId": src.turns[1],
        }
    )
    assert started["providerSessionId"] == kept.child.provider_session_id
