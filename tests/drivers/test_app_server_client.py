"""The JSON-RPC stdio client against the real `tutti-agent app-server`: matching, error answers,
and the three failure kinds a fork must tell apart (answered error / never sent / sent, fate
unknown)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from drv_helpers import TUTTI_BIN

from drivers.app_server import process
from drivers.app_server.process import (
    AppServerClosed,
    AppServerProcess,
    AppServerTimeout,
    JsonRpcError,
    pdeathsig_wrapper,
    private_env,
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AppServerProcess]:
    proc = AppServerProcess(
        [TUTTI_BIN, "app-server"], env=private_env(None, "TUTTI_AGENT_HOME", tmp_path / "home")
    )
    proc.start()
    proc.initialize("agenthost-test", "0")
    yield proc
    if proc.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
    proc.close(1.0)


@pytest.mark.timeout(30)
def test_provider_process_gets_a_private_home_and_tmpdir(tmp_path: Path) -> None:
    env = private_env({"PATH": "/bin"}, "TUTTI_AGENT_HOME", tmp_path / "h")
    assert env["TUTTI_AGENT_HOME"] == str(tmp_path / "h")
    assert env["HOME"].startswith(str(tmp_path / "h")) and env["TMPDIR"].startswith(
        env["TUTTI_AGENT_HOME"]
    )


@pytest.mark.timeout(30)
def test_concurrent_requests_are_matched_to_their_answers(server: AppServerProcess) -> None:
    futures = [server.request_async("thread/start", {"cwd": f"/w{i}"}) for i in range(8)]
    ids = [f.result(10)["thread"]["id"] for f in futures]
    assert len(set(ids)) == 8


@pytest.mark.timeout(30)
def test_error_answer_raises_json_rpc_error_with_code_and_message(
    server: AppServerProcess,
) -> None:
    with pytest.raises(JsonRpcError) as info:
        server.request("thread/read", {"threadId": "not-a-uuid"})
    assert info.value.code == -32600 and "invalid" in info.value.rpc_message.lower()


@pytest.mark.timeout(30)
def test_sent_request_to_a_silent_server_times_out(server: AppServerProcess) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    with pytest.raises(AppServerTimeout):
        server.request("thread/start", {}, timeout=0.3)


@pytest.mark.timeout(30)
def test_in_flight_request_fails_as_sent_when_the_server_dies(server: AppServerProcess) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)  # hold the answer back, then kill
    fut = server.request_async("thread/start", {})
    server.kill()
    with pytest.raises(AppServerClosed) as info:
        fut.result(10)
    assert info.value.sent is True
    assert not server.alive


@pytest.mark.timeout(30)
def test_request_after_close_provably_never_left(server: AppServerProcess) -> None:
    server.close()
    with pytest.raises(AppServerClosed) as info:
        server.request("thread/start", {})
    assert info.value.sent is False


@pytest.mark.timeout(60)
def test_spawning_an_app_server_costs_the_worker_no_copy_on_write_of_its_heap(
    tmp_path: Path,
) -> None:
    """The app-server is tied to its worker without a `preexec_fn`: CPython then spawns with
    `vfork()`, and the worker writes its heap afterwards without a fault per page (with
    `fork()` every page of a 64 MB heap written next is a copy-on-write fault)."""
    import resource

    heap = bytearray(64 << 20)  # touched now: its pages are the process's before the spawn
    heap[::4096] = b"\1" * len(heap[::4096])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    proc = AppServerProcess(
        [TUTTI_BIN, "app-server"], env=private_env(None, "TUTTI_AGENT_HOME", tmp_path / "home")
    )
    proc.start()
    heap[::4096] = b"\2" * len(heap[::4096])
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    try:
        proc.initialize("agenthost-test", "0")
    finally:
        proc.close(1.0)
    assert faults < 4000, f"{faults} page faults writing a 16,384-page heap after the spawn"


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv on this host")
def test_the_parent_death_wrapper_is_looked_up_once_however_many_threads_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's `warm_up` and its first runtime starts ask for the wrapper at once: one
    `setpriv --help` runs, the others wait for its answer. (Unlocked, each ran its own: a
    worker child that is no runtime, seen beside four app-servers under a bound of 4.)"""
    real_run = subprocess.run
    runs: list[object] = []

    def slow_run(*args: object, **kwargs: object) -> object:
        runs.append(args[0])
        time.sleep(0.2)  # a loaded machine's exec: every other thread asks meanwhile
        return real_run(*args, **kwargs)  # type: ignore[call-overload]

    process._find_pdeathsig_wrapper.cache_clear()
    monkeypatch.setattr(process.subprocess, "run", slow_run)
    answers: list[tuple[str, ...] | None] = []
    start = threading.Barrier(5)

    def ask() -> None:
        start.wait()
        answers.append(pdeathsig_wrapper())

    threads = [threading.Thread(target=ask) for _ in range(5)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        monkeypatch.undo()
        process._find_pdeathsig_wrapper.cache_clear()
    assert len(runs) == 1, runs
    assert len(answers) == 5 and len(set(answers)) == 1, answers


@pytest.mark.timeout(60)
def test_a_program_that_is_not_there_fails_to_start_as_it_always_has(tmp_path: Path) -> None:
    proc = AppServerProcess(
        [str(tmp_path / "no-such-app-server")],
        env=private_env(None, "TUTTI_AGENT_HOME", tmp_path / "home"),
    )
    with pytest.raises(AppServerClosed, match="cannot start") as err:
        proc.start()
    assert err.value.sent is False


_SLOW_EXIT = """
import os, sys, time
sys.stdin.buffer.read()          # until the client closes our stdin
os.close(1)                       # our stdout ends first ...
time.sleep(1.5)                   # ... while we still write our state on the way out
open(sys.argv[1], "w").write("saved")
"""


@pytest.mark.timeout(30)
def test_a_server_asked_to_close_that_ends_its_stdout_first_is_not_killed_as_broken(
    tmp_path: Path,
) -> None:
    """`close` asks the server to exit (its stdin's end); one that closes its stdout before it
    has written what it keeps (longer than the reader's grace for a broken server) exits by
    itself, its state written, never killed as a server that closed its stdout and runs on."""
    saved = tmp_path / "saved"
    proc = AppServerProcess(
        [sys.executable, "-c", _SLOW_EXIT, str(saved)],
        env=private_env(None, "TUTTI_AGENT_HOME", tmp_path / "home"),
    )
    proc.start()
    proc.close(5.0)
    assert saved.read_text() == "saved"
