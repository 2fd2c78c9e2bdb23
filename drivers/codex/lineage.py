"""A Codex fork child's lineage: where a committed child's state came from (recorded in its
runtime context, re-bound from at resume, seed 000 §10), and the ancestors a Codex 0.171
Referenced rollout reads through `forked_from_id` in a home."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.binder import ROLLOUT_DIRS

CONTEXT_KEY = "codex"
"""The driver's own key in a Session's runtime context: `{home, threadId, forkSource}`."""


@dataclass(frozen=True, slots=True)
class ForkLineage:
    """Where a committed fork child's provider state came from: the home and thread of its
    direct source. Re-binding from it at resume repairs a child whose copy was lost."""

    source_home: str
    source_thread_id: str

    def to_wire(self) -> dict[str, str]:
        return {"home": self.source_home, "threadId": self.source_thread_id}


def fork_lineage_of(
    home: Path, thread_id: str, runtime_context: Mapping[str, Any]
) -> ForkLineage | None:
    """The fork source of a Session, from its canonical runtime context.

    A fork child inherits its source's context frozen at prepare (seed 000 §5), so a `codex`
    entry naming another home and another thread is the direct source; once the child has run,
    its own entry names itself and keeps the recorded `forkSource`.
    """
    entry = runtime_context.get(CONTEXT_KEY)
    if not thread_id or not isinstance(entry, Mapping):
        return None
    recorded_home, recorded_thread = entry.get("home"), entry.get("threadId")
    if recorded_thread == thread_id:
        source = entry.get("forkSource")
        if (
            isinstance(source, Mapping)
            and isinstance(source.get("home"), str)
            and isinstance(source.get("threadId"), str)
            and source["home"] != str(home)
        ):
            return ForkLineage(source["home"], source["threadId"])
        return None
    if (
        isinstance(recorded_home, str)
        and isinstance(recorded_thread, str)
        and recorded_thread
        and recorded_home != str(home)
    ):
        return ForkLineage(recorded_home, recorded_thread)
    return None


def rollout_path(home: Path, thread_id: str) -> Path | None:
    suffix = f"-{thread_id}.jsonl"
    for dirname in ROLLOUT_DIRS:
        root = home / dirname
        if root.is_dir() and not root.is_symlink():
            for path in sorted(root.rglob(f"rollout-*{suffix}")):
                return path
    return None


def session_meta(path: Path) -> Mapping[str, Any]:
    with path.open("rb") as fh:
        first = json.loads(fh.readline())
    payload = first.get("payload") if isinstance(first, dict) else None
    if not isinstance(first, dict) or first.get("type") != "session_meta":
        raise ValueError(f"{path}: first line is not session_meta")
    return payload if isinstance(payload, dict) else {}


def rollout_lineage(home: Path, thread_id: str) -> list[str]:
    """The thread and the ancestors its rollout references in `home`, child first. A Codex
    0.171 child only holds its own lines and reads the rest through `forked_from_id`."""
    chain: list[str] = []
    current: str | None = thread_id
    while current and current not in chain and len(chain) < 64:
        chain.append(current)
        path = rollout_path(home, current)
        if path is None:
            break
        try:
            parent = session_meta(path).get("forked_from_id")
        except (OSError, ValueError):
            break
        current = parent if isinstance(parent, str) and parent else None
    return chain
