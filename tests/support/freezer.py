"""A cgroup-v1 freezer group for tests of a provider that runs but answers nothing: frozen
processes are in `disk-sleep`, not stopped, so their process state gives nothing away and only
a liveness request can tell."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

FREEZER = Path("/sys/fs/cgroup/freezer")


@contextlib.contextmanager
def freezer_group() -> Iterator[Path]:
    """A cgroup-v1 freezer group of its own, thawed and removed at the end."""
    if not (FREEZER / "cgroup.procs").exists():
        pytest.skip("no cgroup-v1 freezer here: a running process cannot be frozen")
    group = FREEZER / f"agenthost-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a freezer group: {exc}")
    try:
        yield group
    finally:
        with contextlib.suppress(OSError):
            (group / "freezer.state").write_text("THAWED")
        for _ in range(100):  # its processes leave it as they die (killed while frozen)
            with contextlib.suppress(OSError):
                if not (group / "cgroup.procs").read_text().split():
                    break
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            group.rmdir()


def freeze(group: Path, pids: Iterable[int], timeout: float = 30.0) -> None:
    """Move `pids` into `group` and freeze it; returns once the group says FROZEN."""
    for pid in pids:
        (group / "cgroup.procs").write_text(str(pid))
    (group / "freezer.state").write_text("FROZEN")
    deadline = time.monotonic() + timeout
    while (group / "freezer.state").read_text().strip() != "FROZEN":
        assert time.monotonic() < deadline, f"{group} never froze"
        time.sleep(0.01)


def thaw(group: Path) -> None:
    """Let `group`'s processes run again (a SIGKILL sent while frozen then lands)."""
    (group / "freezer.state").write_text("THAWED")


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP `pid` and return once it is stopped (`kill` returns before the signal lands: a
    process still running may read its stdin meanwhile)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
        assert time.monotonic() < deadline, f"{pid} never stopped"
        time.sleep(0.005)


def release(group: Path | None, pids: Iterable[int]) -> None:
    """A test's clean-up: `group` thawed (if any) and every one of `pids` SIGKILLed."""
    if group is not None:
        with contextlib.suppress(OSError):
            thaw(group)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
