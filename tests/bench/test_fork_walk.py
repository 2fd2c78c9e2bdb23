"""`bench.fork_walk` names the files one fork.create runs in each process of the daemon's tree:
the daemon's saga and store, the worker's driver and binder, the provider's fork; and counts
apart the host's own modules on the fork's path (a function ran for it, not only an import,
not also idle, the provider's app-server and the client left out)."""

from __future__ import annotations

import os

import pytest

from bench.fork_walk import walk


@pytest.fixture(scope="module")
def walked() -> dict[str, object]:
    before = dict(os.environ)
    result = walk()
    assert dict(os.environ) == before  # nothing of the walk leaks into later subprocesses
    return result


@pytest.mark.timeout(180)
def test_the_walk_of_one_fork_names_the_saga_the_store_the_worker_and_the_provider(
    walked: dict[str, object],
) -> None:
    result = walked
    by_process = result["byProcess"]
    assert isinstance(by_process, dict)
    assert "actors/fork_saga.py" in by_process["daemon"]
    assert "storage/fork_prepare.py" in by_process["daemon"]
    assert "drivers/worker.py" in by_process["worker"]
    assert "tutti_agent/fork.py" in by_process["app-server"]
    # Nothing of the client's or the walk's own code is counted as the daemon's.
    assert not [f for f in result["files"] if f.startswith(("tests/", "bench/"))]  # type: ignore[union-attr]


@pytest.mark.timeout(180)
def test_the_host_path_counts_only_the_hosts_modules_that_ran_for_the_fork(
    walked: dict[str, object],
) -> None:
    on_path = walked["onPath"]
    assert isinstance(on_path, dict)
    host = set(on_path["host"])
    assert {"actors/fork_saga.py", "storage/fork_commit.py", "drivers/binder.py"} <= host
    assert host == set(on_path["daemon"]) | set(on_path["worker"])
    # The provider's own fork and the client's send are listed apart, not in the host's path;
    # a file that also runs while idle, or whose module body only ran, is in no path.
    assert "tutti_agent/fork.py" in on_path["app-server"]
    assert "tutti_agent/fork.py" not in host
    assert "transport/client.py" not in host
    also_idle, imported = set(walked["alsoIdle"]), set(walked["importedOnly"])  # type: ignore[call-overload]
    assert not host & (also_idle | imported)
    assert len(host) < len(walked["files"])  # type: ignore[arg-type]
