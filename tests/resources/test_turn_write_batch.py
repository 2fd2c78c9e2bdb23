"""A burst of a Turn's driver events is written as one batch.

While the event the Session actor handles is followed by another driver event already queued,
its durable write waits, and the burst's writes land as one `Store.write_batch` (one writer
turn, one fsync'd COMMIT) instead of one transaction each. Through the real daemon and its
Tutti Agent: a Turn of many streamed items (the fake model sends them back to back) is written
in batches — the store's own per-method record (`AGENTHOST_STORE_TIMING`) names the batch
drain — and the Turn is exactly what one write per event makes: every Message, in order,
settled with its final reply. Counted, never timed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_fakes.responses import ResponsesServer
from tests.resources.steps import steps_reply
from tests.support.daemon import DaemonProcess, create_session, run_turn

pytestmark = pytest.mark.timeout(120)

STEPS = 40


def test_a_burst_of_driver_events_lands_in_batches_and_the_turn_is_whole(
    tmp_path: Path,
) -> None:
    home, timing = tmp_path / "home", tmp_path / "store-timing.json"
    with ResponsesServer(steps_reply) as server:
        home.mkdir(parents=True)
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home, env={"AGENTHOST_STORE_TIMING": str(timing)}).start()
        try:
            c = d.client()
            sid = create_session(c)["agentSessionId"]
            turns = [run_turn(c, sid, f"steps {STEPS} 100") for _ in range(3)]
        finally:
            d.stop()  # the store writes its record at close
    for turn in turns:
        assert turn["outcome"] == "completed", turn
        texts = [m["text"] for m in turn["messages"]]
        assert len(texts) == STEPS + 2  # the user text, the steps, the reply
        assert [t.split(" ")[:2] for t in texts[1:-1]] == [["step", str(i)] for i in range(STEPS)]
        assert turn["messages"][-1]["messageId"] == turn["finalAssistantMessageId"]
    record = json.loads(timing.read_text())
    assert record.get("_drain_batch", {}).get("n", 0) >= 1, sorted(record)
    # Fewer store transactions than Messages: the steps did not each take their own turn.
    singles = record.get("append_message", {}).get("n", 0)
    assert singles < 3 * STEPS, record.get("append_message")
