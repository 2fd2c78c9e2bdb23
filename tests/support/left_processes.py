"""A tool's process a provider started and did not take with it, as a test makes one beside a
real runtime (`left_behind`), and whether a process has ended (`ended`), as the stopped
runtime's law counts it (domain.procfs `alive_in_stat`)."""

from __future__ import annotations

import contextlib
import os
import subprocess

from domain.procfs import alive_in_stat, read_proc_stat
from drivers.runtime_marker import RUNTIME_VAR


def environ_of(pid: int) -> dict[bytes, bytes]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        items = fh.read().split(b"\0")
    return dict(item.split(b"=", 1) for item in items if b"=" in item)


def marker_of(pid: int) -> str:
    """The runtime marker (`RUNTIME_VAR`) in the environment of `pid`."""
    return environ_of(pid)[os.fsencode(RUNTIME_VAR)].decode()


def left_behind(pid: int) -> subprocess.Popen[bytes]:
    """`sleep 300` with the environment of the provider process `pid` (its runtime's marker,
    its homes), in a session of its own: out of the provider's tree and process group, as a
    shell tool's `setsid … &` or a double fork leaves it — nothing but the marker ties it to
    its runtime."""
    return subprocess.Popen(["sleep", "300"], env=environ_of(pid), start_new_session=True)


def ended(pid: int) -> bool:
    """Gone, a zombie, exiting or SIGKILLed (a pending SIGKILL runs none of its code)."""
    try:
        return not alive_in_stat(read_proc_stat(pid))
    except OSError:
        return True


def reap(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill and reap what a test left behind, whatever its outcome (a test's `finally`)."""
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
