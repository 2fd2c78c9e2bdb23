"""Writing synthetic root rollouts into a real ThreadStore on disk."""

from __future__ import annotations

from collections.abc import Sequence

from tutti_agent.ids import uuid7
from tutti_agent.rollout import RolloutItem
from tutti_agent.store import ThreadStore


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
