"""A failed fsync of the store's log stops the daemon: a real `agenthost serve` whose WAL sync
fails as a disk's I/O error does (the `host.store.wal_sync` failpoint, `error`) answers that
write `store_sync_failed` (503, not retryable) and every later write the same, acknowledges
none, logs why, and exits 1 — after a failed fsync the kernel may have dropped the log's pages
while a later fsync on a new descriptor succeeds, so a write acknowledged after it could be
lost with it. Started again, the daemon serves from what its store holds."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import REPO, WS, create_session
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)


def _serve(home: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agenthost", "--home", str(home), "serve"],
        stdout=subprocess.PIPE,
        stderr=open(home / "daemon.log", "ab"),  # noqa: SIM115 - the child's for its life
        env=dict(os.environ, AGENTHOST_HOME=str(home), PYTHONPATH=str(REPO), **env),
    )
    assert proc.stdout is not None
    assert select.select([proc.stdout], [], [], 30)[0], "no ready line"
    return proc, str(json.loads(proc.stdout.readline())["api"])


def _rename(client: Client, sid: str, title: str) -> dict[str, object]:
    params = {"workspaceId": WS, "agentSessionId": sid, "title": title}
    return dict(client.call("session.updateTitle", params))


def test_a_failed_sync_of_the_store_refuses_every_later_write_and_stops_the_daemon(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    proc, api = _serve(home, AGENTHOST_ENABLE_FAILPOINTS="1")
    try:
        with Client(api, timeout=30) as client:
            sid = create_session(client)["agentSessionId"]
            _rename(client, sid, "durable")
            client.call("debug.failpoints", {"points": {"host.store.wal_sync": "once:error"}})
            with pytest.raises(ApiError) as failed:
                _rename(client, sid, "not known durable")
            assert failed.value.status == 503 and failed.value.reason == "store_sync_failed"
            assert not failed.value.retryable
            # The point fired once: this write's sync would succeed, and is refused all the
            # same (or the daemon is already gone).
            try:
                _rename(client, sid, "after the failure")
                raise AssertionError("a write after a failed sync was acknowledged")
            except ApiError as exc:
                assert exc.reason == "store_sync_failed"
            except TimeoutError:
                pass  # stopped before it answered: nothing acknowledged either
        assert proc.wait(30) == 1
        log = (home / "daemon.log").read_text()
        assert "the disk failed to sync the store's log" in log, log[-2000:]
        assert log.rstrip().endswith("stopped"), log[-500:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    again, api = _serve(home)  # started again: it serves from its store
    try:
        with Client(api, timeout=30) as client:
            got = client.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
            assert got["session"]["agentSessionId"] == sid
            _rename(client, sid, "written again")
    finally:
        again.terminate()
        assert again.wait(60) == 0
