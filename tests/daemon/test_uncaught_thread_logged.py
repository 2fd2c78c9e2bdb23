"""An exception no thread of the daemon caught goes through its log, never straight to stderr: a
real `agenthost serve -vv` whose stderr is a pipe nobody reads, each `session.delete` of which
raises in the thread that removes the Session's runtime dir (a `bug` failpoint at
`host.session.delete.discard`: a bare `RuntimeError`, as a programming error would), ends those
threads — Python's default `threading.excepthook` wrote the traceback to the full pipe and held
each one for good — and still answers; read again, the exception's text is in the log, a line of
its own format."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

import pytest

from tests.daemon.test_log_stream_unread import _serve_with_unread_stderr, fill_pipe
from tests.support.daemon import WS, create_session
from transport.client import Client

pytestmark = pytest.mark.timeout(180)

DELETES = 30


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _delete_new_session(client: Client) -> None:
    sid = create_session(client)["agentSessionId"]
    assert client.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})["deleted"]


def test_uncaught_thread_exceptions_are_logged_not_printed_to_an_unread_stderr(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    proc, ready = _serve_with_unread_stderr(home, AGENTHOST_ENABLE_FAILPOINTS="1")
    assert proc.stderr is not None
    err = proc.stderr.fileno()
    client = Client(str(ready["api"]), timeout=10)
    try:
        # Each delete's discard thread raises a bare RuntimeError, caught by nothing.
        client.call("debug.failpoints", {"points": {"host.session.delete.discard": "bug"}})
        sid = create_session(client)["agentSessionId"]
        fill_pipe(client, sid, err)
        _delete_new_session(client)  # any thread a first delete starts, then counted from
        time.sleep(1.0)
        before = _threads(proc.pid)
        for _ in range(DELETES):
            _delete_new_session(client)
        deadline = time.monotonic() + 20
        while _threads(proc.pid) > before + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        # Each raising thread ended: none waits on the pipe.
        assert _threads(proc.pid) <= before + 2, (before, _threads(proc.pid))
        assert client.call("host.status")["log"]["queued"] > 0  # the log still waits on it
        # Read again: the exception's text comes out as a log line (time, level, logger).
        seen = b""
        deadline = time.monotonic() + 30
        while b"RuntimeError: failpoint host.session.delete.discard fired" not in seen:
            assert time.monotonic() < deadline, "the exception never reached the log"
            _delete_new_session(client)
            while select.select([err], [], [], 0.2)[0]:
                seen += os.read(err, 1 << 16)
        text = seen.decode(errors="replace")
        assert "ERROR agenthost.uncaught: uncaught exception in thread agenthost-discard" in text
    finally:
        client.close()
        proc.terminate()
        while select.select([err], [], [], 1)[0] and os.read(err, 1 << 16):
            pass
        proc.wait(30)
