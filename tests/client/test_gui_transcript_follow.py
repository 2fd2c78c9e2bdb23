"""The transcript's follow to the newest Turn ends even when its after-refresh step is lost.

Textual hands an after-refresh callback to the screen on top when it is handled; a screen
dismissed before it refreshes drops it. A loop of test_client_gui_resolve.py under load failed
that way after Abandon closed the resolve dialog: `transcript idle: False ... follows pending
1; condition: True` (the mark was gone; the follow made while the dialog was closing never
ended), as the landing CI had. Here the first after-refresh step is dropped on purpose."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from textual.app import App, ComposeResult
from textual.widgets import Static

from client.gui.transcript import TranscriptView

SETTLE_S = 5.0
"""Ample for a re-handed step (every 0.5 s) on a loaded host."""


class Pane(App[None]):
    def compose(self) -> ComposeResult:
        yield TranscriptView(id="transcript")


def test_a_follow_whose_after_refresh_step_is_dropped_still_ends() -> None:
    async def main() -> None:
        app = Pane()
        async with app.run_test(size=(60, 10)) as pilot:
            transcript = app.query_one(TranscriptView)
            await transcript.mount_all([Static(f"line {n}") for n in range(30)])
            await pilot.pause()
            dropped: list[Callable[..., Any]] = []
            handed = transcript.call_after_refresh

            def drop_first(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
                # Only the follow's own step (`scroll_end` hands Textual's steps this way too).
                if not dropped and getattr(callback, "__name__", "") == "_follow_after":
                    dropped.append(callback)  # what a screen dismissed before it refreshed does
                    return True
                return handed(callback, *args, **kwargs)

            transcript.call_after_refresh = drop_first  # type: ignore[method-assign]
            transcript.follow(True)
            assert dropped and not transcript.idle
            deadline = time.monotonic() + SETTLE_S
            while not transcript.idle:
                # Without the re-hand the follow stays pending for good.
                assert time.monotonic() < deadline, "the follow never ended"
                await pilot.pause(0.05)
            assert transcript.scroll_y == transcript.max_scroll_y  # it did follow to the end
            # A second follow, not dropped, ends once (its step handed twice runs once).
            transcript.follow(True)
            while not transcript.idle:
                assert time.monotonic() < deadline, "the second follow never ended"
                await pilot.pause(0.05)
            await asyncio.sleep(1.0)
            assert transcript.idle

    asyncio.run(main())
