"""Carries Engine changes into the Textual app as messages.

Engine listeners run on the client, event and scheduler threads; `post_message` is thread-safe
and never blocks, so the Engine is never held up by (or deadlocked with) the UI loop.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.message import Message
from textual.message_pump import MessagePump

from client.engine.lifecycle import Engine
from client.engine.values import EngineChange


class EngineChanged(Message):
    """One Engine change (a fork mutation, a cached session, or a raw daemon event)."""

    def __init__(self, change: EngineChange) -> None:
        super().__init__()
        self.change = change


def bridge(engine: Engine, target: MessagePump) -> Callable[[], None]:
    """Forward every Engine change to `target`; returns the function that stops it."""

    def forward(change: EngineChange) -> None:
        target.post_message(EngineChanged(change))

    return engine.subscribe(forward)
