"""`drivers.liveness` on real processes: a stopped process anywhere in a provider's tree is
seen (the root, or a child under a running parent, as Codex's native child under its
launcher), a continued one is not, and a killed tree is gone, stopped members included."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from drivers.liveness import TreeWatch, kill_tree, stopped_error

pytestmark = pytest.mark.timeout(30)

# A parent that starts one child and waits: the shape of `codex` (launcher over native child).
PARENT = (
    "import subprocess, sys; "
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(c.pid, flush=True); c.wait()"
)


@pytest.fixture
def tree() -> Iterator[tuple[int, int]]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        yield parent.pid, child
    finally:
        for pid in (child, parent.pid):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        parent.wait(10)


def _wait_state(pid: int, states: set[str]) -> None:
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() not in states:
        assert time.monotonic() < deadline, psutil.Process(pid).status()
        time.sleep(0.01)


def test_a_stopped_child_under_a_running_parent_is_seen_and_a_continued_one_is_not(
    tree: tuple[int, int],
) -> None:
    parent, child = tree
    watch = TreeWatch(parent)
    assert watch.stopped(0.0) is None
    psutil.Process(child).send_signal(signal.SIGSTOP)
    _wait_state(child, {psutil.STATUS_STOPPED})
    assert watch.stopped(1.0) == child
    assert "process state stopped" in stopped_error("codex", "app-server", parent, child, 1.0)
    psutil.Process(child).send_signal(signal.SIGCONT)
    _wait_state(child, {psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING})
    assert watch.stopped(2.0) is None


def test_the_root_is_checked_first_and_a_killed_tree_is_gone(tree: tuple[int, int]) -> None:
    parent, child = tree
    watch = TreeWatch(parent)
    for pid in (child, parent):
        psutil.Process(pid).send_signal(signal.SIGSTOP)
    _wait_state(parent, {psutil.STATUS_STOPPED})
    assert watch.stopped(0.0) == parent
    kill_tree(parent)
    gone, alive = psutil.wait_procs([psutil.Process(child)], timeout=10)
    assert not alive and gone
