"""What removing `run/` again and again costs a live daemon in descriptors: its open descriptors
and its listening sockets in `run/`, after one removal and after N more, with one API client and
one subscriber connected since before the first and a new client after each (every request
answered). Counts, not timings (docs/design/connections.md, "Listeners a re-bind replaces").

`PYTHONPATH=. build/venv/bin/python -m bench.run_rebind_fds [N]` (default 20).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.support.daemon import DaemonProcess, wait_for
from transport.client import Client, EventSubscriber

_RESTORED = "was removed under the live daemon: made it again"
_SETTLE_S = 2.0
"""Past the 1 s a replaced listener is kept at least (`connections.REPLACED_GRACE_S`)."""


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _listeners_in(pid: int, run: Path) -> int:
    mine = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(int(link[len("socket:[") : -1]))
    count = 0
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            listening = len(fields) >= 8 and int(fields[3], 16) & 0x10000
            if listening and int(fields[6]) in mine and os.path.dirname(fields[7]) == str(run):
                count += 1
    return count


def main(removals: int) -> None:
    top = Path(tempfile.mkdtemp(prefix="ah-rebind-"))
    home = top / "home"
    run = home / "run"
    d = DaemonProcess(home).start()
    try:
        assert d.proc is not None
        pid = d.proc.pid
        old = d.client()
        sub = EventSubscriber(d.events)
        wait_for(lambda: old.call("host.status", {})["connections"]["open"] >= 2)

        def remove() -> None:
            done = d.tail_log(10**7).count(_RESTORED)
            shutil.rmtree(run)
            wait_for(lambda: d.tail_log(10**7).count(_RESTORED) > done)
            with Client(d.api, timeout=30) as fresh:
                fresh.call("host.status", {})
            old.call("host.status", {})

        remove()
        time.sleep(_SETTLE_S)
        fds, listeners = _open_fds(pid), _listeners_in(pid, run)
        for _ in range(removals):
            remove()
        time.sleep(_SETTLE_S)
        after_fds, after_listeners = _open_fds(pid), _listeners_in(pid, run)
        shed = old.call("host.status", {})["connections"]["shed"]
        print(
            f"removals {removals}: descriptors {fds} -> {after_fds} ({after_fds - fds:+d}), "
            f"listeners in run/ {listeners} -> {after_listeners}, connections shed {shed}"
        )
        sub.close()
    finally:
        d.stop()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if sys.argv[1:] else 20)
