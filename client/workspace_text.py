"""A Turn's workspace checkpoint in words (`Turn.workspace`, docs/protocol.md "TurnWorkspace"):
the files it changed for `agenthost show` and the GUI, a restore's outcome, and the warning
`say` gives when the Session's folder is gone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_MARK = {"added": "A", "modified": "M", "deleted": "D"}
SHOWN_FILES = 20
"""`show` names this many changed files of a Turn, then says how many more."""


def changed_files(turn: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The files the Turn changed, or None when it has no checkpoint (yet, or at all)."""
    workspace = turn.get("workspace")
    if not isinstance(workspace, Mapping) or workspace.get("state") == "unavailable":
        return None
    if not workspace.get("after"):
        return None
    return list(workspace.get("changedFiles") or [])


def files_line(turn: Mapping[str, Any]) -> str | None:
    """`files: M a.txt, A b.txt` / `files: none changed` / `files: no checkpoint (why)`;
    None when the Turn has no record (it runs, or it predates checkpoints)."""
    workspace = turn.get("workspace")
    if not isinstance(workspace, Mapping):
        return None
    if workspace.get("state") == "unavailable":
        return f"files: no checkpoint ({workspace.get('reason')}: {workspace.get('message')})"
    files = changed_files(turn)
    if files is None:
        return None
    if not files:
        return "files: none changed"
    return f"files ({len(files)} changed): {change_list(files)}"


def folder_missing(turn: Mapping[str, Any]) -> str | None:
    """The warning `say` prints when the Session's folder was gone as the Turn ran (the
    checkpoint says `cwd_missing`); None otherwise."""
    workspace = turn.get("workspace")
    if not isinstance(workspace, Mapping) or workspace.get("reason") != "cwd_missing":
        return None
    return (
        f"cwd_missing: {workspace.get('message')}; the turn ran without its folder and no "
        "checkpoint was taken (restore or diff cannot undo it): recreate the folder, or start "
        "a session where the work is now (`agenthost new --cwd DIR`)"
    )


def restore_summary(files: Sequence[Mapping[str, Any]]) -> str:
    """A restore's changes, written and removed apart: `1 file(s) written: M a.txt; 1 file(s)
    removed: b.txt`, or `nothing differed`."""
    written = [f for f in files if f.get("kind") != "deleted"]
    removed = [f for f in files if f.get("kind") == "deleted"]
    parts = []
    if written:
        parts.append(f"{len(written)} file(s) written: {change_list(written, limit=len(written))}")
    if removed:
        names = ", ".join(str(f["path"]) for f in removed)
        parts.append(f"{len(removed)} file(s) removed: {names}")
    return "; ".join(parts) or "nothing differed"


def change_list(files: Sequence[Mapping[str, Any]], limit: int = SHOWN_FILES) -> str:
    shown = ", ".join(f"{_MARK.get(str(f['kind']), '?')} {f['path']}" for f in files[:limit])
    more = len(files) - limit
    return shown + (f", and {more} more" if more > 0 else "")


def changed_count(turn: Mapping[str, Any]) -> str | None:
    """`3 files` / `1 file` / `no files` for the GUI's Turn header; None without a record."""
    files = changed_files(turn)
    if files is None:
        return None
    n = len(files)
    return "no files" if n == 0 else f"{n} file{'s' if n != 1 else ''}"
