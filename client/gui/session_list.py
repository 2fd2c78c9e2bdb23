"""The session list: every cached session as a tree in which each fork child sits under its
source Session (seed 000 §8.4 lineage), rebuilt from the Engine's session cache; each fork shows
its ordinal among its source's forks and a mark when an ancestor was deleted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text
from textual import events
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from client.lineage_view import LineageMark
from client.session_client import session_tree

# The cells a cut title keeps before the id beside it is dropped for it.
TITLE_BESIDE_ID = 16


def session_label(
    session: Mapping[str, Any],
    *,
    source_deleted: bool = False,
    mark: LineageMark | None = None,
    room: int | None = None,
) -> Text:
    """The row of one Session; with `room` (cells), a title too long for it is elided with
    "…" so the marks after it stay in view."""
    label = Text()
    gone = source_deleted or (mark is not None and mark.deleted_ancestor)
    if gone:
        # First, so a narrow list still shows it; the words follow the title.
        label.append("† ", style="bold yellow")
    if session.get("pinned"):
        label.append("★ ", style="bold")
    if mark is not None and mark.ordinal is not None:
        # Which of its source's forks this is (session.lineage's ordinal).
        label.append(f"#{mark.ordinal} ", style="bold")
    title = Text(str(session.get("title") or "Untitled"))
    short_id = f"  {str(session['agentSessionId'])[:8]}"
    if room is not None:
        # What the marks around the title take; the title gets the rest (at least 8 cells).
        # The id gives way first: it stays only beside a title that keeps all of itself or
        # TITLE_BESIDE_ID cells of it.
        around = label.cell_len + (27 if gone else 0) + (3 if session.get("activeTurnId") else 0)
        if room - around - len(short_id) < min(title.cell_len, TITLE_BESIDE_ID):
            short_id = ""
        fits = max(8, room - around - len(short_id))
        if title.cell_len > fits:
            title.truncate(fits, overflow="ellipsis")
    label.append_text(title)
    if source_deleted:
        # A fork whose source is gone: say so instead of passing for a root.
        label.append("  ↳ from a deleted session", style="dim italic")
    elif gone:
        label.append("  ↳ an ancestor was deleted", style="dim italic")
    label.append(short_id, style="dim")
    if session.get("activeTurnId"):
        label.append("  ●", style="bold green")
    return label


class SessionTree(Tree[str]):
    """Node data is the agentSessionId."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Sessions", id=id)
        self.show_root = False
        self.guide_depth = 3
        # What the rows were last made of, and the width they were cut for.
        self._shown: (
            tuple[list[Mapping[str, Any]], str | None, Mapping[str, LineageMark]] | None
        ) = None
        self._cut_for = 0

    def on_resize(self, event: events.Resize) -> None:
        """The rows are cut for the list's width: a new width cuts them again (the cursor
        stays on its session)."""
        if self._shown is None or self.content_region.width == self._cut_for:
            return
        sessions, selected, marks = self._shown
        cursor = self.cursor_node.data if self.cursor_node is not None else None
        self.show_sessions(sessions, cursor or selected, marks)

    def show_sessions(
        self,
        sessions: Iterable[Mapping[str, Any]],
        selected: str | None,
        marks: Mapping[str, LineageMark] | None = None,
    ) -> None:
        marks = marks or {}
        sessions = list(sessions)
        self._shown = (sessions, selected, marks)
        self._cut_for = self.content_region.width
        self.clear()
        stack: list[TreeNode[str]] = [self.root]
        target: TreeNode[str] | None = None
        rows = session_tree(sessions)
        # 0 until laid out: nothing to elide for. The rows a list taller than itself gets take
        # a scrollbar's cells, whether or not it is drawn yet.
        width = self.content_region.width
        if len(rows) > self.content_region.height:
            width -= self.styles.scrollbar_size_vertical
        listed = {str(r.session["agentSessionId"]) for r in rows}
        for row in rows:
            del stack[row.depth + 1 :]
            source = (row.session.get("forkedFrom") or {}).get("sourceAgentSessionId")
            sid = str(row.session["agentSessionId"])
            label = session_label(
                row.session,
                source_deleted=bool(source) and source not in listed,
                mark=marks.get(sid),
                # A title wider than the list is elided with "…", not cut unmarked.
                room=(width - self.guide_depth * row.depth) if width > 0 else None,
            )
            node = stack[-1].add(label, data=str(row.session["agentSessionId"]), expand=True)
            node.allow_expand = False
            stack.append(node)
            if row.session["agentSessionId"] == selected:
                target = node
        self.root.expand_all()
        if target is not None:
            self.show_cursor_on(target)

    def show_cursor_on(self, node: TreeNode[str]) -> None:
        # Lines are rebuilt on the next refresh; moving the cursor before that lands on line 0.
        self.call_after_refresh(self.move_cursor, node)

    def node_for(self, session_id: str) -> TreeNode[str] | None:
        def walk(node: TreeNode[str]) -> TreeNode[str] | None:
            if node.data == session_id:
                return node
            for child in node.children:
                found = walk(child)
                if found is not None:
                    return found
            return None

        return walk(self.root)

    def depth_of(self, session_id: str) -> int | None:
        node = self.node_for(session_id)
        depth = 0
        while node is not None and node.parent is not None and node.parent is not self.root:
            node = node.parent
            depth += 1
        return None if node is None else depth
