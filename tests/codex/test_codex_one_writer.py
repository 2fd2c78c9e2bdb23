"""One app-server of a Codex home at a time, through the daemon's socket (real daemon, real
codex worker, real `codex app-server`, the local ResponsesServer): a Turn whose runtime starts
while a transient app-server of the same home holds the Session's thread (a `fork.resolve
inspect` reading an `unknown` fork's child with no live runtime to read with) waits for that
transient to exit instead of failing `thread … already has an active writer`."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from codex_helpers import codex_pids

from tests.codex.test_codex_daemon import codex_home, codex_source
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import WS, DaemonProcess, settle, submit, turn_of, wait_for

pytestmark = [pytest.mark.codex, pytest.mark.timeout(180)]

POINT = "worker.resolve.transient_loaded"


def test_a_turn_started_while_a_transient_app_server_holds_its_home_waits_for_it(
    codex_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The inspection's transient app-server is held (`hang`) with the source thread loaded;
    the Turn submitted meanwhile starts no second app-server on that home (before the mend it
    did, and Codex refused it: the Turn failed `runtime preparation failed: cannot open thread
    …: thread … already has an active writer`). Let go, the inspection answers and the Turn
    completes on an app-server started once the transient exited."""
    d = codex_daemon
    c, c2 = d.client(), d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "once:error"}})
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "unknown", op
    home = codex_home(d, sid)
    for pid in codex_pids(home):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not codex_pids(home))

    c.call("debug.failpoints", {"points": {POINT: "once:hang"}})
    marker = next(d.home.rglob("failpoints-state")) / f"fired.{POINT}"
    answer: dict[str, Any] = {}
    params = {"workspaceId": WS, "operationId": op["operationId"], "action": "inspect"}
    inspect = threading.Thread(
        target=lambda: answer.update(
            c2.call("fork.resolve", params | {"requestId": str(uuid.uuid4())})
        )
    )
    inspect.start()
    try:
        wait_for(marker.exists, 60)  # the transient is up, the source thread loaded, held
        assert len(codex_pids(home)) == 1
        turn = submit(c, sid, "while inspected")
        # The Turn's start either waits (the mend) or spawns a second app-server of the home,
        # which Codex refuses; watched until one or the other shows (or the Turn settles).
        most = 1
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and most == 1:
            most = max(most, len(codex_pids(home)))
            if turn_of(c, sid, turn["turnId"])["phase"] == "settled":
                break
            time.sleep(0.05)
    finally:
        c.call("debug.failpoints", {"points": {POINT: "off"}})
        inspect.join(60)
    assert answer, "the inspection never answered"
    done = settle(c, sid, turn["turnId"], timeout=60)
    assert done["outcome"] == "completed", done
    assert done["messages"][-1]["text"] == "echo: while inspected"
    assert most == 1, "a second app-server started on a home a transient one held"
