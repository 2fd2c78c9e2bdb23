"""`host.status` once every provider's version is told: the status answers a version whose
probe (`--version`, run once per program on a thread of its own) outlasts its bound as null,
`versionPending` (docs/reliability.md, "host.status answers"); a test asserting a version asks
again until the probe has answered."""

from __future__ import annotations

import time
from typing import Any

from transport.client import Client


def status_with_versions(client: Client, timeout: float = 60.0) -> dict[str, Any]:
    """`host.status`, asked again (every 0.2 s, `timeout` at most) while a version is pending."""
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = client.call("host.status", {})
        pending = [p["provider"] for p in status["providers"] if p.get("versionPending")]
        if not pending:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"versions still pending after {timeout} s: {pending}")
        time.sleep(0.2)
