"""A Codex Session whose history is past the app-server's line bound (`MAX_LINE_BYTES`, 64
MiB) through the real pinned `codex app-server`: 70 Turns of 1 MiB prompts (the rollout holds
each twice: ~147 MB). Its resume asked for the thread's turns and Codex wrote them all as one
line past the bound: the worker killed the server and the Session could not start
(`provider_protocol_error`); its history was one `thread/read`, one such line. The resume now
asks for none (`excludeTurns`), and the history is listed with `thread/turns/list`, a page at
a time: every Turn, in order, each prompt whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from codex_helpers import (
    CodexSession,
    EventLog,
    MakeDriver,
    fork_request,
    home_of,
    open_session,
    start,
)

from domain.enums import DeliveryDisposition
from drivers.app_server.process import MAX_LINE_BYTES
from tutti_agent.ids import uuid7

pytestmark = [pytest.mark.codex, pytest.mark.timeout(300)]

TURNS = 70
PROMPT_CHARS = 1 << 20
SEED = "seed one"


def _prompt(n: int) -> str:
    return f"{n:04d} " + "p" * (PROMPT_CHARS - 5)


def _grow(rollout: Path, turns: int) -> list[str]:
    """Rewrite the one-Turn rollout Codex wrote as `turns` Turns of it, each with a new turn
    id and the prompt `_prompt(n)` for the seed's text (the thread's first lines once), the
    ordinals renumbered. The new Turns' ids, in order."""
    lines = rollout.read_text().splitlines()
    head, body = lines[0], lines[1:]
    seed_turn = json.loads(body[0])["payload"]["turn_id"]
    once = ('"role":"developer"', "<environment_context>", '"type":"world_state"')
    out, ids = [head], []
    for n in range(turns):
        turn_id = uuid7()
        ids.append(turn_id)
        for line in body:
            if n and any(mark in line for mark in once):
                continue
            line = line.replace(seed_turn, turn_id).replace(
                json.dumps(SEED), json.dumps(_prompt(n))
            )
            record = json.loads(line)
            record["ordinal"] = len(out)
            out.append(json.dumps(record, separators=(",", ":")))
    rollout.write_text("\n".join(out) + "\n")
    return ids


def test_a_history_past_the_app_server_line_bound_starts_and_is_read_whole(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    first = make_driver()
    session = open_session(first, log, tmp_path, "src", (SEED,))
    first.close()
    [rollout] = session.home.rglob("rollout-*.jsonl")
    ids = _grow(rollout, TURNS)
    assert rollout.stat().st_size > MAX_LINE_BYTES
    for cache in session.home.glob("*.sqlite*"):
        cache.unlink()  # Codex lists the Turns it indexes as it loads the thread again

    driver = make_driver()
    start(driver, tmp_path, "src", thread_id=session.thread_id)
    history = driver.history({"agentSessionId": "src"})["turns"]
    assert [t["providerTurnId"] for t in history] == ids
    assert [t["status"] for t in history] == ["completed"] * TURNS
    assert [t["userText"] for t in history] == [_prompt(n) for n in range(TURNS)]


def test_a_source_past_the_app_server_line_bound_is_forked(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """The fork reads its source's Turns as the history does, a page at a time: one
    `thread/read` of them all was one line past the bound (the server killed, the fork
    `not_started` "source thread unreadable"). The fork through the last Turn is accepted,
    its child holding every Turn."""
    first = make_driver()
    session = open_session(first, log, tmp_path, "src", (SEED,))
    first.close()
    [rollout] = session.home.rglob("rollout-*.jsonl")
    ids = _grow(rollout, TURNS)
    assert rollout.stat().st_size > MAX_LINE_BYTES
    for cache in session.home.glob("*.sqlite*"):
        cache.unlink()

    driver = make_driver()
    started = start(driver, tmp_path, "src", thread_id=session.thread_id)
    source = CodexSession(
        "src",
        session.home,
        session.thread_id,
        started["runtimeContext"]["driverVersion"],
        ids,
        dict(started["runtimeContext"]),
    )
    result = driver.fork(fork_request(source, ids, home_of(tmp_path, "child")))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and list(result.child.provider_turn_ids) == ids
