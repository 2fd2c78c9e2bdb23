"""Helpers of the issue-17 tests: follow one Turn on the events socket (its `message.delta`
events and its settled `turn.updated`), check a stream against the settled messages, and look
for a key's bytes everywhere the daemon writes and in every reply."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.support.daemon import WS, DaemonProcess, submit
from transport.client import Client, EventSubscriber


def _subscribed(d: DaemonProcess, c: Client, sid: str) -> EventSubscriber:
    """A SUB that is known to receive: poke the Session until its upsert arrives (ZeroMQ's
    slow joiner drops what is published before the subscription lands)."""
    sub = EventSubscriber(d.events, [WS])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        title = f"t-{uuid.uuid4().hex[:6]}"
        c.call("session.updateTitle", {"workspaceId": WS, "agentSessionId": sid, "title": title})
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            event = sub.next(0.1)
            if (
                event
                and event.get("type") == "session.upserted"
                and (event["session"]["title"] == title)
            ):
                return sub
    sub.close()
    raise AssertionError("event subscription never became live")


def settle_with_events(
    d: DaemonProcess, c: Client, sid: str, text: str, timeout: float = 90
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Submit `text`; return the settled Turn (from its `turn.updated`) and the `message.delta`
    events of that Turn received before it."""
    with _subscribed(d, c, sid) as sub:
        turn_id = submit(c, sid, text)["turnId"]
        deltas: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = sub.next(1.0)
            if event is None:
                continue
            if event.get("type") == "message.delta" and event.get("turnId") == turn_id:
                assert event["agentSessionId"] == sid
                deltas.append(event)
            if (
                event.get("type") == "turn.updated"
                and event["turn"]["turnId"] == turn_id
                and event["turn"]["phase"] == "settled"
            ):
                return dict(event["turn"]), deltas
    raise AssertionError(f"turn {turn_id} did not settle within {timeout}s")


def assert_streamed(turn: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
    """Every assistant message of the settled Turn was streamed first, and the concatenated
    deltas of its item equal its settled text."""
    assistant = [m for m in turn["messages"] if m["kind"] == "assistant" and m["text"]]
    assert assistant, turn
    streamed: dict[str, str] = {}
    for event in deltas:
        if event["kind"] == "assistant":
            streamed[event["itemId"]] = streamed.get(event["itemId"], "") + event["delta"]
    assert streamed, "no message.delta before the settled turn.updated"
    by_item = {str(m["payload"].get("providerItemId")): m["text"] for m in assistant}
    for item_id, text in streamed.items():
        assert by_item.get(item_id) == text, (item_id, text, by_item)
    assert sorted(streamed.values()) == sorted(by_item.values())


def key_leaks(
    key: str, d: DaemonProcess, replies: Iterable[Any], skip: Iterable[Path] = ()
) -> list[str]:
    """Where the key's bytes occur: any file under the daemon's home (store and its WAL, the
    provider homes and transcripts, the daemon log), or any reply the test collected."""
    needle = key.encode()
    skipped = {p.resolve() for p in skip}
    found: list[str] = []
    for path in d.home.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.resolve() not in skipped:
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    if needle in json.dumps(list(replies), default=str).encode():
        found.append("a reply")
    return found
