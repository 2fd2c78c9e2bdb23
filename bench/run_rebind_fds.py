"""What removing `run/` again and again costs a live daemon in descriptors: its open descriptors
and its listening sockets in `run/`, after one removal and after N more, with one API client and
one subscriber connected since before the first and a new client after each (every request
answered). Counts, not timings (docs/design/connections.md, "Listeners a re-bind replaces").

`PYTHONPATH=. build/venv/bin/python -m bench.run_rebind_fds [N]` (default 20).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.support.daemon import DaemonProcess, wait_for
from tests.support.run_dir import listeners_in, open_fds, remove_run
from transport.client import Client, EventSubscriber

_SETTLE_S = 2.0
"""Past the 1 s a replaced listener is kept at least (`connections.REPLACED_GRACE_S`)."""


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
            remove_run(d, run)
            with Client(d.api, timeout=30) as fresh:
                fresh.call("host.status", {})
            old.call("host.status", {})

        remove()
        time.sleep(_SETTLE_S)
        fds, listeners = open_fds(pid), len(listeners_in(pid, run))
        for _ in range(removals):
            remove()
        time.sleep(_SETTLE_S)
        after_fds, after_listeners = open_fds(pid), len(listeners_in(pid, run))
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
