"""A Claude Code message larger than the SDK's default stdout buffer (1 MiB): a 3 MiB assistant
reply, through the real SDK and CLI against the fake Messages API, completes whole (the SDK's
`max_buffer_size` is `MAX_MESSAGE_BYTES`), and the Session's next Turn runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drivers.claude.turns import MAX_MESSAGE_BYTES
from model_fakes.messages import MessagesServer, last_user_text
from tests.claude.conftest import Harness

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]

LONG = "/long "


def _reply(body: dict[str, Any]) -> str:
    text = last_user_text(body)
    if text.startswith(LONG):
        size = int(text[len(LONG) :])
        return ("0123456789abcde\n" * (size // 16 + 1))[:size]
    return f"echo: {text}"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with MessagesServer(reply=_reply) as server:
        h = Harness(tmp_path, server)
        try:
            yield h
        finally:
            h.driver.close()


def test_a_reply_over_one_mib_completes_whole_and_the_next_turn_runs(harness: Harness) -> None:
    session = harness.start("long")
    size = 3 << 20
    assert 2 * size < MAX_MESSAGE_BYTES  # the reply's message line, JSON-escaped, fits
    _, completed = harness.turn(session, f"{LONG}{size}")
    assert completed["outcome"] == "completed", completed
    events = harness.recorder.for_turn(completed["turnId"])
    items = [e["item"] for e in events if e["type"] == "item"]
    assert [len(i["text"]) for i in items if i["kind"] == "assistant"] == [size]
    _, after = harness.turn(session, "after")
    assert after["outcome"] == "completed", after
