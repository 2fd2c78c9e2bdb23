"""The supervisor's hung-worker judgement: a worker silent past the link's limit
is dead only when its process makes no CPU progress over a whole window, or once it has been
silent past `BUSY_SILENCE_LIMIT_S`; a silent worker that keeps running is busy (its heartbeat
thread starved: 200 app-servers starting at once, a C call holding the GIL) and is kept."""

from __future__ import annotations

from typing import NamedTuple

from drivers.worker_state import WorkerRecord
from transport.worker_link import SILENCE_LIMIT_S

BUSY_SILENCE_LIMIT_S = 60.0
"""A silent worker whose process keeps using CPU is busy, not hung (its heartbeat thread is
starved: 200 app-servers starting at once, a C call holding the GIL). It is killed only after
this much silence, or sooner once its CPU time stops advancing."""
CPU_WINDOW_S = 2.0  # no CPU progress for this long while silent: hung


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of `pid` in clock ticks, read from the kernel (the worker cannot block
    this); None when it cannot be read (not Linux, process gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


class Verdict(NamedTuple):
    dead: str | None
    """Why the worker is to be declared dead; None while it is kept."""
    busy: bool = False
    """A silent window in which it kept running was counted (`busy_silences` changed)."""


def judge(worker: WorkerRecord, now: float) -> Verdict:
    """One look at a ready worker: samples its CPU time while it talks (so a silence is judged
    against a recent sample) and judges it once it is silent. Updates the record's samples."""
    silent = now - worker.last_seen
    pid = worker.proc.pid if worker.proc is not None else None
    if silent <= SILENCE_LIMIT_S:
        if pid is not None and now - worker.cpu_sampled_at >= 1.0:
            worker.cpu_ticks, worker.cpu_sampled_at = cpu_ticks(pid), now
        return Verdict(None)
    if silent > BUSY_SILENCE_LIMIT_S:
        return Verdict(f"worker silent for {silent:.0f} s (busy limit)")
    if now - worker.cpu_sampled_at < CPU_WINDOW_S:
        return Verdict(None)  # judge over a whole window: a starved process runs in bursts
    ticks = cpu_ticks(pid) if pid is not None else None
    progressed = ticks is not None and worker.cpu_ticks is not None and ticks > worker.cpu_ticks
    worker.cpu_ticks, worker.cpu_sampled_at = ticks, now
    if progressed:
        worker.busy_silences += 1
        return Verdict(None, busy=True)
    return Verdict(f"worker silent for {silent:.0f} s and not running (hung)")
