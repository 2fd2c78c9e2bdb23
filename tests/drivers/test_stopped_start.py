"""An app-server stopped (SIGSTOP, SIGTSTP, a debugger) while it starts: its start gets no
answer, and the failure says it was stopped, typed `provider_stopped` as a Turn's stopped
provider is (not `provider_start_failed`, which reads as a broken program), and nothing of it
is left running or stopped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from domain.procfs import pid_exists
from drivers.app_server.runtimes import Runtimes
from drivers.errors import DriverError
from drivers.liveness import PROVIDER_STOPPED
from drivers.tutti_agent import TuttiAgentProvider
from tests.support.daemon import wait_for

pytestmark = pytest.mark.timeout(60)

TUTTI = str(Path(sys.executable).parent / "tutti-agent")


def _script(tmp_path: Path, name: str, body: str) -> str:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\necho $$ >> {tmp_path / 'pids'}\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("where", ["itself", "below"])
def test_an_app_server_stopped_while_it_starts_fails_its_start_as_stopped(
    tmp_path: Path, where: str
) -> None:
    if where == "itself":  # the app-server's own process stops before it reads a line
        command = _script(tmp_path, "front", f'kill -STOP $$\nexec {TUTTI} "$@"')
    else:  # a process under it stops (a front's child): the root runs, nothing answers
        inner = _script(tmp_path, "inner", f'kill -STOP $$\nexec {TUTTI} "$@"')
        command = _script(tmp_path, "front", f'{inner} "$@"')
    runtimes = Runtimes(TuttiAgentProvider({"command": [command]}), request_timeout=2.0)
    with pytest.raises(DriverError) as raised:
        runtimes.spawn(tmp_path / "home", None)
    assert raised.value.reason == PROVIDER_STOPPED, (raised.value.reason, str(raised.value))
    assert "was stopped" in str(raised.value) and "initialize: no answer" in str(raised.value)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert wait_for(lambda: not any(pid_exists(p) for p in pids), timeout=10)
