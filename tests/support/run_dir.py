"""A live process's descriptors and listening Unix sockets, and `run/` removed under a live
daemon: what the re-bind tests and `bench.run_rebind_fds` count (Linux: `/proc`)."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

from tests.support.daemon import DaemonProcess, create_session, wait_for
from transport.client import Client, EventSubscriber

RESTORED = "was removed under the live daemon: made it again"
"""The daemon's log line once it has made `run/` again."""


def open_fds(pid: int) -> int:
    """How many descriptors `pid` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def socket_inodes(pid: int) -> set[int]:
    """The inodes of `pid`'s open sockets."""
    out = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            out.add(int(link[len("socket:[") : -1]))
    return out


def listeners_in(pid: int, directory: Path | str) -> list[str]:
    """The bound addresses of `pid`'s listening Unix sockets directly in `directory`, sorted. A
    listener whose file was removed keeps the address it was bound to; one bound at an alias of
    a path (`dir//api.sock`) is listed under that spelling."""
    mine = socket_inodes(pid)
    out = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            # Num RefCount Protocol Flags Type St Inode [Path]; Flags 00010000: listening.
            if len(fields) < 8 or int(fields[3], 16) & 0x10000 == 0:
                continue
            if int(fields[6]) in mine and os.path.dirname(fields[7]).rstrip("/") == str(directory):
                out.append(fields[7])
    return sorted(out)


def remove_run(d: DaemonProcess, run: Path) -> None:
    """Remove `run/` and wait until the daemon has made it again, to its last file (removing
    it while the daemon writes it only makes the daemon try again)."""
    done = d.tail_log(10**7).count(RESTORED)
    for _ in range(100):
        try:
            shutil.rmtree(run)
            break
        except OSError as exc:
            # The daemon's keeper saw the directory half-removed (its API socket gone) and
            # began making it again inside it: `rm -r` fails the same way; remove it again.
            if exc.errno != errno.ENOTEMPTY:
                raise
            time.sleep(0.02)
    else:
        raise AssertionError(f"{run} could not be removed: the daemon kept filling it")
    wait_for(
        lambda: (
            d.tail_log(10**7).count(RESTORED) > done
            and (run / "api.sock").exists()
            and (run / "events.sock").exists()
        )
    )


def hears_a_new_session(client: Client, sub: EventSubscriber) -> None:
    """Create a Session through `client` and wait until `sub` hears its `session.upserted`:
    an old subscriber still hears the daemon after its listener's file went."""
    sid = create_session(client)["agentSessionId"]
    while True:
        event = sub.next(10)
        assert event is not None, "the old subscriber heard nothing"
        if event["type"] == "session.upserted" and event["session"]["agentSessionId"] == sid:
            return
