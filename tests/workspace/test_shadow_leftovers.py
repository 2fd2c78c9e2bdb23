"""What a kill leaves in the checkpoint store goes with the next sweep: a shadow repository is
made as a hidden `.init-` directory and renamed into place whole, so a process killed while
making one leaves that directory, which nothing reads. The sweep removes it — never one this
process is making now. Real git (behind a PATH wrapper that kills its caller or waits at one
point), a real child process killed by SIGKILL, the real store and janitor."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from actors.checkpoints import CheckpointJanitor, DirectoryLocks
from tests.support.daemon import wait_for
from tests.support.git_wrappers import SUBCOMMAND
from workspace.shadow import INIT_PREFIX, Checkpoint, ShadowStore, Unavailable

pytestmark = pytest.mark.timeout(60)

_KILLING_GIT = (
    SUBCOMMAND
    + """\
# The real git; a `git init` makes its repository, then kills the process that ran it (as a
# daemon killed while it makes a shadow repository, before its rename into place).
if [ "$sub" = init ]; then
  "{real}" "$@"
  kill -9 "$PPID"
  exit 0
fi
exec "{real}" "$@"
"""
)

_WAITING_GIT = (
    SUBCOMMAND
    + """\
# The real git; a `git init` makes its repository, then says so in {reached} and waits for
# {go} (a creation still running when a sweep comes).
if [ "$sub" = init ]; then
  "{real}" "$@" || exit $?
  : > "{reached}"
  i=0
  while [ ! -e "{go}" ] && [ "$i" -lt 400 ]; do sleep 0.1; i=$((i + 1)); done
  exit 0
fi
exec "{real}" "$@"
"""
)

_CHILD = """
import sys
from pathlib import Path
from workspace.shadow import ShadowStore
print(ShadowStore(Path(sys.argv[1])).capture(Path(sys.argv[2])))
"""


class _NoDeletedSessions:
    """The janitor's store port with nothing deleted: its sweeps only tidy and collect."""

    @property
    def sessions(self) -> _NoDeletedSessions:
        return self

    @property
    def turns(self) -> Any:
        raise AssertionError("no size cap here")

    def deleted_sessions(self) -> list[tuple[str, str]]:
        return []


class _Inline(Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def _wrapper(tmp_path: Path, text: str, **names: Path) -> Path:
    real = shutil.which("git")
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "git"
    script.write_text(text.format(real=real, **names))
    script.chmod(0o755)
    return bin_dir


def _inits(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(INIT_PREFIX))


def _janitor(store: ShadowStore) -> CheckpointJanitor:
    return CheckpointJanitor(
        store, _NoDeletedSessions(), _Inline(), DirectoryLocks(), interval_s=3600.0
    )


def test_a_repository_creation_killed_midway_leaves_nothing_after_the_sweep(
    tmp_path: Path,
) -> None:
    """A process killed (SIGKILL) between its `git init` of a shadow repository and the
    rename into place left a whole bare repository under a hidden `.init-` name: never read,
    never removed — one such directory per kill for good. The sweep removes it (and one an
    older build left, whose name has no pid), and the folder's capture is as ever."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    root = tmp_path / "home" / "checkpoints"
    bin_dir = _wrapper(tmp_path, _KILLING_GIT)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), str(work)],
        env=env,
        capture_output=True,
        timeout=30,
    )
    assert child.returncode == -9, child
    left = _inits(root)
    assert len(left) == 1 and (root / left[0] / "HEAD").is_file(), left
    (root / f"{INIT_PREFIX}0123456789abcdef").mkdir()  # an older build's name: no pid
    store = ShadowStore(root)
    assert store.workdirs() == []
    _janitor(store).sweep()
    assert _inits(root) == []
    cp = store.capture(work)
    assert isinstance(cp, Checkpoint), cp
    assert store.workdirs() == [Path(os.path.realpath(work))]


def test_a_sweep_never_removes_a_repository_this_process_is_making(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep while a capture makes its folder's shadow repository (its `git init` done, the
    rename into place not yet) keeps that `.init-` directory: the capture finishes whole."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a\n")
    reached, go = tmp_path / "reached", tmp_path / "go"
    bin_dir = _wrapper(tmp_path, _WAITING_GIT, reached=reached, go=go)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "home" / "checkpoints"
    store = ShadowStore(root, timeout_s=45.0)
    answer: list[Checkpoint | Unavailable | BaseException] = []

    def capture() -> None:
        try:
            answer.append(store.capture(work))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            answer.append(exc)

    thread = threading.Thread(target=capture)
    thread.start()
    try:
        wait_for(reached.exists, timeout=30.0)
        making = _inits(root)
        assert len(making) == 1, making
        _janitor(ShadowStore(root)).sweep()  # another store of the process: the same rule
        assert _inits(root) == making
    finally:
        go.touch()
        thread.join(30)
    assert len(answer) == 1 and isinstance(answer[0], Checkpoint), answer
    assert _inits(root) == []
    assert store.workdirs() == [Path(os.path.realpath(work))]
