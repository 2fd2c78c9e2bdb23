"""The workspace methods (docs/design/workspace.md): `session.workspaceDiff` reads what a Turn
changed (or what changed between two Turns) from their checkpoints; `workspace.restore` puts
a Session's `cwd` back to one, first checkpointing what is there (the restore's `undo`).

A diff is a read on the reader pool; a restore runs on the Session's actor (a `Mutate`), so no
Turn of that Session can start while it writes the files.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from actors.checkpoints import DirectoryLocks, checkpoint_ref
from domain.errors import (
    InvalidArgument,
    SessionBusy,
    WorkspaceCheckpointMissing,
    WorkspaceShared,
    WorkspaceUnavailable,
)
from protocol.methods import WorkspaceDiffResult, WorkspaceRestoreResult
from storage.models import SequenceProvenance, Session
from workspace.git import GitUnavailable
from workspace.shadow import ChangeKind, Checkpoint, ShadowStore, Unavailable

DIFF_MAX_BYTES = 256_000
"""The unified diff a `session.workspaceDiff` returns by default, at most (`maxBytes`)."""
DIFF_MAX_BYTES_LIMIT = 4 << 20
TREE_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class SessionReads(Protocol):
    def get_session(self, ws: str, sid: str) -> Session: ...


class TurnProvenance(Protocol):
    @property
    def sequence_provenance(self) -> str: ...


class CheckpointReads(Protocol):
    def newest_settled_turn_id(self, ws: str, sid: str) -> str | None: ...

    def get_turn(self, ws: str, sid: str, turn_id: str) -> TurnProvenance: ...

    def turn_checkpoint(self, ws: str, sid: str, turn_id: str) -> dict[str, Any] | None: ...

    def live_session_cwds(self) -> list[tuple[str, str, str]]: ...


class WorkspaceStore(Protocol):
    @property
    def sessions(self) -> SessionReads: ...

    @property
    def turns(self) -> CheckpointReads: ...


def _record(store: WorkspaceStore, ws: str, sid: str, turn_id: str) -> dict[str, Any]:
    """The Turn's checkpoint record, or `workspace_checkpoint_missing` saying why not."""
    record = store.turns.turn_checkpoint(ws, sid, turn_id)
    copied = SequenceProvenance.FORK_CLONE.value
    if record is None and store.turns.get_turn(ws, sid, turn_id).sequence_provenance == copied:
        raise WorkspaceCheckpointMissing(
            f"turn {turn_id} was copied by the fork that made this session: its files were "
            "checkpointed in the source session (`session.lineage` names it; its "
            "`session.workspaceDiff` shows them)",
            params={"turnId": turn_id, "workspaceReason": "forked"},
        )
    if record is None:
        raise WorkspaceCheckpointMissing(
            f"turn {turn_id} has no workspace checkpoint (taken before checkpoints existed, "
            "or never settled by this daemon)",
            params={"turnId": turn_id},
        )
    if record.get("state") == "unavailable":
        reason = str(record.get("reason") or "unavailable")
        raise WorkspaceCheckpointMissing(
            f"turn {turn_id} has no workspace checkpoint: {record.get('message') or reason}",
            params={"turnId": turn_id, "workspaceReason": reason},
        )
    return record


def _side(record: dict[str, Any], turn_id: str, which: str) -> str:
    tree = record.get(which)
    if not isinstance(tree, str) or not tree:
        raise WorkspaceCheckpointMissing(
            f"turn {turn_id} has no {which!r} checkpoint", params={"turnId": turn_id}
        )
    return tree


def _unavailable(
    exc: GitUnavailable | Unavailable, what: str, undo: Checkpoint | None = None
) -> WorkspaceUnavailable:
    """503 `workspace_unavailable`; `undo`: a restore that failed once its undo was kept
    (some files may be written) names it, as a restore's answer does, to put them back."""
    reason = exc.reason
    message = str(exc) if isinstance(exc, GitUnavailable) else exc.message
    params: dict[str, Any] = {"workspaceReason": reason}
    if undo is None:
        return WorkspaceUnavailable(f"{what}: {message}", params=params)
    params["undo"] = {"tree": undo.tree, "headCommit": undo.head_commit}
    return WorkspaceUnavailable(
        f"{what}: {message}; restore `undo.tree` {undo.tree} to put its files back",
        params=params,
    )


def workspace_diff(
    store: WorkspaceStore,
    shadow: ShadowStore,
    ws: str,
    sid: str,
    turn_id: str | None,
    from_turn_id: str | None,
    max_bytes: int,
) -> WorkspaceDiffResult:
    """A Turn's changes (its `before` → `after`), or from `fromTurnId`'s `after` to the
    Turn's `after`; the Turn defaults to the newest settled one."""
    store.sessions.get_session(ws, sid)  # an unknown Session is `workspace_agent_session_not_found`
    if turn_id is None:
        turn_id = store.turns.newest_settled_turn_id(ws, sid)
        if turn_id is None:
            raise WorkspaceCheckpointMissing(
                f"session {sid} has no settled turn", params={"agentSessionId": sid}
            )
    record = _record(store, ws, sid, turn_id)
    target = _side(record, turn_id, "after")
    if from_turn_id is None:
        base = _side(record, turn_id, "before")
    else:
        origin = _record(store, ws, sid, from_turn_id)
        if origin.get("cwd") != record.get("cwd"):
            raise InvalidArgument(
                "fromTurnId",
                f"turns {from_turn_id} and {turn_id} checkpoint different directories "
                f"({origin.get('cwd')} and {record.get('cwd')})",
            )
        base = _side(origin, from_turn_id, "after")
    cwd = Path(str(record["cwd"]))
    try:
        changes = shadow.changed_files(cwd, base, target)
        text, truncated = shadow.diff(cwd, base, target, max_bytes)
    except GitUnavailable as exc:
        raise _unavailable(exc, "the checkpoints could not be read") from exc
    return {
        "turnId": turn_id,
        "fromTurnId": from_turn_id,
        "cwd": str(cwd),
        "from": base,
        "to": target,
        "changedFiles": [{"path": c.path, "kind": _KINDS[c.kind]} for c in changes],
        "diff": text,
        "truncated": truncated,
    }


_KINDS: dict[ChangeKind, Literal["added", "modified", "deleted"]] = {
    ChangeKind.ADDED: "added",
    ChangeKind.MODIFIED: "modified",
    ChangeKind.DELETED: "deleted",
}


def check_tree(value: str) -> str:
    if not TREE_ID.fullmatch(value):
        raise InvalidArgument("tree", "tree must be a checkpoint id (40 or 64 hex digits)")
    return value


def restore_fn(
    shadow: ShadowStore,
    locks: DirectoryLocks,
    *,
    turn_id: str | None,
    which: str,
    tree: str | None,
    force: bool,
) -> Callable[[WorkspaceStore, str, str], WorkspaceRestoreResult]:
    """The restore, run on the Session's actor (`Mutate`): refused while a Turn is active
    (`agent_session_busy`) or while other live Sessions share the directory
    (`workspace_shared`, unless `force`); checkpoints the current files first and keeps
    them (`undo`), then writes back only what differs."""

    def _restore(store: WorkspaceStore, ws: str, sid: str) -> WorkspaceRestoreResult:
        session = store.sessions.get_session(ws, sid)
        if session.active_turn_id is not None:
            raise SessionBusy(
                f"session {sid} has an active turn: interrupt it or wait before a restore",
                params={"turnId": session.active_turn_id},
            )
        if turn_id is not None:
            record = _record(store, ws, sid, turn_id)
            target = _side(record, turn_id, which)
            cwd = str(record["cwd"])
        else:
            assert tree is not None
            target, cwd = tree, os.path.realpath(session.cwd)
            if not shadow.has(Path(cwd), target):
                raise WorkspaceCheckpointMissing(
                    f"no checkpoint {target} of {cwd}", params={"tree": target}
                )
        others = [
            other
            for other_ws, other, other_cwd in store.turns.live_session_cwds()
            if (other_ws, other) != (ws, sid) and os.path.realpath(other_cwd) == cwd
        ]
        if others and not force:
            raise WorkspaceShared(
                f"{len(others)} other live session(s) work in {cwd}; their files would change "
                "too (`force: true` restores anyway)",
                params={"agentSessionIds": others[:20]},
            )
        path = Path(cwd)
        begun: Checkpoint | None = None
        try:
            # `held`: the lock files a git of the restore left (its own index's, killed past
            # the bound; a ref's) go before the folder's lock does, not at the next start.
            with locks.held(shadow, os.path.realpath(cwd)):
                # The undo is kept before any file is written: a restore killed midway
                # loses nothing its undo cannot put back.
                undo = checkpoint_ref(sid, f"restore-{time.time_ns()}", "before")
                before = shadow.begin_restore(path, undo)
                if isinstance(before, Unavailable):
                    raise _unavailable(before, f"the restore of {cwd} did not start")
                begun = before
                shadow.write_restore(path, before, target)
                changes = shadow.changed_files(path, before.tree, target)
        except GitUnavailable as exc:
            raise _unavailable(exc, f"the restore of {cwd} failed", undo=begun) from exc
        except OSError as exc:
            if begun is None:
                raise
            failed = Unavailable("write_failed", f"a file could not be written: {exc}")
            raise _unavailable(failed, f"the restore of {cwd} failed", undo=begun) from exc
        return {
            "cwd": cwd,
            "turnId": turn_id,
            "which": which if turn_id is not None else None,
            "restored": target,
            "undo": {"tree": before.tree, "headCommit": before.head_commit},
            "changedFiles": [{"path": c.path, "kind": _KINDS[c.kind]} for c in changes],
        }

    return _restore
