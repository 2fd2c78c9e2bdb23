"""A Turn interrupted, or its Session deleted, while the Session's app-server is stopped
(SIGSTOP) as it starts — before it answers `initialize` or the Session's `thread/start` —
through the real daemon and a real tutti-agent app-server behind the relay
(`misbehaving_app_server`, modes `stop_init` / `stop_open`), with `provider_stopped_seconds` at
its default (30 s, the start's own request limit). The host asks the worker to stop that start
at once (`session.stop` with `startOnly`): the stopped server is killed, and neither the
Session's next Turn nor the delete's end of the runtime waits out the 30 s."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from domain.procfs import pid_exists
from tests.daemon.test_stopped_turn_start import (
    NEXT_TURN_STARTS_S,
    _stopped,
    _taken_pid,
    module_daemon,
    next_turn_runs_and_the_stopped_server_is_gone,
)
from tests.support.daemon import WS, DaemonProcess, create_session, submit, wait_for
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Path]]:
    yield from module_daemon(tmp_path_factory, "is", "")


@contextlib.contextmanager
def _stopped_start(daemon: tuple[DaemonProcess, Path], mode: str) -> Iterator[tuple[str, str, int]]:
    """A new Session's first Turn submitted with the relay armed `mode`: its Session id, its
    Turn's id and the relay's pid, once the relay stopped itself in the start; the relay is
    SIGKILLed at the end whatever happened."""
    d, arm = daemon
    arm.with_name(arm.name + ".taken").unlink(missing_ok=True)
    c = d.client()
    sid = create_session(c)["agentSessionId"]
    arm.write_text(mode)
    turn = submit(c, sid, "never started")
    pid = _taken_pid(arm)
    try:
        wait_for(lambda: _stopped(pid), 10)
        yield sid, turn["turnId"], pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_an_interrupt_while_the_app_server_is_stopped_as_it_starts_holds_no_next_turn(
    daemon: tuple[DaemonProcess, Path],
) -> None:
    """Interrupted while its `session.start` waits on the stopped server (`stop_open`): the
    Turn settles `interrupted` at once, and the next Turn is bound to its provider turn within
    `NEXT_TURN_STARTS_S`, not after the start's 30 s; the stopped server is gone."""
    d, _ = daemon
    c = d.client()
    with _stopped_start(daemon, "stop_open") as (sid, turn_id, pid):
        status, body = c.call_raw(
            "turn.interrupt",
            {"workspaceId": WS, "agentSessionId": sid, "turnId": turn_id},
            timeout=NEXT_TURN_STARTS_S,
        )
        assert status == 200, body
        assert body["turn"]["outcome"] == "interrupted", body
        next_turn_runs_and_the_stopped_server_is_gone(c, sid, pid)


def test_a_delete_while_the_app_server_is_stopped_as_it_starts_ends_it_at_once(
    daemon: tuple[DaemonProcess, Path],
) -> None:
    """Its Session deleted while the first Turn's `session.start` waits on the server stopped
    at `initialize` (`stop_init`; the Turn interrupted first, as an active Turn refuses the
    delete): answered at once, and the stopped server and the Session's runtime folder are
    gone within `NEXT_TURN_STARTS_S`, not after the start's 30 s (stopped_runtime_left)."""
    d, _ = daemon
    c = d.client()
    with _stopped_start(daemon, "stop_init") as (sid, turn_id, pid):
        params = {"workspaceId": WS, "agentSessionId": sid}
        c.call("turn.interrupt", params | {"turnId": turn_id}, timeout=NEXT_TURN_STARTS_S)
        assert c.call("session.delete", params, timeout=NEXT_TURN_STARTS_S) == {"deleted": True}
        folder = d.home / "runtimes" / WS / sid
        wait_for(lambda: not pid_exists(pid) and not folder.exists(), NEXT_TURN_STARTS_S)
    assert_invariants(d.home, probe_fence=False)
