"""docs/user-guide.md's key table is the GUI's keys: every binding of the app, of its dialogs
and of the F1 list is in it, and it names no key the GUI does not bind."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from textual.binding import Binding
from textual.screen import Screen

from client.gui.app import AgentHostApp

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8")
KEY_NAMES = {"question_mark": "?"}


def _keys(bindings: object) -> set[str]:
    keys: set[str] = set()
    for b in bindings:  # type: ignore[attr-defined]
        key = b.key if isinstance(b, Binding) else b[0]
        keys.update(KEY_NAMES.get(k, k) for k in key.split(","))
    return keys


def _bound() -> set[str]:
    """The app's keys, the F1 list's own additions, and every dialog's keys."""
    keys = _keys(AgentHostApp.BINDINGS)
    app_source = (ROOT / "client" / "gui" / "app.py").read_text(encoding="utf-8")
    keys.update(re.findall(r'bindings\.append\(Binding\("([^"]+)"', app_source))
    for path in (ROOT / "client" / "gui").glob("*.py"):
        module = importlib.import_module(f"client.gui.{path.stem}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Screen) and cls.__module__ == module.__name__:
                keys |= _keys(cls.__dict__.get("BINDINGS", []))
    return keys


def _documented() -> set[str]:
    section = GUIDE.split("\n### The GUI by keyboard\n", 1)[1].split("\n### ", 1)[0]
    table = section.split("\n| key | what it does |\n", 1)[1].split("\n\n", 1)[0]
    cells = [line.split(" | ", 1)[0] for line in table.splitlines()[1:]]
    return set(re.findall(r"`([^`]+)`", "\n".join(cells)))


def test_the_key_table_is_every_key_the_gui_binds() -> None:
    bound = _bound()
    assert {"f5", "ctrl+q", "?", "enter", "s", "a", "k", "escape"} <= bound, bound
    documented = _documented()
    assert bound == documented, {
        "not documented": bound - documented,
        "unbound": documented - bound,
    }


def test_the_client_doc_names_every_key_of_the_app() -> None:
    doc = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    keys_line = doc.split("\nKeys (in the footer", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([^`]+)`", keys_line))
    assert _keys(AgentHostApp.BINDINGS) - {"?"} <= named, _keys(AgentHostApp.BINDINGS) - named
