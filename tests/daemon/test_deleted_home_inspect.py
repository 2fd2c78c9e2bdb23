"""A deleted fork child's runtime folder and a `fork.resolve inspect` reading that child
(real daemon, real tutti-agent worker and app-servers): the inspection reads the child in its
own home through a transient app-server; an app-server started there makes its home at its
start (`TUTTI_AGENT_HOME`), so the delete's removal of the folder never runs beside it — it
waits for the inspection to answer — and an inspection after the delete starts nothing there
(the contention soak found an empty `tutti-agent-home` made again after the delete)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, wait_for
from tests.support.homes import runtime_home

pytestmark = pytest.mark.timeout(180)

DISCARD = "host.session.delete.discard"


def _inspect(d: DaemonProcess, op_id: str) -> dict[str, Any]:
    params = {"workspaceId": WS, "operationId": op_id, "action": "inspect"}
    return dict(d.client().call("fork.resolve", params | {"requestId": str(uuid.uuid4())}))


def _app_servers_in(home: Path) -> list[int]:
    """The tutti-agent app-servers (and their launch wrappers) whose home is `home`."""
    mark = f"TUTTI_AGENT_HOME={home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_deleted_childs_folder_goes_only_once_an_inspections_app_server_in_it_ended(
    daemon: DaemonProcess,
) -> None:
    """The inspection's transient app-server in the child's home is caught as it starts and
    stopped (SIGSTOP; as a loaded machine leaves a starting process unscheduled); the child
    is deleted meanwhile: the delete answers, its removal reaches its thread
    (`host.session.delete.discard` fired) and waits — the folder stays while the app-server
    runs in it. Before the mend it was moved away under it, and the app-server, let go, made
    its home again at its start: an empty `tutti-agent-home` of a deleted Session. Let go
    now, the inspection answers and the folder goes; a second inspection, after the delete,
    starts no app-server there and makes nothing again."""
    d = daemon
    c = d.client()
    sid, turns = three_turn_source(c)
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    child = op["targetAgentSessionId"]
    home = runtime_home(d.home, WS, child)
    folder = home.parent
    assert home.is_dir()

    c.call("debug.failpoints", {"points": {DISCARD: "once:sleep:1"}})
    discarding = d.home / "run" / "failpoints-host" / f"fired.{DISCARD}"
    answer: dict[str, Any] = {}
    stopped: list[int] = []

    def inspecting() -> threading.Thread:
        answer.clear()
        thread = threading.Thread(target=lambda: answer.update(_inspect(d, op["operationId"])))
        thread.start()
        return thread

    inspect = inspecting()
    try:
        deadline = time.monotonic() + 60
        while not stopped and time.monotonic() < deadline:
            for pid in _app_servers_in(home):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            if not stopped and not inspect.is_alive():
                inspect = inspecting()  # its app-server came and went between two looks
        assert stopped, "no app-server started in the child's home"
        assert c.call("session.delete", {"workspaceId": WS, "agentSessionId": child})["deleted"]
        wait_for(discarding.exists, 30)  # the removal's thread has begun
        # Before the mend the folder was moved away within milliseconds of this point;
        # watched for a while: it stays as long as the app-server runs in it.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert folder.exists(), "the folder was removed while an app-server ran in it"
            time.sleep(0.05)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        inspect.join(60)
    assert answer, "the inspection never answered"
    wait_for(lambda: not folder.exists(), 30)  # removed once the inspection has answered
    assert not _app_servers_in(home)

    again = _inspect(d, op["operationId"])
    assert again["operation"]["status"] == "committed", again
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))
