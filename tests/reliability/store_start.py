"""A cell of the crash soak's end (the clients parked): the store at start, on a full disk, in
two variants. In each, a fork of a Tutti Agent Session of the cell's own reaches
`provider_accepted` and the daemon is SIGKILLed before its commit (`host.fork.before_commit`
`once:kill`), so its next start must commit it (start-up recovery); the store's write-ahead
log is left holding 256 KiB of frames no checkpoint copied, with nothing behind them, as a
killed build leaves it (`_left_by_a_killed_build`), and the daemon starts with the disk full
but for one page of that log (`RLIMIT_FSIZE` of the log's size + a page and a half; its log a
file of its own): nothing of a start writes the log before its first write transaction, which
needs two pages at least, so the disk is full in that transaction and nowhere before it:

- the migration's: the store is put back to the previous schema version as an older build
  left it (v27's trigger gone, the snapshots of the forks that ended without a child kept
  again, `user_version` one lower): the start fails at once, "opening the store failed" (the
  migration runs inside the store's opening);
- start-up recovery's commit of the leftover: the store at this version (nothing to migrate,
  no other leftover to settle): the start fails at once, "committing leftover fork operations
  failed".

Each start fails with no "deferred" retry, saying that the disk holding the store is full (or
failing), its log grown by less than two pages, and leaves the store as it was (its version,
the leftover `provider_accepted`). The next start, with room, upgrades it (no ended fork keeps
its snapshot) and commits every leftover: none dropped, its child runs a Turn. The soak's final
`assert_invariants` then judges the store with the rest (`store_schema` against a fresh store
of the new version, `snapshot_kept`, `child_iff_committed`)."""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import apsw

from storage.schema import SCHEMA_VERSION
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, wait_for
from tests.support.invariants import check_processes
from transport.client import ClientClosed, ClientTimeout

WAL_FRAME_HEADER = 24
"""Bytes before each page of a write-ahead log frame (SQLite's WAL format)."""
ENDED_TRIGGER = "fork_snapshots_of_ended"


def _statuses(home: Path, ops: list[str] | None) -> dict[str, str]:
    """Each of `ops`' status in the store (None: each `provider_accepted` operation's)."""
    db = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = db.execute("SELECT operation_id, status FROM fork_operations").fetchall()
    finally:
        db.close()
    if ops is None:
        return {str(op): str(st) for op, st in rows if st == "provider_accepted"}
    return {str(op): str(st) for op, st in rows if op in ops}


_BACK_A_VERSION = """
import os, sys
import apsw
db = apsw.Connection(sys.argv[1])
# The log checkpointed and emptied first: what follows is its only content, so the next write
# appends right after it (no stale frames of a longer log behind).
db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
db.execute("PRAGMA wal_autocheckpoint = 0")
# 256 KiB of frames (a table made, filled, then dropped): the log of an older build's last
# writes, never checkpointed (this process exits without closing the store).
db.execute("BEGIN IMMEDIATE")
db.execute("CREATE TABLE back_a_version_frames (b BLOB)")
db.execute("INSERT INTO back_a_version_frames VALUES (zeroblob(262144))")
db.execute("COMMIT")
db.execute("BEGIN IMMEDIATE")
db.execute("DROP TABLE back_a_version_frames")
given = 0
if sys.argv[2] == "back":
    db.execute("DROP TRIGGER " + sys.argv[3])
    kept = db.execute("SELECT snapshot_json FROM fork_snapshots LIMIT 1").fetchone()
    if kept is not None:
        db.execute(
            "INSERT INTO fork_snapshots (op_seq, snapshot_json)"
            " SELECT op_seq, ? FROM fork_operations WHERE stage = 0"
            " AND op_seq NOT IN (SELECT op_seq FROM fork_snapshots)",
            (kept[0],),
        )
        given = db.changes()
    db.execute("PRAGMA user_version = " + sys.argv[4])
db.execute("COMMIT")
print(given, flush=True)
os._exit(0)
"""


def _left_by_a_killed_build(path: Path, back: bool) -> int:
    """The store at `path` (no daemon on it) with a write-ahead log of 256 KiB of frames no
    checkpoint copied and nothing behind them, as a killed build leaves it (the next write
    appends after them); with `back`, as the previous schema version left it (v27's trigger
    dropped, each fork that ended without a child (`stage` 0) given a frozen snapshot again —
    what an older build kept — and `user_version` one lower). Returns how many snapshots were
    given back."""
    assert SCHEMA_VERSION == 27, "_left_by_a_killed_build undoes v27's migration only"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _BACK_A_VERSION,
            str(path),
            "back" if back else "same",
            ENDED_TRIGGER,
            str(SCHEMA_VERSION - 1),
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return int(done.stdout)


def _room_for_one_page(path: Path) -> int:
    """A file size limit that leaves the store's write-ahead log room for one more page and
    not two: the next write transaction (a migration, a commit: two pages at least) fails
    after its first, whatever came before it wrote nothing."""
    db = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        page = int(db.execute("PRAGMA page_size").fetchone()[0])
    finally:
        db.close()
    frame = WAL_FRAME_HEADER + page
    return Path(f"{path}-wal").stat().st_size + frame + frame // 2


def _ended_snapshots(path: Path) -> int:
    db = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = db.execute(
            "SELECT count(*) FROM fork_snapshots JOIN fork_operations USING (op_seq)"
            " WHERE stage = 0"
        ).fetchone()
        return int(row[0])
    finally:
        db.close()


def _version(path: Path) -> int:
    db = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = db.execute("PRAGMA user_version").fetchone()
        return int(row[0])
    finally:
        db.close()


def old_store_full_disk_start(w: Any) -> Counter[str]:
    """Both variants (see the module's words) on `w`'s daemon (a crash soak `World`), its
    clients parked; `w.daemon` is a new daemon on the upgraded store at the end."""
    ran: Counter[str] = Counter()
    ran.update(_full_disk_start(w, back=True))
    ran.update(_full_disk_start(w, back=False))
    return ran


def _leftover(w: Any) -> list[str]:
    """A fork of a new Session killed before its commit: its `provider_accepted` operation."""
    seed, home = w.seed, w.home
    c = w.daemon.client(timeout=60)
    sid = create_session(c, cwd=w.cwd)["agentSessionId"]
    turn = run_turn(c, sid, "to fork")
    assert turn["outcome"] == "completed", (seed, turn)
    # The daemon dies with the fork `provider_accepted`, its commit not made. (One leftover:
    # a fork's commit runs on the thread that delivers every worker's answers, so a second
    # fork's answer waits behind a `hang` there, never reaching `provider_accepted` itself.)
    c.call("debug.failpoints", {"points": {"host.fork.before_commit": "once:kill"}})
    with contextlib.suppress(ClientClosed, ClientTimeout):
        # Its answer would come with the commit: the daemon dies first (a short wait).
        w.daemon.client(timeout=3).call(
            "fork.create",
            {
                "workspaceId": WS,
                "agentSessionId": sid,
                "requestId": str(uuid.uuid4()),
                "targetAgentSessionId": str(uuid.uuid4()),
                "point": {"type": "throughTurn", "turnId": turn["turnId"]},
            },
        )
    with w.lock:
        assert w.daemon.proc is not None
        wait_for(lambda: w.daemon.proc.poll() is not None, timeout=60)
        w.daemon.kill()
    ops = list(_statuses(home, None))
    assert list(_statuses(home, ops).values()) == ["provider_accepted"], (seed, ops)
    return ops


def _full_disk_start(w: Any, *, back: bool) -> Counter[str]:
    """One variant: `back`, the full disk lands in the migration's commit; else in start-up
    recovery's commit of the leftover."""
    seed, home = w.seed, w.home
    store = home / "store.sqlite3"
    ops = _leftover(w)
    given = _left_by_a_killed_build(store, back)
    version = SCHEMA_VERSION - 1 if back else SCHEMA_VERSION
    limit = _room_for_one_page(store)
    log_before = Path(f"{store}-wal").stat().st_size

    def full() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    d = DaemonProcess(home, env=w.env, preexec_fn=full)
    d.log_path = home.parent / f"full-start-{'migration' if back else 'recovery'}.log"
    # The write that fails: the migration (inside the store's opening), or the leftover's.
    what = "opening the store failed" if back else "committing leftover fork operations failed"
    try:
        d.start(timeout=60)
        d.stop()
        raise AssertionError((seed, "a start on a full disk with leftovers to commit served"))
    except RuntimeError:
        code = d.wait_exit(10)
        said = d.log_path.read_text(errors="replace")
        assert code == 1 and "deferred" not in said, (seed, code, said[-3000:])
        assert "cannot start: " in said and str(store) in said and "full" in said, (seed, said)
        assert what in said, (seed, what, said[-3000:])
    left = check_processes(home, None)
    assert not left, (seed, "a process outlived the refused start", left)
    # The refused write got its first page into the log and no further: the disk was full
    # at that write, not before it (nothing else of the start writes the log).
    grew = Path(f"{store}-wal").stat().st_size
    assert log_before < grew <= limit, (seed, log_before, grew, limit)
    assert _version(store) == version, seed  # a refused upgrade left it as it was
    assert set(_statuses(home, ops).values()) == {"provider_accepted"}, seed
    with w.lock:
        w.daemon = DaemonProcess(home, env=w.env).start()
        w.generation += 1
    assert _version(store) == SCHEMA_VERSION, seed
    assert _ended_snapshots(store) == 0, (seed, "the upgrade kept an ended fork's snapshot")
    c = w.daemon.client(timeout=60)
    ended = wait_for(
        lambda: (s := _statuses(home, ops)) and set(s.values()) <= {"committed"} and s,
        timeout=60,
    )
    assert len(ended) == len(ops), (seed, ended)  # no leftover dropped
    for op in ops:
        got = c.call("fork.get", {"workspaceId": WS, "operationId": op})["operation"]
        assert got["status"] == "committed", (seed, got)
        spoke = run_turn(c, got["targetAgentSessionId"], "after the start with room")
        assert spoke["outcome"] == "completed", (seed, spoke)
    if back:
        return Counter({"old_store_full_start refused": 1, "ended_snapshots_given_back": given})
    return Counter({"full_start_at_recovery_commit refused": 1})
