"""`bench.profile.by_mechanism`: each py-spy sample charged to one mechanism by its innermost
frame that names one, per process kind."""

from __future__ import annotations

import pytest

from bench.profile import by_mechanism

pytestmark = pytest.mark.timeout(30)

DAEMON = 'process 1:"python -m agenthost --home /h serve"'
WORKER = 'process 2:"python -m drivers.worker --provider tutti-agent --connect ipc:///w"'
SERVER = 'process 3:"python tutti-agent app-server"'


def test_a_sample_is_charged_to_its_innermost_named_mechanism() -> None:
    raw = "\n".join(
        [
            # a statement inside the saga's step is SQLite's, not the saga's
            f"{DAEMON};thread (0x1);ForkSaga._step (actors/fork_saga.py:10);"
            "Tx.execute (storage/sqlite.py:40) 3",
            # the saga's own code
            f"{DAEMON};thread (0x1);ForkSaga._step (actors/fork_saga.py:10) 2",
            # the baton's hand-off is the group commit's, though it lives in storage/sqlite.py
            f"{DAEMON};thread (0x2);Database.submit_write (storage/base.py:685);"
            "Baton.pass_on (storage/sqlite.py:395) 5",
            f"{DAEMON};thread (0x3);ApiServer._run (transport/server.py:9);"
            "packb (msgpack/__init__.py:36) 1",
            f"{WORKER};thread (0x4);RolloutBinder.begin (drivers/binder.py:1);"
            "fsync_dir (drivers/binder.py:2) 7",
            f"{WORKER};thread (0x4);RolloutBinder.begin (drivers/binder.py:1);"
            "Path.__new__ (pathlib.py:3) 1",
            # the app-server's own fsync_dir is its fork's, not the binder's
            f"{SERVER};thread (0x5);RolloutWriter.create (tutti_agent/rollout.py:1);"
            "fsync_dir (tutti_agent/rollout.py:2) 4",
            f"{SERVER};thread (0x5);somewhere (else.py:1) 1",
            "not a sample line",
        ]
    )
    split = by_mechanism(raw)
    assert dict(split["daemon"]) == {
        "SQLite statements": 3,
        "the fork saga": 2,
        "the group commit": 5,
        "msgpack": 1,
    }
    assert dict(split["worker"]) == {"the binder's syncs": 7, "dataclasses, uuid, enum, pathlib": 1}
    assert dict(split["app-server"]) == {"the app-server's fork": 4, "other": 1}
