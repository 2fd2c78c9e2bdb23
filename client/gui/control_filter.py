"""The GUI's line filter that keeps what others wrote from commanding the terminal: Rich keeps
an escape (ESC, a C1 CSI) in the text of a title or a reply, and the terminal would obey it."""

from __future__ import annotations

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

from client.control_chars import dropped, has_controls


class ControlCharacters(LineFilter):
    """Drops the control characters from the text of every drawn segment (a control segment,
    Textual's own cursor move, is kept)."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        if not any(not s.control and has_controls(s.text) for s in segments):
            return segments
        return [s if s.control else Segment(dropped(s.text), s.style, s.control) for s in segments]
