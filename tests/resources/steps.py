"""A real daemon whose Tutti Agent talks to the fake Responses API, which answers
`steps N SIZE` with N reasoning items of SIZE bytes (one Message each) then `done`: Turns of
many messages, for the event and memory tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model_fakes.responses import ResponsesServer, Steps, last_user_text
from tests.support.daemon import DaemonProcess


def steps_reply(body: dict[str, Any]) -> str | Steps:
    """`steps N SIZE` → N reasoning items of SIZE bytes each, then `done`; else an echo."""
    words = last_user_text(body).split()
    if len(words) == 3 and words[0] == "steps":
        n, size = int(words[1]), int(words[2])
        return Steps(tuple(f"step {i} " + "r" * size for i in range(n)))
    return f"echo: {last_user_text(body)}"


@contextmanager
def steps_daemon(
    home: Path, *, gate: threading.Event | None = None, hold_after: int = 3
) -> Iterator[DaemonProcess]:
    with ResponsesServer(steps_reply, gate=gate, hold_after=hold_after) as server:
        home.mkdir(parents=True)
        (home / "agenthost.toml").write_text(
            f'[providers.tutti-agent]\nmodel_base_url = "{server.base_url}"\n'
        )
        d = DaemonProcess(home).start()
        try:
            yield d
        finally:
            if gate is not None:
                gate.set()
            d.stop()
