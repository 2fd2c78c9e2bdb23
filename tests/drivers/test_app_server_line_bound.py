"""The app-server reader's bounds on what a broken server writes: a line is read up to
`max_line` bytes (a line of exactly that many, newline included, is a line), and one past it
kills the server with `provider_protocol_error`, failing what waits on it; a stdout closed by a
server that runs on is the runtime's end too. Real subprocesses (a shell as the server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drivers.app_server.process import (
    PROVIDER_PROTOCOL_ERROR,
    AppServerClosed,
    AppServerProcess,
)
from tests.support.daemon import wait_for
from tests.support.freezer import running

pytestmark = pytest.mark.timeout(60)


def _server(script: str, tmp_path: Path, max_line: int) -> tuple[AppServerProcess, list[str]]:
    exits: list[str] = []
    proc = AppServerProcess(
        ["/bin/sh", "-c", script],
        env=dict(os.environ),
        cwd=str(tmp_path),
        on_exit=exits.append,
        max_line=max_line,
    )
    proc.start()
    return proc, exits


def test_a_line_past_the_bound_kills_the_server_and_fails_its_requests(tmp_path: Path) -> None:
    # One answer of exactly the bound (its newline included), then a line without end.
    pad = "x" * (1000 - len('{"id":1,"result":{"pad":""}}'))
    answer = '{"id":1,"result":{"pad":"' + pad + '"}}'
    assert len(answer) + 1 == 1001
    proc, exits = _server(
        f"read req; echo '{answer}'; read req; "
        "while :; do printf 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy'; done",
        tmp_path,
        max_line=1001,
    )
    try:
        assert proc.request("first", {}, timeout=10)["pad"] == pad
        with pytest.raises(AppServerClosed) as failed:
            proc.request("second", {}, timeout=30)
        assert PROVIDER_PROTOCOL_ERROR in str(failed.value)
        assert "a line longer than 1001 bytes" in str(failed.value)
        assert exits and exits[0].startswith(PROVIDER_PROTOCOL_ERROR)
        assert not proc.alive
        pid = proc.pid
        assert pid is not None
        wait_for(lambda: not running(pid), 10)
    finally:
        proc.close()


def test_a_server_that_closes_its_stdout_and_runs_on_is_killed(tmp_path: Path) -> None:
    proc, exits = _server("exec 1>&-; read req; sleep 60", tmp_path, max_line=1 << 20)
    try:
        with pytest.raises(AppServerClosed) as failed:
            proc.request("ping", {}, timeout=30)
        assert str(failed.value).startswith(f"ping: {PROVIDER_PROTOCOL_ERROR}: ")
        assert "closed its stdout but kept running" in str(failed.value)
        assert exits and not proc.alive
        pid = proc.pid
        assert pid is not None
        wait_for(lambda: not running(pid), 10)
    finally:
        proc.close()


def test_a_server_that_exits_is_closed_with_its_status_not_killed(tmp_path: Path) -> None:
    proc, exits = _server("read req; exit 3", tmp_path, max_line=1 << 20)
    try:
        with pytest.raises(AppServerClosed) as failed:
            proc.request("ping", {}, timeout=30)
        assert "app-server exited with status 3" in str(failed.value)
        assert exits == ["app-server exited with status 3"]
    finally:
        proc.close()
