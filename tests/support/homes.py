"""Reads provider state straight from the provider homes under `AGENTHOST_HOME/runtimes`, so
tests count provider children in the provider's own files, not in what the daemon says."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def runtime_home(home: Path, ws: str, sid: str, provider_home: str = "tutti-agent-home") -> Path:
    return home / "runtimes" / ws / sid / provider_home


def rollouts(provider_home: Path) -> list[Path]:
    return sorted(provider_home.glob("sessions/**/rollout-*.jsonl"))


def first_line(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return dict(json.loads(f.readline()))


def child_rollouts(provider_home: Path) -> list[Path]:
    """Rollouts in a home that are fork children (their session_meta names a source)."""
    out = []
    for path in rollouts(provider_home):
        try:
            meta = first_line(path)
        except (OSError, ValueError):
            continue
        if meta.get("payload", {}).get("forked_from_id"):
            out.append(path)
    return out


def user_texts(path: Path) -> list[str]:
    """User messages recorded in a rollout (model-visible user turns, wrappers excluded)."""
    texts = []
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        payload = item.get("payload") or {}
        if item.get("type") == "response_item" and payload.get("role") == "user":
            for part in payload.get("content") or []:
                text = part.get("text", "")
                if text and not text.startswith("<"):
                    texts.append(text)
    return texts


def processes_naming(text: str) -> list[int]:
    """This user's processes (not this one) whose command line or environment names `text`:
    a provider process working in a home, found by the path it was given."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            named = any(text.encode() in (proc / f).read_bytes() for f in ("cmdline", "environ"))
        except OSError:
            continue
        if named:
            found.append(int(proc.name))
    return found
