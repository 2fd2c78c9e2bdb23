"""A daemon started on a store an older build wrote, where the upgrade (the schema's migration,
one transaction) meets a fault: a full disk fails the start at once with the typed message
that names the store and the full disk, the store stays at its old version, whole, and the next
start with space upgrades it and serves."""

from __future__ import annotations

import resource
import signal
import uuid
from pathlib import Path

import pytest

from storage.schema import SCHEMA_VERSION, user_version
from storage.sqlite import open_connection
from tests.support.daemon import WS, DaemonProcess, run_turn
from tests.support.invariants import assert_invariants
from tests.support.old_store import v24_store

pytestmark = pytest.mark.timeout(120)


def _version(path: Path) -> int:
    conn = open_connection(str(path))
    try:
        return user_version(conn)
    finally:
        conn.close()


def test_a_migration_on_a_full_disk_fails_the_start_typed_and_the_next_start_upgrades(
    tmp_path: Path,
) -> None:
    """The migration fails on a full disk (RLIMIT_FSIZE on the daemon: a write past 256 KiB of
    any file fails, EFBIG; the store opens, but v26's fill of 3,000 Sessions' real cwd needs
    more WAL than that) and SQLite rolls the whole transaction back itself. The migration then
    ran its own ROLLBACK, which raised "cannot rollback - no transaction is active" over the
    disk's error: the start said that, untyped, instead of naming the full disk."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    store = home / "store.sqlite3"
    work = tmp_path / "work"
    work.mkdir()
    link = tmp_path / "link"  # a cwd spelled otherwise than its real path: v26 fills it
    link.symlink_to(work, target_is_directory=True)
    sids = [str(uuid.UUID(int=n + 1)) for n in range(3000)]
    v24_store(store, WS, dict.fromkeys(sids, str(link)))
    store.chmod(0o600)

    def fsize() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))

    full = DaemonProcess(home, preexec_fn=fsize)
    full.log_path = tmp_path / "full-start.log"
    with pytest.raises(RuntimeError):  # it exited before its ready line
        full.start(timeout=60)
    assert full.wait_exit(10) not in (0, -signal.SIGKILL)
    log = full.log_path.read_text()
    said = [line for line in log.splitlines() if "cannot start" in line]
    assert len(said) == 1, log
    assert str(store) in said[0] and "full" in said[0], said[0]
    assert "rollback" not in said[0], said[0]
    assert _version(store) == 24  # nothing of the upgrade kept: the old store, whole

    # Space again: the next start upgrades the store and serves its old Session.
    d = DaemonProcess(home).start()
    try:
        assert _version(store) == SCHEMA_VERSION
        c = d.client(timeout=60)
        assert run_turn(c, sids[0], "after the upgrade")["outcome"] == "completed"
        assert_invariants(home)
    finally:
        d.stop()
