"""A Codex fork makes the target home's directories of the source's copy while Codex forks:
the bind of a child that references its source always copies the source's rollout to the
same place below the target home, so that chain is created and made durable during the
provider's `thread/fork` (its answer is what the worker waits for), not after it. Shown with
the fork stopped right after the provider's answer: the chain is there, and no file in it.
Real Codex app-server, real worker driver; only the model is faked."""

from __future__ import annotations

from pathlib import Path

import pytest
from codex_helpers import MakeDriver, fork_request, open_session

from domain.enums import DeliveryDisposition
from drivers.codex.lineage import rollout_path
from tests.support.events import EventLog

pytestmark = pytest.mark.timeout(120)


def _files_below(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_codex_fork_makes_the_source_copys_directories_while_codex_forks(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver(failpoints={"worker.fork.after_provider_call": "error"})
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    source = rollout_path(src.home, src.thread_id)
    assert source is not None
    relative_dir = source.parent.relative_to(src.home)
    target = tmp_path / "runtimes" / "child" / "codex-home"

    stopped = driver.fork(fork_request(src, src.turns, target))

    assert stopped.disposition is DeliveryDisposition.UNKNOWN, stopped.error
    assert (target / relative_dir).is_dir()
    assert _files_below(target) == []  # nothing bound: only the directories


def test_codex_fork_into_directories_made_ahead_binds_both_rollouts_there(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    source = rollout_path(src.home, src.thread_id)
    assert source is not None
    target = tmp_path / "runtimes" / "child" / "codex-home"

    result = driver.fork(fork_request(src, src.turns, target))

    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None
    copy = target / source.relative_to(src.home)
    assert copy.read_bytes() == source.read_bytes()
    child = rollout_path(target, result.child.provider_session_id)
    assert child is not None and child.is_file()
