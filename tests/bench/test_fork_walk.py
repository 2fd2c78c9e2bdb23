"""`bench.fork_walk` names the files one fork.create runs in each process of the daemon's tree:
the daemon's saga and store, the worker's driver and binder, the provider's fork."""

from __future__ import annotations

import os

import pytest

from bench.fork_walk import walk


@pytest.mark.timeout(180)
def test_the_walk_of_one_fork_names_the_saga_the_store_the_worker_and_the_provider() -> None:
    before = dict(os.environ)
    result = walk()
    assert dict(os.environ) == before  # nothing of the walk leaks into later subprocesses
    by_process = result["byProcess"]
    assert isinstance(by_process, dict)
    assert "actors/fork_saga.py" in by_process["daemon"]
    assert "storage/fork_prepare.py" in by_process["daemon"]
    assert "drivers/worker.py" in by_process["worker"]
    assert "tutti_agent/fork.py" in by_process["app-server"]
    # Nothing of the client's or the walk's own code is counted as the daemon's.
    assert not [f for f in result["files"] if f.startswith(("tests/", "bench/"))]  # type: ignore[union-attr]
