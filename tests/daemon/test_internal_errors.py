"""Internal errors, through the real `agenthost serve` and a real worker process:
one builder (`domain.errors.internal_error`) makes every 500 `internal`; the client's message
names the failure's type and a reference id, never its text, and the log holds that reference
with the text and traceback."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from drivers.errors import WorkerError
from drivers.supervisor import WorkerSupervisor
from tests.support.daemon import WS, DaemonProcess, create_session
from transport.client import ApiError

pytestmark = pytest.mark.timeout(90)

REF = re.compile(r"\(ref ([0-9a-f]{8})\)")


def test_an_untyped_daemon_failure_is_a_500_with_a_reference_and_no_text(
    tmp_path: Path,
) -> None:
    daemon = DaemonProcess(tmp_path / "home").start()
    try:
        c = daemon.client()
        sid = create_session(c)["agentSessionId"]
        # A bare RuntimeError inside the Session's actor, after the delete committed.
        c.call("debug.failpoints", {"points": {"host.session.delete.after_commit": "once:bug"}})
        with pytest.raises(ApiError) as err:
            c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
        e = err.value
        assert (e.status, e.code, e.reason) == (500, "internal", "internal_error")
        assert "failpoint" not in e.message and "fired" not in e.message, e.message
        ref = REF.search(e.message)
        assert ref is not None and "RuntimeError" in e.message, e.message
        # The daemon keeps serving, the same Session's actor included.
        assert create_session(c)
        with pytest.raises(ApiError) as gone:
            c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
        assert gone.value.status == 404
    finally:
        daemon.stop()
    log = daemon.log_path.read_text(errors="replace")
    [line] = [ln for ln in log.splitlines() if f"[ref {ref.group(1)}]" in ln]
    assert "failpoint host.session.delete.after_commit fired" in line, line
    assert "Traceback" in log


def test_a_driver_bug_in_the_worker_answers_a_reference_not_its_text(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    supervisor = WorkerSupervisor(run_dir)
    try:
        with pytest.raises(WorkerError) as err:
            # `ms` must be an int: the worker's handler raises a bare ValueError on it.
            supervisor.request("tutti-agent", "debug.sleep", {"ms": "soon-ish"}, 15).result(20)
    finally:
        supervisor.close()
    error = err.value.error
    assert (error["code"], error["reason"]) == ("internal", "internal_error")
    assert "soon-ish" not in error["message"], error
    ref = REF.search(error["message"])
    assert ref is not None and "ValueError" in error["message"], error
    log = (run_dir / "worker-tutti-agent.log").read_text(errors="replace")
    assert f"[ref {ref.group(1)}]" in log and "soon-ish" in log, log


def _damage_table(store: Path, table: str) -> None:
    """Overwrite `table`'s root page with garbage, the WAL first copied into the file."""
    conn = sqlite3.connect(store)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
    finally:
        conn.close()
    with store.open("r+b") as f:
        f.seek((root - 1) * page)
        f.write(b"\xde\xad" * (page // 2))


def test_a_damaged_store_file_answers_store_corrupt_not_an_internal_error(
    tmp_path: Path,
) -> None:
    """SQLite's `database disk image is malformed` is a fact about the file, not a bug of
    ours: every request that meets it is told so (500 `store_corrupt`, not retryable, what to
    do), and the log says it in one line per request, not a traceback under a reference."""
    home = tmp_path / "home"
    daemon = DaemonProcess(home).start()
    sid = create_session(daemon.client())["agentSessionId"]
    daemon.stop()
    _damage_table(home / "store.sqlite3", "sessions")
    daemon = DaemonProcess(home).start()
    try:
        c = daemon.client()
        for method, params in (
            ("session.list", {"workspaceId": WS}),
            ("session.get", {"workspaceId": WS, "agentSessionId": sid}),
            ("session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": "t"}),
        ):
            with pytest.raises(ApiError) as caught:
                c.call(method, params)
            err = caught.value
            assert (err.status, err.code, err.reason) == (500, "internal", "store_corrupt"), err
            assert not err.retryable
            assert "database disk image is malformed" in err.message
            assert ".recover" in err.message and "(ref " not in err.message
    finally:
        daemon.stop()
    log = daemon.log_path.read_text()
    assert "the store file is damaged (SQLite: database disk image is malformed)" in log
    assert "internal error [ref" not in log and "Traceback" not in log


@pytest.mark.parametrize("damage", ["header", "schema"])
def test_a_start_on_a_damaged_store_file_names_it_and_says_how_to_recover(
    tmp_path: Path, damage: str
) -> None:
    """A store file SQLite cannot open as a database (its header overwritten) or whose schema
    page is damaged fails the start, as it must; the start said only `cannot start: file is
    not a database` (or `database disk image is malformed`), naming no file and no way out,
    where a running daemon tells each request which file is damaged and how to recover it.
    Now the start says the store's path, the damage and the recovery step."""
    home = tmp_path / "home"
    DaemonProcess(home).start().stop()
    store = home / "store.sqlite3"
    data = bytearray(store.read_bytes())
    if damage == "header":
        data[0:16] = b"not a database!!"
    else:
        data[100:4096] = bytes((i * 7 + 3) % 256 for i in range(3996))  # sqlite_master's page
    store.write_bytes(bytes(data))
    daemon = DaemonProcess(home)
    daemon.log_path = tmp_path / "damaged-start.log"
    with pytest.raises(RuntimeError):  # it exited before its ready line
        daemon.start(timeout=60)
    said = [line for line in daemon.log_path.read_text().splitlines() if "cannot start" in line]
    assert len(said) == 1, daemon.log_path.read_text()
    assert str(store) in said[0] and "is damaged" in said[0], said[0]
    assert ".recover" in said[0], said[0]
