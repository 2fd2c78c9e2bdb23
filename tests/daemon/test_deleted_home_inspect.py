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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, wait_for
from tests.support.homes import runtime_home
from transport.client import Client

pytestmark = pytest.mark.timeout(180)

DISCARD = "host.session.delete.discard"


def _inspect(d: DaemonProcess, op_id: str) -> dict[str, Any]:
    params = {"workspaceId": WS, "operationId": op_id, "action": "inspect"}
    return dict(d.client().call("fork.resolve", params | {"requestId": str(uuid.uuid4())}))


def _committed_child(d: DaemonProcess, c: Client) -> tuple[dict[str, Any], str, Path]:
    """A fork through the second Turn of a new three-Turn source, committed: its operation,
    its child's id and that child's provider home (there)."""
    sid, turns = three_turn_source(c)
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    child = str(op["targetAgentSessionId"])
    home = runtime_home(d.home, WS, child)
    assert home.is_dir()
    return op, child, home


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
    op, child, home = _committed_child(d, c)
    folder = home.parent

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


def _removal(d: DaemonProcess, sid: str) -> dict[str, Any]:
    """The Session's runtime folder's removal as `host.status` lists it, or {} when none."""
    removals = d.client().call("host.status").get("homeRemovals", [])
    found = [r for r in removals if (r["workspaceId"], r["agentSessionId"]) == (WS, sid)]
    return dict(found[0]) if found else {}


class _Keeper:
    """Stops (SIGSTOP) every app-server that starts in `home`, from its own thread, recording
    each pid once: a read that never ends, as on a loaded machine, for each call that starts
    one there."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.seen: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in _app_servers_in(self.home):
                with self._lock:
                    if pid in self.seen:
                        continue
                    self.seen.append(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)

    def pids(self) -> list[int]:
        with self._lock:
            return list(self.seen)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.fixture
def short_idle(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon whose Session actors are stopped after 0.2 s idle."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nidle_actor_seconds = 0.2\n")
    d = DaemonProcess(home).start()
    try:
        yield d
    finally:
        d.stop()


def test_a_removal_waits_for_the_calls_in_flight_not_for_later_ones(
    short_idle: DaemonProcess,
) -> None:
    """A deleted child's folder and a stream of inspections of the fork that made it: the
    removal waits for the inspection whose app-server runs in the folder at the delete
    (stopped here), and `host.status` lists that folder as waiting (`homeRemovals`); an
    inspection that comes while the removal waits is not let in ahead of it. Before, it was
    counted and sent, and once the first one ended it started its own app-server in the
    folder, which the removal then waited for in turn: a stream of slow reads (each stopped
    here as it starts) kept a deleted Session's folder for as long as it lasted. Now the
    folder goes as soon as the first inspection has answered, the later one is sent once it
    is gone, finds no home there and starts nothing in it; both are answered, though the
    source's actor is reaped after 0.2 s idle (a call held for a removal keeps it)."""
    d = short_idle
    c = d.client()
    op, child, home = _committed_child(d, c)
    folder = home.parent
    c.call("debug.failpoints", {"points": {DISCARD: "once:sleep:1"}})
    discarding = d.home / "run" / "failpoints-host" / f"fired.{DISCARD}"

    answers: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []

    def inspecting() -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.append(_inspect(d, op["operationId"])))
        thread.start()
        threads.append(thread)
        return thread

    keeper = _Keeper(home)
    try:
        first_inspection = inspecting()
        deadline = time.monotonic() + 60
        while not keeper.pids():  # the first inspection's app-server, stopped as it starts
            assert time.monotonic() < deadline, "no app-server started in the child's home"
            if not first_inspection.is_alive():
                # Its app-server came and went between two looks: another one.
                answers.clear()
                first_inspection = inspecting()
            time.sleep(0.05)
        assert c.call("session.delete", {"workspaceId": WS, "agentSessionId": child})["deleted"]
        wait_for(discarding.exists, 30)  # the removal's thread has begun
        waiting = wait_for(lambda: _removal(d, child), 30)  # asked for: it waits
        first = keeper.pids()  # the first inspection's app-server and its launch wrapper
        assert folder.exists()
        inspecting()  # comes while the removal waits
        # Past the source's actor: its worker call sent beside the first one, or held for
        # the removal.
        wait_for(lambda: (r := _removal(d, child)) and r["calls"] + r["held"] == 2, 30)
        for pid in first:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        wait_for(lambda: answers, 60)  # the first inspection answered
        # Gone within the stop's bound of that answer, not after the next read.
        deadline = time.monotonic() + 10
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        later = [pid for pid in keeper.pids() if pid not in first]
        assert not later, f"an inspection after the delete started app-servers {later} there"
        assert not folder.exists(), "the removal waited for a call that came after the delete"
    finally:
        keeper.close()
        for thread in threads:
            thread.join(60)
    assert len(answers) == 2, answers
    assert all(a["operation"]["status"] == "committed" for a in answers), answers
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))
    assert not _app_servers_in(home)
    # Listed while it waited: the one call in flight at the delete.
    assert waiting["calls"] == 1 and waiting["held"] == 0 and waiting["waitingMs"] >= 0, waiting
    assert _removal(d, child) == {}


def test_an_inspection_held_past_its_actors_idle_limit_is_answered(
    short_idle: DaemonProcess,
) -> None:
    """A `fork.resolve inspect` whose worker call outlasts the source actor's idle limit
    (`idle_actor_seconds` 0.2 s; the inspection's app-server in the child's home stopped 2 s)
    is answered. The actor counted a resolve's worker call in flight, or held for a removal,
    as no work: the idle reaper stopped it, the worker's answer found no actor and the
    inspection was never answered (its client timed out)."""
    d = short_idle
    c = d.client(timeout=60)
    sid, turns = three_turn_source(c)
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    child_home = runtime_home(d.home, WS, op["targetAgentSessionId"])
    answers: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def inspect() -> None:
        try:
            answers.append(_inspect(d, op["operationId"]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    keeper = _Keeper(child_home)
    try:
        thread = threading.Thread(target=inspect)
        thread.start()
        deadline = time.monotonic() + 60
        while not keeper.pids():
            assert time.monotonic() < deadline, "no app-server started in the child's home"
            if not thread.is_alive():  # came and went between two looks: another one
                answers.clear()
                thread = threading.Thread(target=inspect)
                thread.start()
            time.sleep(0.05)
        # Held ten times the idle limit (a span, not a wait on a condition): the reaper looks
        # at the actor meanwhile.
        time.sleep(2.0)
    finally:
        keeper.close()
    thread.join(90)
    assert not errors, errors
    (answer,) = answers
    assert answer["operation"]["status"] == "committed", answer
    assert answer["evidence"]["verdict"] == "adoptable", answer
