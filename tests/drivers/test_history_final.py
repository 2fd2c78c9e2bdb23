"""A provider history is final only once nothing that may hold a start the reading worker never
got is alive (`drivers.history_final`), judged over real processes: the judge runs in a process
of its own (the reading worker), and the processes it must see — a process of the Session's
provider home, a real earlier worker of the same provider and daemon — are its siblings, as an
orphaned app-server and a dying worker would be. What the judge spawned itself, and a process
that has exited (a zombie), never keep a history from being final."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.failpoints import ENV_STATE_DIR
from drivers.worker_env import ENV_PARENT_PID

pytestmark = pytest.mark.timeout(60)

ROOT = str(Path(__file__).resolve().parents[2])
PROVIDER = "tutti-agent"


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, **extra}


def judge(home: Path, state: Path, *, own_child_env: dict[str, str] | None = None) -> bool:
    """`history_final` as a worker runs it: in a process of its own, with its state dir; with
    `own_child_env`, after it spawned a child of its own with that environment."""
    code = (
        "import subprocess, sys\n"
        "from drivers.history_final import history_final\n"
        f"env = {own_child_env!r}\n"
        "child = subprocess.Popen(['sleep', '30'], env=env) if env else None\n"
        f"print(history_final({PROVIDER!r}, {str(home)!r}))\n"
        "if child: child.kill(); child.wait()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(**{ENV_STATE_DIR: str(state)}),
        capture_output=True,
        check=True,
        timeout=30,
    )
    answer = out.stdout.decode().strip()
    assert answer in ("True", "False"), out
    return answer == "True"


def _sleeper(env: dict[str, str], procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sleep", "30"], env=env)
    procs.append(p)
    return p


def _worker(
    provider: str, state: Path, tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """A real worker process of `provider` with `state` as its failpoint state dir (its link
    connects lazily to an endpoint nobody binds: it idles until killed)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "drivers.worker", "--provider", provider, "--connect",
         f"ipc://{tmp}/nobody-{provider}.sock"],
        env=_env(**{ENV_STATE_DIR: str(state), ENV_PARENT_PID: str(os.getpid())}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    procs.append(p)
    deadline = time.monotonic() + 20
    while b"drivers.worker" not in Path(f"/proc/{p.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    return p


def _gone(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(10)


def test_a_process_of_the_home_outside_the_worker_keeps_the_history_open(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    home, state = tmp_path / "runtimes" / "s1" / "tutti-agent-home", tmp_path / "fp-state"
    assert judge(home, state)
    app_server = _sleeper(_env(TUTTI_AGENT_HOME=str(home)), spawned)
    assert not judge(home, state)
    _gone(app_server)
    assert judge(home, state)
    # A child of one (it inherits a path under the home) keeps it open too.
    tool = _sleeper(_env(TMPDIR=str(home / "tmp")), spawned)
    assert not judge(home, state)
    _gone(tool)
    # Another Session's home does not.
    _sleeper(_env(TUTTI_AGENT_HOME=str(tmp_path / "runtimes" / "s2" / "tutti-agent-home")), spawned)
    assert judge(home, state)


def test_an_exited_process_and_the_workers_own_children_leave_it_final(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    home, state = tmp_path / "tutti-agent-home", tmp_path / "fp-state"
    # Exited and not reaped (a zombie): its files are closed, every write it made is in them.
    zombie = subprocess.Popen(["true"], env=_env(TUTTI_AGENT_HOME=str(home)))
    spawned.append(zombie)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_bytes().split(b") ")[1][:1] != b"Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert judge(home, state)
    # The judging worker's own child of the home never got a start it did not receive.
    assert judge(home, state, own_child_env=_env(TUTTI_AGENT_HOME=str(home)))


def test_an_earlier_worker_of_the_provider_and_daemon_keeps_the_history_open(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    home, state = tmp_path / "tutti-agent-home", tmp_path / "fp-state"
    earlier = _worker(PROVIDER, state, tmp_path, spawned)
    assert not judge(home, state)
    _gone(earlier)
    assert judge(home, state)
    # Another provider's worker of the daemon, or this provider's of another daemon: final.
    _worker("codex", state, tmp_path, spawned)
    _worker(PROVIDER, tmp_path / "other-daemon-state", tmp_path, spawned)
    assert judge(home, state)


def test_a_process_of_the_home_already_killed_is_waited_for_a_moment(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A process of the home with a SIGKILL pending (as a Claude Code CLI parked by a killed
    worker is, by its parent-death signal) is on its way out but alive, and may still be in a
    write: the judge waits a bounded moment for it to be gone, then answers final (before, it
    answered not final, and the never-sent Turn was proven only at a later cold start). Held
    past the bound (frozen), or not exiting at all, it is not final, as before."""
    from tests.support.freezer import freeze, freezer_group, thaw

    home, state = tmp_path / "tutti-agent-home", tmp_path / "fp-state"
    with freezer_group() as group:
        dying = _sleeper(_env(TUTTI_AGENT_HOME=str(home)), spawned)
        freeze(group, [dying.pid])
        dying.send_signal(signal.SIGKILL)  # pending: the frozen process cannot take it yet
        assert not judge(home, state)  # held past the judge's bound: not final
        # Let go while the judge waits: it dies, and the judge answers final.
        thawing = threading.Timer(1.0, thaw, (group,))
        thawing.start()
        try:
            assert judge(home, state)
        finally:
            thawing.join()
        assert dying.wait(10) == -signal.SIGKILL
    live = _sleeper(_env(TUTTI_AGENT_HOME=str(home)), spawned)
    assert not judge(home, state)  # not exiting: not final at once, as before
    _gone(live)
    assert judge(home, state)
