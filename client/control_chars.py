"""What others wrote (the model, a tool, another client's title), made safe to put on a
terminal: its control characters shown as escapes, never obeyed by the terminal; its
bidirectional formatting characters too, so text is drawn in the order it is stored."""

from __future__ import annotations

import re

# Every C0 control but tab and newline, DEL and every C1 control (`\x9b` is a CSI of its own);
# every bidirectional formatting character: the embeddings and overrides U+202A-U+202E, the
# isolates U+2066-U+2069 and the marks LRM, RLM and ALM. An override or an isolate makes a
# terminal draw what follows it in another order than stored ("report\u202efdp.exe" reads
# "reportexe.pdf"), so a title could pass for another one or another session's id.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(char: str) -> str:
    if char == "\r":
        return "\\r"
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown(text: str) -> str:
    """`text` as a terminal should show it, not obey it: each control character but newline and
    tab (an escape sequence, a carriage return that would hide what came before it on the line,
    a bell) as its escape (`\\r`, `\\x1b`), each bidirectional formatting character as its
    escape (`\\u202e`); a Windows line end is a newline."""
    text = text.replace("\r\n", "\n")
    return _CONTROLS.sub(lambda m: _escape(m.group()), text)


def dropped(text: str) -> str:
    """`text` without its control characters but newline and tab, and without its
    bidirectional formatting characters: what a drawn line of the GUI keeps (each takes no
    cell, so the line keeps its width)."""
    return _CONTROLS.sub("", text)


def has_controls(text: str) -> bool:
    return _CONTROLS.search(text) is not None
