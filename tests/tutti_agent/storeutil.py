"""Writing synthetic root rollouts into a real ThreadStore on disk."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import tutti_agent.store as store_module
from tutti_agent.ids import uuid7
from tutti_agent.rollout import RolloutItem, RolloutLine, read_rollout
from tutti_agent.store import ThreadStore


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every rollout file `tutti_agent.store` parses from now on, in order (each still read)."""
    parsed: list[Path] = []
    real: Callable[[Path], list[RolloutLine]] = read_rollout

    def counting(path: Path) -> list[RolloutLine]:
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(store_module, "read_rollout", counting)
    return parsed


def write_root(store: ThreadStore, items: Sequence[RolloutItem], cwd: str = "/w") -> str:
    thread_id = uuid7()
    writer = store.create_rollout(
        thread_id,
        {"id": thread_id, "cwd": cwd, "model": "m", "model_provider": "tutti"},
    )
    for item in items:
        writer.append(item)
    writer.close()
    return thread_id


def append(store: ThreadStore, thread_id: str, items: Sequence[RolloutItem]) -> None:
    writer = store.open_writer(store.load(thread_id))
    for item in items:
        writer.append(item)
    writer.close()
