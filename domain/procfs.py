"""`/proc/PID/stat`, read the one way both sides of the host need it: the host's check that a
warm runtime's process is alive (actors.session_runtime) and the worker supervisor's CPU
samples of a silent worker (drivers.supervisor). Standard library only."""

from __future__ import annotations

import os


def read_proc_stat(pid: int) -> bytes:
    """`/proc/PID/stat` in three system calls (open, one read, close): the kernel writes the
    whole line at the first read of a buffer this size (it is a few hundred bytes). `open()`
    would add six per call that nothing here needs — the buffered reader's `isatty` ioctl,
    two `lseek`s, two `fstat`s (and a second read for the end of file) — once per warm fork
    (docs/performance.md, "The daemon's system calls per warm fork")."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def stat_after_command(stat: bytes) -> list[bytes]:
    """The fields of a `/proc/PID/stat` line after its command (field 2, which may hold spaces
    and parentheses: it ends at the line's last `)`), from field 3 (the state) on."""
    return stat[stat.rindex(b")") + 2 :].split()
