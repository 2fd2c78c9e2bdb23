"""A Claude fork child's home made ahead (`drivers.claude.homes.SpareHomes`): the next fork
renames it into place and fsyncs only what it changes, counted by path and thread; a spare
holds no transcript, is never taken from disk, and is removed by the worker's close and by
the daemon's start-up sweep. No CLI: synthetic transcripts, the SDK's own `fork_session`."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from actors import runtime_dirs
from domain.worker_messages import ForkRequest
from drivers.claude import homes
from drivers.claude.fork import ClaudeFork
from drivers.claude_transcript import transcript_path
from drivers.failpoints import Failpoints
from tests.claude.test_claude_fork_reads import _source

pytestmark = [pytest.mark.claude, pytest.mark.timeout(60)]


def _into(request: ForkRequest, home: Path) -> ForkRequest:
    wire = request.to_wire()
    wire["target"]["home"] = str(home)
    return ForkRequest.from_wire(wire)


def _spares(runtimes: Path) -> list[Path]:
    return sorted(runtimes.glob(f"{homes.PREFIX}*"))


def test_a_fork_takes_the_home_made_after_the_one_before_and_fsyncs_only_what_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request, _, _ = _source(tmp_path)
    runtimes = tmp_path / "runtimes"
    runtimes.mkdir()
    forks = ClaudeFork(Failpoints(), threading.Lock())
    first = forks.fork(_into(request, runtimes / "s1" / "claude-config"))
    assert first.disposition.value == "accepted", first.error
    forks.after_answer()  # as the worker does once the answer has left
    forks.spares.drain()
    assert len(_spares(runtimes)) == homes.PER_KEY
    # Each spare's chain is the child directory's shape below the Session's, empty.
    for spare in _spares(runtimes):
        (project,) = (spare / "claude-config" / "projects").iterdir()
        assert list(project.iterdir()) == []

    me = threading.get_ident()
    synced: list[tuple[int, str]] = []
    made: list[tuple[int, str]] = []
    real_fsync, real_mkdir = os.fsync, os.mkdir

    def fsync(fd: int) -> None:
        synced.append((threading.get_ident(), os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def mkdir(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append((threading.get_ident(), os.fspath(path)))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "mkdir", mkdir)
    home = runtimes / "s2" / "claude-config"
    result = forks.fork(_into(request, home))
    forks.after_answer()
    forks.spares.drain()
    assert result.disposition.value == "accepted", result.error
    assert result.child is not None
    child = transcript_path(home, request.source.cwd, result.child.provider_session_id)
    written = Path(request.source.home) / "projects" / child.parent.name
    # On the fork's path: the child's file, its directory, the one new entry of the Session's
    # directory (the spare renamed onto it) and the source's directory — 4, not 7; no mkdir.
    on_path = sorted(p for i, p in synced if i == me)
    assert on_path == sorted(
        [str(written / child.name), str(child.parent), str(runtimes), str(written)]
    )
    assert [p for i, p in made if i == me] == []
    # The spare it took was replaced on the spares' thread, off the path.
    assert {i for i, _ in made} - {me} and all(homes.PREFIX in p for _, p in made)
    assert len(_spares(runtimes)) == homes.PER_KEY


def test_the_spare_a_fork_used_up_is_asked_for_only_after_its_answer_left(
    tmp_path: Path,
) -> None:
    """`fork()` returns with no spare asked for (its thread woken before the answer's send
    took the interpreter from it); the worker's `after_answer` on the same thread asks."""
    request, _, _ = _source(tmp_path)
    runtimes = tmp_path / "runtimes"
    runtimes.mkdir()
    forks = ClaudeFork(Failpoints(), threading.Lock())
    result = forks.fork(_into(request, runtimes / "s1" / "claude-config"))
    assert result.disposition.value == "accepted", result.error
    forks.spares.drain()
    assert forks.spares.ready() == 0 and _spares(runtimes) == []
    # Another thread's `after_answer` asks for nothing: the fork's answer is its thread's.
    other = threading.Thread(target=forks.after_answer)
    other.start()
    other.join()
    forks.spares.drain()
    assert forks.spares.ready() == 0
    forks.after_answer()
    forks.spares.drain()
    assert forks.spares.ready() == homes.PER_KEY
    forks.after_answer()  # once
    forks.spares.drain()
    assert forks.spares.ready() == homes.PER_KEY
    forks.spares.close()


def test_a_spare_holds_no_transcript_is_never_taken_from_disk_and_close_removes_it(
    tmp_path: Path,
) -> None:
    request, _, _ = _source(tmp_path)
    runtimes = tmp_path / "runtimes"
    runtimes.mkdir()
    # A spare a killed worker left: on disk, not in this worker's memory.
    left = runtimes / f"{homes.PREFIX}left" / "claude-config" / "projects"
    left.mkdir(parents=True)
    forks = ClaudeFork(Failpoints(), threading.Lock())
    for n in range(3):
        result = forks.fork(_into(request, runtimes / f"s{n}" / "claude-config"))
        assert result.disposition.value == "accepted", result.error
        forks.after_answer()
        forks.spares.drain()
    assert left.is_dir() and list(left.iterdir()) == []  # never taken
    assert sorted(p.name for p in runtimes.iterdir() if not p.name.startswith(".")) == [
        "s0",
        "s1",
        "s2",
    ]
    # Every transcript is a Session's, none in a spare.
    found = sorted(runtimes.glob("*/claude-config/projects/*/*.jsonl"))
    assert len(found) == 3 and not any(homes.PREFIX in str(p) for p in found)
    ours = [p for p in _spares(runtimes) if p.name != f"{homes.PREFIX}left"]
    assert len(ours) == homes.PER_KEY
    forks.spares.close()
    assert _spares(runtimes) == [runtimes / f"{homes.PREFIX}left"]  # only its own removed
    forks.spares.replenish(str(runtimes / "s9"), str(runtimes / "s9" / "claude-config"))
    forks.spares.drain()
    assert forks.spares.ready() == 0  # none made after close


def test_spares_are_bounded_and_an_evicted_one_is_removed(tmp_path: Path) -> None:
    spares = homes.SpareHomes()
    base = tmp_path / "runtimes"
    base.mkdir()
    for n in range(homes.TOTAL):  # TOTAL keys, PER_KEY each: the oldest keys evicted
        spares.replenish(str(base / "s"), str(base / "s" / "c" / "projects" / f"p{n}"))
        spares.drain()
    assert spares.ready() == homes.TOTAL
    assert len(_spares(base)) == homes.TOTAL
    spares.close()
    assert _spares(base) == []


def test_the_daemon_start_sweep_removes_spares_and_keeps_every_session_home(
    tmp_path: Path,
) -> None:
    assert runtime_dirs.SPARE_PREFIX == homes.PREFIX

    class NoDeleted:
        class sessions:  # noqa: N801 - the store's attribute
            @staticmethod
            def deleted_sessions() -> list[tuple[str, str]]:
                return []

            @staticmethod
            def runtime_owners() -> list[tuple[str, str]]:
                return [("ws", "s1")]

            @staticmethod
            def runtime_owners_among(ids: list[str]) -> list[tuple[str, str]]:
                return [("ws", "s1")] if "s1" in ids else []

    runtimes = tmp_path / "runtimes"
    spare = runtimes / "ws" / f"{homes.PREFIX}ab" / "claude-config" / "projects" / "p"
    spare.mkdir(parents=True)
    child = runtimes / "ws" / "s1" / "claude-config" / "projects" / "p" / "c.jsonl"
    child.parent.mkdir(parents=True)
    child.write_text("{}\n")
    runtime_dirs.sweep(NoDeleted(), runtimes)  # type: ignore[arg-type]
    assert sorted(p.name for p in (runtimes / "ws").iterdir()) == ["s1"]
    assert child.read_text() == "{}\n"
    assert list((runtimes / runtime_dirs.TRASH).iterdir()) == []


def test_a_spare_costs_no_getrandom_and_its_parent_is_checked_for_links_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spares = homes.SpareHomes()
    base = tmp_path / "runtimes"
    base.mkdir()
    drawn: list[int] = []
    checked: list[str] = []
    real_urandom, real_check = os.urandom, homes.assert_no_symlink

    def urandom(n: int) -> bytes:
        drawn.append(n)
        return real_urandom(n)

    def check(path, **kwargs):  # type: ignore[no-untyped-def]
        checked.append(os.fspath(path))
        return real_check(path, **kwargs)

    monkeypatch.setattr(os, "urandom", urandom)
    monkeypatch.setattr(homes, "assert_no_symlink", check)
    for n in range(3):
        spares.replenish(str(base / f"s{n}"), str(base / f"s{n}" / "c" / "projects" / "p"))
        spares.drain()
    assert len(_spares(base)) == homes.PER_KEY
    assert drawn == [] and checked == [str(base)]
    spares.close()
