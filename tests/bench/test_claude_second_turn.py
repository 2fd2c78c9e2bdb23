"""`bench.claude_second_turn` at its smallest: a new claude-code Session's two Turns through an
in-process daemon (the real worker, SDK and bundled CLI on the fake Messages model), the worker
requests Turn 2 sent, and the command that reproduces the figures."""

from __future__ import annotations

import re

import pytest

from bench import claude_second_turn

pytestmark = [pytest.mark.claude, pytest.mark.timeout(180)]


def test_the_smoke_run_prints_each_sessions_turns_their_requests_and_its_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert claude_second_turn.main(["--sessions", "1"]) == 0
    out = capsys.readouterr().out
    line = re.search(r"session 0: turn 1 \d+ ms, turn 2 \d+ ms, turn 2 sent (\{.*\})", out)
    assert line is not None, out
    assert "'turn.start': 1" in line.group(1), out  # Turn 2 reached its worker once
    assert re.search(r"session\.start per turn 2: [01]/1", out), out
    assert "command: build/venv/bin/python -m bench.claude_second_turn --sessions 1" in out
