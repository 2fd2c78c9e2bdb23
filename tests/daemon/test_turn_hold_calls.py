"""What a Turn's writes run inside the store's writer baton, through the whole daemon: the
Session actor's settlement builds its checkpoint record (its JSON) before the batch holding
the baton applies it, and neither the settlement nor a Message's write walks a `Turn`'s fields
by `dataclasses.replace`, looks its outcome up through the enum's `__members__`, or runs a
generator over the Turn's Messages there (docs/performance.md, baton). Counted per hold
(`tests/storage/hold_calls.py`), never timed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.storage.hold_calls import hold_calls
from tests.support.daemon import create_session, run_turn, wait_for
from tests.support.in_process import in_process_daemon

pytestmark = pytest.mark.timeout(60)

WS = "ws-turn-hold-calls"

OFF_THE_BATON = (
    "session_turns.py:_checkpoint_json",
    "dataclasses.py:replace",
    "enum.py:__members__",
    "turns.py:<genexpr>",
)


def test_a_turns_writes_build_nothing_inside_the_baton_they_can_build_before(
    tmp_path: Path,
) -> None:
    with in_process_daemon(tmp_path / "home") as (daemon, client):
        store = daemon.store
        assert store is not None
        sid = create_session(client, WS)["agentSessionId"]
        run_turn(client, sid, "warm-up", WS)
        with hold_calls(store.db) as got:
            turns = [run_turn(client, sid, f"/stream say {uuid.uuid4().hex}", WS) for _ in range(3)]
            # A hold's calls are merged when its holder hands the baton on, which may come a
            # moment after the settled Turn's event (durable first): wait for the third, so the
            # block does not put the baton's methods back under it.
            wait_for(lambda: got.of("turns.py:_settle") >= 3, 10)
    assert [t["outcome"] for t in turns] == ["completed"] * 3
    assert got.of("turns.py:_settle") == 3, got.calls  # not vacuous: the settlements ran there
    assert {name: got.of(name) for name in OFF_THE_BATON} == dict.fromkeys(OFF_THE_BATON, 0)
