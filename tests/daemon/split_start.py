"""A worker event as the two a driver that sends them apart would: a `turn.started` carrying
its binding (`bindingJson`, the app-server drivers') becomes the bare `turn.started` and then
its `turn.binding` (as the Claude driver's trailing bindings still come), for tests of how the
Session actor handles a binding heard apart from its start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def started_and_binding(event: Mapping[str, Any]) -> list[dict[str, Any]]:
    if event.get("type") != "turn.started" or "bindingJson" not in event:
        return [dict(event)]
    started = {k: v for k, v in event.items() if k != "bindingJson"}
    binding = {
        "type": "turn.binding",
        "turnId": event.get("turnId"),
        "bindingJson": event["bindingJson"],
    }
    return [started, binding]
