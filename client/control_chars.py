"""What others wrote (the model, a tool, another client's title), made safe to put on a
terminal: its control characters shown as escapes, never obeyed by the terminal."""

from __future__ import annotations

import re

# Every C0 control but tab and newline, DEL and every C1 control (`\x9b` is a CSI of its own).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """`text` as a terminal should show it, not obey it: each control character but newline and
    tab (an escape sequence, a carriage return that would hide what came before it on the line,
    a bell) as its escape (`\\r`, `\\x1b`); a Windows line end is a newline."""
    text = text.replace("\r\n", "\n")
    return _CONTROLS.sub(lambda m: "\\r" if m.group() == "\r" else f"\\x{ord(m.group()):02x}", text)


def dropped(text: str) -> str:
    """`text` without its control characters but newline and tab: what a drawn line of the GUI
    keeps (each takes no cell, so the line keeps its width)."""
    return _CONTROLS.sub("", text)


def has_controls(text: str) -> bool:
    return _CONTROLS.search(text) is not None
