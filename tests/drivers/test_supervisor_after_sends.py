"""`WorkerSupervisor.after_sends`: a call run on the loop's thread once it has handled what was
put in its mailbox before (a request sent first), so a caller's follow-up work (a Turn's claim
events, after its `turn.start`) runs beside the worker, not beside the send; refused once the
loop has ended, so the caller runs it itself and nothing is lost.

The worker is the scripted process on a real PAIR over real ipc
(`tests/support/scripted_worker.py`)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from drv_helpers import wait_until

from drivers.supervisor import WorkerSupervisor
from tests.support.scripted_worker import shim

P = "scripted"
pytestmark = pytest.mark.timeout(60)


def test_a_call_runs_on_the_loop_after_the_request_before_it_and_is_refused_once_closed(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sup = WorkerSupervisor(run, python=str(shim(tmp_path)))
    try:
        assert sup.request(P, "worker.ping", {}, 15).result(20) == {"method": "worker.ping"}
        seen: list[tuple[int, bool]] = []
        answer = sup.request(P, "worker.ping", {}, 15)
        assert sup.after_sends(lambda: seen.append((threading.get_ident(), answer.done())))
        assert wait_until(lambda: bool(seen), 10)
        assert seen[0][0] != threading.get_ident()  # the loop's thread, not the caller's
        assert answer.result(20) == {"method": "worker.ping"}
    finally:
        sup.close()
    assert not sup.after_sends(lambda: None)  # the loop has ended: the caller runs it
