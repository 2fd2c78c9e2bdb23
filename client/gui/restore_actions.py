"""Restore a Turn's files from the GUI (`workspace.restore`): from the F6 diff window, `a` puts
the Session's folder back as the Turn left it and `b` as it found it, each asked first (it
rewrites files); the toast says what was written and removed, and F9 puts the folder back as it
was before the restore (its `undo.tree`). A refusal is said in words; a folder other live
Sessions work in is restored only after a second confirmation (`force`). A part the app owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from textual.app import App

from client.gui.controls import ConfirmScreen
from client.gui.status_text import short_path
from client.gui.view import SessionView
from client.session_client import error_words
from client.workspace_text import restore_summary
from protocol.methods import WORKSPACE_RESTORE, WorkspaceRestoreParams, WorkspaceRestoreResult
from transport.client import ApiError


@dataclass(frozen=True, slots=True)
class RestoreTarget:
    """What a restore puts back: a Turn's `before`/`after`, or an undo's checkpoint `tree`."""

    session_id: str
    label: str
    turn_id: str | None = None
    which: str = "after"
    tree: str | None = None

    def words(self) -> str:
        if self.tree is not None:
            return "as it was before the last restore"
        return f"as {self.label} {'found' if self.which == 'before' else 'left'} it"


def restored_words(target: RestoreTarget, result: Mapping[str, Any]) -> str:
    """`restored …/repo as Turn 1 found it: 1 file(s) written: M a.txt. F9 undoes it`."""
    changed = restore_summary(list(result.get("changedFiles") or []))
    where = short_path(str(result.get("cwd") or ""))
    return f"restored {where} {target.words()}: {changed}. F9 undoes it"


def shared_question(exc: ApiError, target: RestoreTarget) -> str:
    listed = exc.params.get("agentSessionIds")
    others = ", ".join(str(s)[:8] for s in (listed if isinstance(listed, list) else []))
    return (
        f"Nothing was restored: other live sessions ({others}) work in this folder too; their "
        f"files would change behind their back. Restore it {target.words()} anyway?"
    )


class RestoreActions:
    """`a`/`b` in the diff window and F9's undo."""

    def __init__(self, app: App[int], view: SessionView) -> None:
        self.app = app
        self.view = view
        self.engine = view.engine
        # The last restore's undo (its Session, its checkpoint), for F9.
        self.undo: RestoreTarget | None = None

    def ask(self, target: RestoreTarget) -> None:
        """Confirm first (the restore rewrites files), then restore."""
        question = (
            f"Restore the folder {target.words()}? Files that differ are rewritten or removed; "
            "F9 undoes it."
        )
        self.app.push_screen(
            ConfirmScreen(question, confirm="Restore"),
            lambda yes: self._restore(target, False) if yes else None,
        )

    def undo_last(self) -> None:
        """F9: put the folder back as it was before the last restore."""
        if self.undo is None:
            self.app.notify("no restore to undo", title="Restore", severity="warning")
            return
        self.ask(self.undo)

    def _restore(self, target: RestoreTarget, force: bool) -> None:
        params = WorkspaceRestoreParams(
            workspaceId=self.engine.workspace_id, agentSessionId=target.session_id, force=force
        )
        if target.tree is not None:
            params["tree"] = target.tree
        else:
            params["turnId"] = str(target.turn_id)
            params["which"] = "before" if target.which == "before" else "after"

        def work() -> None:
            try:
                result = self.view.waits.request(WORKSPACE_RESTORE, params)
            except ApiError as exc:
                self.app.call_from_thread(self._refused, target, force, exc)
                return
            except TimeoutError as exc:
                words = error_words("restore", exc)
                self.app.call_from_thread(self.app.notify, words, severity="error")
                return
            self.app.call_from_thread(self._restored, target, result)

        self.app.run_worker(work, thread=True, group="restore")

    def _restored(self, target: RestoreTarget, result: WorkspaceRestoreResult) -> None:
        undo = result.get("undo") or {}
        if undo.get("tree"):
            self.undo = RestoreTarget(target.session_id, target.label, tree=str(undo["tree"]))
        self.app.notify(restored_words(target, result), title="Restore", timeout=15)

    def _refused(self, target: RestoreTarget, force: bool, exc: ApiError) -> None:
        if exc.reason == "workspace_shared" and not force:
            self.app.push_screen(
                ConfirmScreen(shared_question(exc, target), confirm="Restore anyway"),
                lambda yes: self._restore(target, True) if yes else None,
            )
            return
        undo = (exc.params or {}).get("undo")
        words = error_words("restore", exc)
        if isinstance(undo, Mapping) and undo.get("tree"):
            # It failed after keeping its undo: some files may be written; F9 puts them back.
            self.undo = RestoreTarget(target.session_id, target.label, tree=str(undo["tree"]))
            words += "; some files may have been written: F9 puts them back"
        self.app.notify(words, title="Restore", severity="error", timeout=15)
