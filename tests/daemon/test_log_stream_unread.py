"""The daemon's log never holds a request: a real `agenthost serve -vv` whose stderr is a pipe
nobody reads (a launcher that reads only the ready line from stdout; a terminal paused with
Ctrl-S) is driven past the pipe's 64 KiB of log lines and still answers `host.status` and
runs a Turn. The lines that found the log's queue full are dropped and counted
(`host.status` → `log.dropped`, an extension), and once the stream is read again the daemon
logs again."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import pytest

from tests.support.daemon import REPO, WS, create_session, settle, submit
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(180)

PIPE_FULL = 60 * 1024
"""A pipe of the default 64 KiB (16 pages) that holds this much is full, within a page: lines
written one by one do not pack its pages whole."""


def _unread_bytes(fd: int) -> int:
    """Bytes written to the pipe and not read (FIONREAD)."""
    out = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    return int.from_bytes(out, sys.byteorder)


def fill_pipe(client: Client, sid: str, err: int) -> None:
    """Requests until the log has filled the unread stderr pipe `err`: each request is a `-v`
    line and more `-vv` debug lines, on the request's thread."""
    for _ in range(5000):
        if _unread_bytes(err) >= PIPE_FULL:
            break
        client.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
    assert _unread_bytes(err) >= PIPE_FULL, "the log never filled its pipe"


def _serve_with_unread_stderr(
    home: Path, **extra_env: str
) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    home.mkdir(parents=True)
    work = home.parent / "work"
    work.mkdir()
    env = dict(os.environ, AGENTHOST_HOME=str(home), PYTHONPATH=str(REPO), **extra_env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost", "--home", str(home), "serve", "-vv"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # never read until the end
        env=env,
        cwd=work,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready, "no ready line"
    return proc, json.loads(proc.stdout.readline())


def test_a_daemon_whose_stderr_nobody_reads_still_answers_and_runs_turns(tmp_path: Path) -> None:
    proc, ready = _serve_with_unread_stderr(tmp_path / "home")
    assert proc.stderr is not None
    err = proc.stderr.fileno()
    client = Client(str(ready["api"]), timeout=10)
    try:
        sid = create_session(client)["agentSessionId"]
        fill_pipe(client, sid, err)
        for _ in range(50):  # and more lines than the log's queue holds: answered all along
            for _ in range(100):
                client.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
            if client.call("host.status")["log"]["dropped"] > 0:
                break
        status = client.call("host.status")
        assert status["log"]["dropped"] > 0, status["log"]
        assert status["log"]["queued"] >= status["log"]["capacity"], status["log"]
        turn = submit(client, sid, "hello")
        assert settle(client, sid, turn["turnId"])["outcome"] == "completed"
        dropped = client.call("host.status")["log"]["dropped"]
        # Read again: the lines queued meanwhile come out, and a new one after them.
        seen = b""
        deadline = time.monotonic() + 30
        probe = str(uuid.uuid4())  # no such Session: a 404, its `-v` line names it
        while f"session={probe}".encode() not in seen:
            assert time.monotonic() < deadline, "the log never wrote again"
            with pytest.raises(ApiError):
                client.call("session.get", {"workspaceId": WS, "agentSessionId": probe})
            while select.select([err], [], [], 0.1)[0]:
                seen += os.read(err, 1 << 16)
        assert client.call("host.status")["log"]["dropped"] >= dropped
    finally:
        client.close()
        proc.terminate()
        if proc.stderr is not None:
            while select.select([proc.stderr], [], [], 1)[0] and os.read(err, 1 << 16):
                pass
        proc.wait(30)


def test_a_daemon_whose_stderr_nobody_reads_stops_on_sigterm(tmp_path: Path) -> None:
    """A clean stop writes the queued lines for a bounded time, then exits: neither the log's
    writer, still waiting on the full pipe, nor the interpreter's exit (which takes every
    logging handler's lock and flushes stderr) waits for a reader that never comes."""
    proc, ready = _serve_with_unread_stderr(tmp_path / "home")
    assert proc.stderr is not None
    err = proc.stderr.fileno()
    client = Client(str(ready["api"]), timeout=10)
    try:
        sid = create_session(client)["agentSessionId"]
        fill_pipe(client, sid, err)
        for _ in range(100):
            client.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
        assert client.call("host.status")["log"]["queued"] > 0  # lines wait on the pipe
    finally:
        client.close()
    proc.terminate()
    try:
        assert proc.wait(30) == 0  # nothing read from its stderr meanwhile
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()
