"""The claude-code entry of benchmark 1: its bare harness runs a real source through the SDK's
`query()` (bundled CLI, local MessagesServer), and each `fork_once` forks through the last
turn's checkpoint, reads the child in-process and deletes it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.providers import BareClaude, provider
from drivers.claude.state import is_uuid

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]


def test_claude_bare_forks_through_the_checkpoint_and_leaves_only_the_source(
    tmp_path: Path,
) -> None:
    entry = provider("claude-code")
    assert entry.unavailable() is None
    with entry.environment() as config:
        assert set(config) == {"model_base_url"}
        bare = entry.bare(tmp_path / "bare", 2, config)
        try:
            assert isinstance(bare, BareClaude)
            # The checkpoint is the last turn's reply, read from the transcript.
            entries = [json.loads(line) for line in bare.transcript.read_text().splitlines()]
            by_uuid = {e["uuid"]: e for e in entries if "uuid" in e}
            assert bare.checkpoint is not None
            reply = by_uuid[bare.checkpoint]
            assert reply["type"] == "assistant"
            assert reply["message"]["content"][0]["text"] == "echo: turn 1"
            assert len(bare.turn_ids) == 2

            children = set()
            for _ in range(2):
                assert bare.fork_once() > 0
                assert bare.last_child is not None and is_uuid(bare.last_child)
                # Two turns of user + assistant: the child holds the source through the cut.
                assert bare.last_child_messages == 4
                children.add(bare.last_child)
            assert len(children) == 2 and bare.session_id not in children
            # Every child was deleted after its timing: the project dir holds the source only.
            assert [p.name for p in bare.transcript.parent.iterdir()] == [bare.transcript.name]
            assert bare.cold_read_once() > 0
        finally:
            bare.close()
