"""Splits by concern in the client: the Engine is the package `client/engine/`,
`client/session_client.py` a module that re-exports five concern modules, and
`client/gui/app.py` the GUI's wiring with its view, actions and words beside it. Each module is
short (under ~500 lines) and says its one concern in its docstring, and every name others
import is found where callers look for it, as the concern module's own object."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SPLITS = {
    "client.engine": (
        "client.engine.values",
        "client.engine.ports",
        "client.engine.changes",
        "client.engine.calls",
        "client.engine.records",
        "client.engine.cache",
        "client.engine.unknown",
        "client.engine.acks",
        "client.engine.reconcile",
        "client.engine.forks",
        "client.engine.lifecycle",
    ),
    "client.session_client": (
        "client.view_rules",
        "client.references",
        "client.follow",
        "client.transcript_text",
        "client.failure_words",
    ),
    "client.gui.app": (
        "client.gui.view",
        "client.gui.fork_actions",
        "client.gui.control_actions",
        "client.gui.status_text",
        "client.gui.turn_merge",
    ),
}


@pytest.mark.parametrize("name", [n for pair in SPLITS.items() for n in (pair[0], *pair[1])])
def test_each_client_module_of_a_split_is_short_and_says_its_concern(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    lines = Path(module.__file__).read_text(encoding="utf-8").count("\n")
    assert lines < 500, f"{name}: {lines} lines"
    assert module.__doc__ and len(module.__doc__.split()) >= 10, name


@pytest.mark.parametrize("facade", ["client.session_client"])
def test_every_public_name_of_a_facade_is_its_concern_modules_own_object(facade: str) -> None:
    module = importlib.import_module(facade)
    for public in module.__all__:
        value = getattr(module, public)
        homes = [
            m for m in SPLITS[facade] if getattr(importlib.import_module(m), public, None) is value
        ]
        assert homes, f"{facade}.{public} is defined in none of its concern modules"


def test_the_names_imported_from_the_old_modules_still_import() -> None:
    import client.gui.view
    from client.engine.lifecycle import Engine
    from client.gui.app import FORK_SESSION_ID, AgentHostApp, run_gui  # noqa: F401
    from client.session_client import (  # noqa: F401
        BOUNDARY_REASONS,
        ForkAction,
        ReferenceError_,
        TurnPrinter,
        TurnWaitTimeout,
        ancestry,
        describe_interaction,
        divider_after,
        error_words,
        fork_action,
        fork_and_wait,
        fork_blocked,
        fork_refusal,
        format_interaction,
        format_transcript,
        get_turn,
        list_sessions,
        resolve_operation,
        resolve_session,
        resolve_turn,
        run_turn,
        session_tree,
        source_title,
        stream_turn,
        timeline,
        turn_error_text,
    )

    assert Engine.__module__ == "client.engine.lifecycle"
    assert AgentHostApp.__module__ == "client.gui.app"
    assert FORK_SESSION_ID is client.gui.view.FORK_SESSION_ID
