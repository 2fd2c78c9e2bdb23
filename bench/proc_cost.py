"""What a daemon's process tree spends on a timed step, by process: CPU (user and system), page
faults (minor: memory touched afresh; major: pages the disk served) and disk bytes read; and what
this VM charges for one first-touch page fault (`fault_probe_us`).

Together they tell the months store's cold fork row apart: a cold page cache shows as major
faults and disk reads (the store and the 14.7 MB rollout are copied just before each run, so
their pages are the page cache's); a slow VM minute shows in the fault probe and in the
processes' system CPU (on this host a fresh page costs ~3 µs of system CPU, `bench.common`'s
CPU probe does not see it).
"""

from __future__ import annotations

import mmap
import resource
import time
from pathlib import Path

import psutil

PROCS = ("daemon", "worker", "app-server")
"""The processes of a fork, as `by_process` names them."""


def _faults(pid: int) -> tuple[int, int]:
    """(minor, major) page faults of `pid` so far, from `/proc/<pid>/stat` ((0, 0) if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    return int(fields[7]), int(fields[9])


def by_process(pid: int) -> dict[str, dict[str, float]]:
    """Counters so far of the daemon `pid` and each of its descendants, by a short name
    (`PROCS`, else "other"; one name's processes summed): `cpu` and `sys` seconds, `minflt`,
    `majflt`, `readMB` (`/proc/<pid>/io` read_bytes: what the disk served it)."""
    out: dict[str, dict[str, float]] = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            argv = proc.cmdline()
            read_mb = proc.io_counters().read_bytes / 1e6
        except psutil.Error:
            continue
        if proc.pid == pid:
            name = "daemon"
        elif "drivers.worker" in argv:
            name = "worker"
        elif any(a.endswith("tutti-agent") for a in argv):
            name = "app-server"
        else:
            name = "other"
        minflt, majflt = _faults(proc.pid)
        got = out.setdefault(name, dict.fromkeys(("cpu", "sys", "minflt", "majflt", "readMB"), 0.0))
        got["cpu"] += times.user + times.system
        got["sys"] += times.system
        got["minflt"] += minflt
        got["majflt"] += majflt
        got["readMB"] += read_mb
    return out


def spent(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """`after` − `before` per process and counter (a process started in between: all of it)."""
    return {
        name: {k: v - before.get(name, {}).get(k, 0.0) for k, v in counters.items()}
        for name, counters in after.items()
    }


def fault_probe_us(mb: int = 64) -> float:
    """Wall µs per first-touch page fault: `mb` of fresh anonymous memory written page by page
    (what a process growing its heap pays), the median of three rounds."""
    size, page = mb * 2**20, mmap.PAGESIZE
    got: list[float] = []
    for _ in range(3):
        m = mmap.mmap(-1, size)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        for off in range(0, size, page):
            m[off] = 1
        t1 = time.perf_counter()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        m.close()
        got.append((t1 - t0) * 1e6 / max(1, faults))
    return sorted(got)[1]


def machine_cpu() -> dict[str, float]:
    """The whole machine's CPU seconds so far, from `/proc/stat`: `busy` (user, nice, system,
    irq, softirq, every process's, the benchmark's own too) and `steal` (time the hypervisor ran
    something else while a vCPU wanted to run)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    hz = 100.0  # USER_HZ
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return {"busy": (user + nice + system + irq + softirq) / hz, "steal": steal / hz}
