"""The home is ours alone, through the real `agenthost serve`: a home or `run/`
that another user owns, that others may write, or that is a symlink is refused with exit 2
naming the path and the reason, before anything is written and without chmod-ing anything;
an abstract-namespace ipc endpoint and an ipc endpoint in a directory not ours with mode 0700
are refused the same way. Needs root (to own files as `nobody`), like tests/reliability/
test_access.py."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, create_session
from transport.client import Client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def nobody() -> int:
    if os.geteuid() != 0:
        pytest.fail("these tests run as root (they make files owned by nobody)")
    return pwd.getpwnam("nobody").pw_uid


def serve(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A refused `serve`; one that starts instead is killed at the timeout (test fails)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTHOST_")}
    return subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", str(home), "serve", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def assert_refused(done: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.startswith("agenthost: cannot start: "), done.stderr
    for part in parts:
        assert part in done.stderr, (part, done.stderr)
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_home_owned_by_another_user_is_refused(tmp_path: Path, nobody: int) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chown(home, nobody, -1)
    done = serve(home)
    assert_refused(done, f"AGENTHOST_HOME {home} is owned by uid {nobody}, not by us")
    assert os.listdir(home) == [] and mode(home) == 0o755


@pytest.mark.parametrize("bad_mode", [0o777, 0o770, 0o757])
def test_a_home_others_may_write_is_refused(tmp_path: Path, bad_mode: int) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, bad_mode)
    done = serve(home)
    assert_refused(done, f"AGENTHOST_HOME {home} is writable by others (mode {bad_mode:04o})")
    assert os.listdir(home) == [] and mode(home) == bad_mode  # not "fixed" behind our back


def test_a_home_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    home = tmp_path / "home"
    home.symlink_to(real)
    done = serve(home)
    assert_refused(done, f"AGENTHOST_HOME {home} is a symlink")
    assert os.listdir(real) == []


def test_a_run_symlink_into_a_foreign_dir_is_refused_and_not_chmodded(
    tmp_path: Path, nobody: int
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chmod(foreign, 0o755)
    os.chown(foreign, nobody, -1)
    (home / "run").symlink_to(foreign)
    done = serve(home)
    assert_refused(done, f"run directory {home / 'run'} is a symlink")
    # Today the daemon follows the link and chmods the foreign directory to 0700.
    assert mode(foreign) == 0o755 and os.listdir(foreign) == []
    assert not (home / "store.sqlite3").exists()


def test_a_run_dir_owned_by_another_user_or_open_to_others_is_refused(
    tmp_path: Path, nobody: int
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    run = home / "run"
    run.mkdir(mode=0o700)
    os.chown(run, nobody, -1)
    assert_refused(serve(home), f"run directory {run} is owned by uid {nobody}, not by us")
    os.chown(run, os.geteuid(), -1)
    os.chmod(run, 0o755)
    assert_refused(serve(home), f"run directory {run} has mode 0755; it must be 0700")
    assert mode(run) == 0o755 and not (home / "store.sqlite3").exists()


def test_an_abstract_namespace_ipc_endpoint_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = serve(home, "--listen", f"ipc://@agenthost-{os.getpid()}")
    assert_refused(done, "abstract-namespace ipc endpoint has no file permissions")
    assert not (home / "store.sqlite3").exists()
    home.mkdir()
    (home / "agenthost.toml").write_text(f'[daemon]\nlisten = "ipc://@ah-{os.getpid()}"\n')
    assert_refused(serve(home), "abstract-namespace")


def test_an_ipc_endpoint_in_a_dir_not_ours_with_0700_is_refused(
    tmp_path: Path, nobody: int
) -> None:
    home = tmp_path / "home"
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, nobody, -1)
    done = serve(home, "--listen", f"ipc://{theirs}/api.sock")
    assert_refused(done, f"directory {theirs} is owned by uid {nobody}, not by us")
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    done = serve(home, "--listen", f"ipc://{loose}/api.sock")
    assert_refused(done, f"directory {loose} has mode 0755; it must be 0700")
    assert mode(loose) == 0o755 and not (home / "store.sqlite3").exists()


def test_an_ipc_endpoint_in_a_new_dir_is_created_0700_and_served(tmp_path: Path) -> None:
    sock_dir = tmp_path / "sockets"
    endpoint = f"ipc://{sock_dir}/extra.sock"
    d = DaemonProcess(tmp_path / "home", args=("--listen", endpoint)).start()
    try:
        assert mode(sock_dir) == 0o700
        c = Client(endpoint, timeout=30)
        try:
            assert create_session(c)["provider"] == "tutti-agent"
        finally:
            c.close()
    finally:
        d.stop()


@pytest.mark.parametrize("command", [["serve"], ["status"], ["keys", "list"]])
def test_an_empty_home_option_is_a_usage_error_not_the_current_directory(
    tmp_path: Path, command: list[str]
) -> None:
    """`--home "$DIR"` with DIR unset: the current directory would become the home (the store,
    `run/`, `runtimes/` written into it), unlike an empty AGENTHOST_HOME (the default home)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(mode=0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTHOST_")}
    done = subprocess.run(
        [sys.executable, "-m", "agenthost.cli", "--home", "", *command],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        cwd=cwd,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "argument --home: empty" in done.stderr and "Traceback" not in done.stderr
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "what"), [("runtimes", "runtimes directory"), ("checkpoints", "checkpoints directory")]
)
def test_a_data_dir_that_is_a_file_is_refused_not_failed_turn_by_turn(
    tmp_path: Path, name: str, what: str
) -> None:
    """`runtimes/` or `checkpoints/` a file (a mistaken copy, a restore): the daemon served,
    and every Turn failed `internal_error (NotADirectoryError)` (runtimes) or every checkpoint
    failed `File exists` while status said checkpoints were on."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / name).write_text("not a directory\n")
    done = serve(home)
    assert_refused(done, f"{what} {home / name} is not a directory")
    assert (home / name).read_text() == "not a directory\n"


@pytest.mark.parametrize("name", ["store.sqlite3", "store.sqlite3-wal", "store.sqlite3-shm"])
def test_a_store_file_sqlite_cannot_open_is_refused_not_called_busy(
    tmp_path: Path, name: str
) -> None:
    """A directory where the store (or its WAL, its shared memory) belongs: SQLite's
    `CantOpenError` was retried as a busy store for the start's whole limit, then reported
    `cannot start: the store is busy or full, try again`."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / name).mkdir()
    done = serve(home)
    assert_refused(done, f"the store file {home / name} is not a regular file; move it away")
    assert (home / name).is_dir() and "deferred" not in done.stdout
