"""`agenthost serve` keeps what its start made out of the cyclic collector once it is ready: a
full collection then walks only what requests made since, not the whole start-up heap (tens
of milliseconds on a 2-core host, landing in whichever read was under way)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, create_session

pytestmark = pytest.mark.timeout(90)

FROZEN = re.compile(r"start-up heap frozen: (\d+) objects kept out of the cyclic collector")


def test_a_served_daemon_freezes_its_start_up_heap_after_ready(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "home").start()
    try:
        found: list[str] = []
        deadline = time.monotonic() + 30
        while not found and time.monotonic() < deadline:
            found = FROZEN.findall(daemon.log_path.read_text(errors="replace"))
            time.sleep(0.05)
        # Once, after ready; the start's imports alone are tens of thousands of objects.
        assert len(found) == 1, found
        assert int(found[0]) > 10_000, found
        # And the daemon serves as before.
        assert create_session(daemon.client())
    finally:
        daemon.stop()
