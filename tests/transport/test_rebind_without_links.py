"""The re-bind's fallback, for a `run/` on which a hard link cannot be made
(`transport.endpoints.Binder.rebind`, docs/design/connections.md "Listeners a re-bind
replaces"): a real daemon whose kernel refuses it every `link`/`linkat` (a seccomp filter
installed in the daemon's process before it starts, inherited by its workers: the system calls
fail with EPERM, as on a file system without hard links). `run/` removed again and again under
it: each new listener is renamed into place instead, so the daemon serves at the usual paths,
an old client keeps being answered, and its descriptors and listeners stay bounded (before the
rename, the fallback bound at the path itself and kept every replaced listener: +3 listeners a
removal)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, wait_for
from tests.support.run_dir import hears_a_new_session, listeners_in, open_fds, remove_run
from tests.support.seccomp import ARCHES, LINKS, refusing
from transport.client import Client, EventSubscriber

pytestmark = pytest.mark.timeout(300)

REMOVALS = 12
FALLBACK = "cannot be hard-linked"
"""The daemon's WARNING when it takes the fallback (the spare name renamed into place)."""
LAST_RESORT = "cannot be linked or renamed"
"""Its WARNING when the rename is refused too (bound at an alias of the path)."""

refuse_links = refusing(*LINKS)
"""In the daemon's process, before exec: every later `link`/`linkat` fails with EPERM."""


def _linked_by_child(tmp_path: Path) -> str:
    """What a `link` in a process started with the filter does: the filter's own proof."""
    (tmp_path / "a").write_text("x")
    code = f"import os; os.link({str(tmp_path / 'a')!r}, {str(tmp_path / 'b')!r})"
    out = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=refuse_links,
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stderr.strip().splitlines()[-1] if out.returncode else "linked"


def _status(c: Client) -> None:
    assert c.call("host.status", {})["uptimeMs"] >= 0


def test_the_filter_refuses_a_hard_link(tmp_path: Path) -> None:
    assert platform.machine() in ARCHES, platform.machine()
    assert _linked_by_child(tmp_path) == "PermissionError: [Errno 1] Operation not permitted: " + (
        f"{str(tmp_path / 'a')!r} -> {str(tmp_path / 'b')!r}"
    )
    os.link(tmp_path / "a", tmp_path / "c")  # this process is not filtered


def test_rebind_without_hard_links_serves_at_the_usual_path_with_bounded_descriptors(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    run = home / "run"
    d = DaemonProcess(home, preexec_fn=refuse_links).start()
    try:
        assert d.proc is not None
        pid = d.proc.pid
        old = d.client()  # connected through the first listener, for the whole test
        _status(old)
        sub = EventSubscriber(d.events)
        try:
            wait_for(lambda: old.call("host.status", {})["connections"]["open"] >= 2)
            first = listeners_in(pid, run)
            remove_run(d, run)
            assert FALLBACK in d.tail_log(10**7), d.tail_log()
            with Client(d.api, timeout=30) as fresh:
                _status(fresh)
            baseline = open_fds(pid)
            for _ in range(REMOVALS):
                remove_run(d, run)
                with Client(d.api, timeout=30) as fresh:  # at the usual path
                    _status(fresh)
                _status(old)  # through the first listener, its file long gone
            # Each re-bind took the rename (the kernel refused every link), none the last resort
            # (a `run/` removed while the daemon made it again is re-bound once more).
            log = d.tail_log(10**7)
            assert log.count(FALLBACK) >= 3 * (REMOVALS + 1), log.count(FALLBACK)
            assert LAST_RESORT not in log
            # The replaced listeners with no connection are closed: the current three and the
            # two the old clients are on, whatever the number of removals.
            wait_for(lambda: len(listeners_in(pid, run)) == len(first) + 2, timeout=20)
            fds = open_fds(pid)
            assert fds - baseline <= 6, (baseline, fds, listeners_in(pid, run))
            # The current listeners were renamed into place: each has an address of its own
            # (its spare name), the file at the usual path and no spare file left in `run/`.
            names = {os.path.basename(a) for a in listeners_in(pid, run)}
            assert {".api.", ".events."} <= {n[: n.rfind(".") + 1] for n in names}, names
            assert [n for n in os.listdir(run) if n.startswith(".")] == [], os.listdir(run)
            hears_a_new_session(old, sub)
        finally:
            sub.close()
    finally:
        d.stop()
