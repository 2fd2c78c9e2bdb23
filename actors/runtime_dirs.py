"""A deleted Session's runtime directory, `runtimes/<workspace>/<session>/` (the provider's
home: its full transcript), is removed once the delete is committed and its runtime stopped.

No committed fork child depends on it: the binder copies a child's lineage into the child's
own home, so a fork source can be removed too; while a fork of it is in flight the delete is
refused (fenced). Crash-safe: the store's `deleted` flag is the durable intent. The directory
is renamed into `runtimes/.trash/` (atomic; `.` never starts a workspace segment) and removed
from there, and start-up (`sweep`) empties the trash and removes any deleted Session's
directory a killed daemon left behind. Quarantined provider children (of `abandoned` forks)
are moved to `runtimes/.evidence/` first and never removed; a source with an `unknown` fork is
not deletable at all (`session.delete` answers `agent_session_fork_unresolved`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from pathlib import Path

from actors.context import _path_segment as path_segment
from actors.store_ports import DeletedSessionsStore
from domain.procfs import end_all, processes_in

log = logging.getLogger(__name__)

TRASH = ".trash"
EVIDENCE = ".evidence"
SPARE_PREFIX = ".claude-spare-"  # drivers/claude/homes.py's PREFIX (actors import no driver)
RUNTIME_VAR = "AGENTHOST_RUNTIME"  # drivers/runtime_marker.py's (actors import no driver)
QUARANTINE = "quarantine"  # the drivers' quarantine folder name (drivers/app_server/resolution.py)


def session_dir(runtimes_dir: Path, workspace_id: str, session_id: str) -> Path:
    return runtimes_dir / path_segment(workspace_id) / session_id


def evidence_dir(runtimes_dir: Path, workspace_id: str, session_id: str) -> Path:
    """Where a deleted source's quarantined provider children are kept."""
    return runtimes_dir / EVIDENCE / path_segment(workspace_id) / session_id


def keep_evidence(runtimes_dir: Path, workspace_id: str, session_id: str) -> list[Path]:
    """Move every `<provider home>/quarantine/<operation>` folder of the Session's directory
    to `runtimes/.evidence/<workspace>/<session>/<provider home>/quarantine/<operation>`: an
    abandoned operation's provider child is moved aside, never deleted (law 9), even when its
    source is. A rename per folder; a rerun after a kill finishes what is left."""
    source = session_dir(runtimes_dir, workspace_id, session_id)
    kept: list[Path] = []
    for folder in sorted(source.glob(f"*/{QUARANTINE}/*")):
        home = folder.parent.parent.name
        dest = evidence_dir(runtimes_dir, workspace_id, session_id) / home / QUARANTINE
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = dest / folder.name
        if target.exists():
            target = dest / f"{folder.name}-{uuid.uuid4().hex[:8]}"
        os.rename(folder, target)
        kept.append(target)
    return kept


def discard(runtimes_dir: Path, workspace_id: str, session_id: str) -> bool:
    """Remove a deleted Session's directory, keeping its quarantined provider children
    (`keep_evidence`); False when there was none."""
    source = session_dir(runtimes_dir, workspace_id, session_id)
    try:
        keep_evidence(runtimes_dir, workspace_id, session_id)
    except OSError as exc:
        # Never trash what could not be kept aside: the sweep at the next start retries.
        log.warning("cannot keep the quarantine of %s aside, not removing it: %s", source, exc)
        return False
    trash = runtimes_dir / TRASH
    target = trash / f"{session_id}-{uuid.uuid4().hex[:8]}"
    try:
        trash.mkdir(mode=0o700, exist_ok=True)
        os.rename(source, target)
    except FileNotFoundError:
        return False
    except OSError as exc:
        # The trash unusable (a file in its place, no room, no permission): the directory
        # stays whole — the store's `deleted` flag keeps the intent, and the next start's
        # sweep retries. Never removed in place, where a kill would leave half of it.
        log.warning("cannot move %s into %s, left for the next start: %s", source, trash, exc)
        return False
    _purge(target)
    return True


END_WAIT_S = 2.0
"""How long `end_processes` waits for the processes it killed to be gone."""
END_LOOK_S = 0.02


def end_processes(runtimes_dir: Path, workspace_id: str, session_id: str) -> list[int]:
    """SIGKILL every process still working in a deleted Session's directory (its environment
    names a path there: a provider's process and what it started), and wait up to
    `END_WAIT_S` until none is left; the pids killed. Before a delete removes the directory:
    a process left in it (the runtime of a stop the worker did not answer within its bound, a
    tool's process a provider left) would write it again or run on in a folder nothing
    owns."""
    folder = str(session_dir(runtimes_dir, workspace_id, session_id))
    return end_all(lambda: processes_in(folder), END_WAIT_S, END_LOOK_S)


def end_runtimes_left(runtimes_dir: Path) -> list[int]:
    """At start-up, before any worker of this daemon: SIGKILL every process a runtime of a
    previous run left working in `runtimes_dir` (its environment names a path there and holds
    a runtime's marker: a tool's process a provider started, of a daemon killed with its
    workers, that nothing stopped), waited for up to `END_WAIT_S`; the pids killed."""
    folder = str(runtimes_dir)
    return end_all(lambda: processes_in(folder, marked=RUNTIME_VAR), END_WAIT_S, END_LOOK_S)


def remove_empty_session_dir(path: Path) -> bool:
    """Remove the runtime directory of a fork's target that ended with no child (`failed`, or
    abandoned with nothing quarantined): the directories the worker made ahead for the child
    while the provider forked, which no Session will own. Only empty directories go (`rmdir`,
    bottom-up, links never followed): a file anywhere — a quarantined child, a bound one —
    keeps itself and every directory above it. Whether `path` is gone."""
    with contextlib.suppress(OSError):
        for dirpath, _dirs, files in os.walk(path, topdown=False):
            if not files:
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
    return not os.path.lexists(path)


def sweep(store: DeletedSessionsStore, runtimes_dir: Path) -> int:
    """Finish deletes a previous process was killed in; returns how many it finished. First,
    end what a previous run's runtimes left running in `runtimes_dir` (`end_runtimes_left`)."""
    trash = runtimes_dir / TRASH
    finished = 0
    killed = end_runtimes_left(runtimes_dir)
    if killed:
        log.info("ended %d process(es) a previous run's runtimes left: %s", len(killed), killed)
    # The Claude worker's child homes made ahead (`drivers.claude.homes`) that a killed
    # worker or daemon left unused: no Session's, never a child's. Renamed into the trash
    # first (atomic: a rename racing a late worker's leaves the spare whole in one place).
    for spare in runtimes_dir.glob(f"*/{SPARE_PREFIX}*"):
        with contextlib.suppress(OSError):
            trash.mkdir(mode=0o700, exist_ok=True)
            os.rename(spare, trash / f"{spare.name}-{uuid.uuid4().hex[:8]}")
    if trash.is_dir():
        for entry in trash.iterdir():
            _purge(entry)
            finished += 1
    for workspace_id, session_id in store.sessions.deleted_sessions():
        if discard(runtimes_dir, workspace_id, session_id):
            finished += 1
    finished += _remove_unowned(store, runtimes_dir)
    if finished:
        log.info("removed %d deleted Session runtime dir(s) left by a previous run", finished)
    return finished


FEW_CANDIDATES = 20_000
"""Up to this many candidate folders, the sweep asks the store about those alone (a key look-up
each); more, and one read of every owner costs less (on 100,000 Sessions the look-ups cost
less up to some 40,000 folders: bench/start_sweep.py)."""


def _remove_unowned(store: DeletedSessionsStore, runtimes_dir: Path) -> int:
    """The empty directories of every Session folder no Session and no unresolved fork owns
    (`remove_empty_session_dir`): a failed or abandoned fork's target folder, made ahead by
    the worker, that a kill between the fork's ending and its removal left. Files keep
    themselves and their directories (a quarantined child: never removed). How many went.

    Its cost follows what is on disk, not how many Sessions the store ever held: the folders
    are listed first; none, and the store is not read at all."""
    candidates = _session_folders(runtimes_dir)
    if not candidates:
        return 0
    if len(candidates) <= FEW_CANDIDATES:
        rows = store.sessions.runtime_owners_among(sorted({n for _s, n in candidates if _text(n)}))
    else:
        rows = store.sessions.runtime_owners()
    # runtimes/<segment>/: a workspace id's segment is a hash for some ids; workspaces are few.
    segments: dict[str, str] = {}
    owned: set[tuple[str, str]] = set()
    for ws, sid in rows:
        segment = segments.get(ws)
        if segment is None:
            segment = segments[ws] = path_segment(ws)
        owned.add((segment, sid))
    removed = 0
    for segment, name in candidates:
        if (segment, name) in owned:
            continue
        if remove_empty_session_dir(runtimes_dir / segment / name):
            removed += 1
    return removed


def _session_folders(runtimes_dir: Path) -> list[tuple[str, str]]:
    """`(segment, name)` of every runtimes/<segment>/<name>/ directory: dot names (the trash,
    the evidence, spare homes), links and anything not a directory skipped at both levels."""
    found: list[tuple[str, str]] = []
    for workspace in _directories(str(runtimes_dir)):
        found.extend((workspace.name, f.name) for f in _directories(workspace.path))
    return found


def _text(name: str) -> bool:
    """Whether a folder name can be a stored id (an undecodable file name cannot)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _directories(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as entries:
            return [
                e for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return []


def _purge(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=lambda _f, p, e: log.warning("cannot remove %s: %s", p, e[1]))
    else:
        path.unlink(missing_ok=True)
