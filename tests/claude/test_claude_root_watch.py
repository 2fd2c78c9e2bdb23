"""The watch for a Claude Turn's root user message in its transcript (`watch_root`): a real
transcript file appended to while the watch runs on a real asyncio loop; only the CLI is
absent (the lines are the ones it writes)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from domain.turn_events import TurnStarted
from drivers.claude.checkpoints import watch_root
from drivers.claude.state import SessionState, TurnState
from drivers.claude_transcript import decode_binding


def _session(tmp_path: Path) -> SessionState:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return SessionState(
        agent_session_id="s1",
        provider_session_id=str(uuid.uuid4()),
        config_dir=tmp_path / "home",
        private_home=tmp_path / "private",
        cwd=str(cwd),
        model=None,
        claude_settings=None,
        env={},
    )


def _user(text: str, message_uuid: str) -> str:
    entry = {
        "type": "user",
        "uuid": message_uuid,
        "parentUuid": None,
        "message": {"role": "user", "content": text},
    }
    return json.dumps(entry) + "\n"


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def _turn(events: list[Any]) -> TurnState:
    return TurnState(turn_id="t1", emit=lambda _sid, event: events.append(event))


def test_the_root_written_after_the_turn_began_is_observed_and_an_older_one_is_not(
    tmp_path: Path,
) -> None:
    session = _session(tmp_path)
    old_root, root = str(uuid.uuid4()), str(uuid.uuid4())
    _append(session.transcript, _user("an earlier turn", old_root))
    events: list[Any] = []
    turn = _turn(events)
    turn.transcript_offset = session.transcript.stat().st_size

    async def run() -> None:
        answering = asyncio.Event()
        watcher = asyncio.ensure_future(watch_root(session, turn, answering))
        await asyncio.sleep(0.05)
        assert not watcher.done() and turn.provider_turn_id is None
        answering.set()
        # The CLI's bookkeeping line first (no message), then the prompt it persisted.
        _append(session.transcript, json.dumps({"type": "queue-operation"}) + "\n")
        await asyncio.sleep(0.05)
        assert not watcher.done() and turn.provider_turn_id is None
        _append(session.transcript, _user("this turn", root))
        await asyncio.wait_for(watcher, 10)

    asyncio.run(run())
    assert turn.provider_turn_id == root
    assert turn.started.result(timeout=0) == root
    # One worker event: the start carrying the Turn's first binding (the root).
    assert [type(e) for e in events] == [TurnStarted]
    assert events[0].provider_turn_id == root
    assert decode_binding(events[0].binding_json) == root


def test_the_watch_ends_when_the_echo_named_the_root_and_the_file_did_not_grow(
    tmp_path: Path,
) -> None:
    session = _session(tmp_path)
    events: list[Any] = []
    turn = _turn(events)

    async def run() -> None:
        answering = asyncio.Event()
        answering.set()
        watcher = asyncio.ensure_future(watch_root(session, turn, answering))
        await asyncio.sleep(0.05)
        assert not watcher.done()  # no transcript yet: still looking
        turn.provider_turn_id = "echoed"  # what `observe_root` sets from the CLI's echo
        await asyncio.wait_for(watcher, 10)

    asyncio.run(run())
    assert events == []  # the watch itself reported nothing
