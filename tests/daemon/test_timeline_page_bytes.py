"""`session.timeline` pages of big Turns, through the real daemon: a page ends before the Turn
that would take its stored text past its byte bound (never before its first Turn), with
`nextSequence` set, so a client paging with `afterSequence` = the last `nextSequence` sees every
Turn once, in order, in replies of about the bound. Before, `limit` alone ended a page: 40 Turns
of 900 KiB were one 73.8 MB reply, and 1,000 (the `limit` maximum) would be ~1.8 GB."""

from __future__ import annotations

from typing import Any

import msgpack

from tests.support.daemon import WS, DaemonProcess, create_session, run_turn

BOUND = 1 << 20  # docs/protocol.md: ~1 MiB of stored text a page
TURNS = 6
TEXT = 200 << 10  # the fake model echoes it: a Turn of ~400 KiB, two a page


def _page(c: Any, sid: str, after: int, limit: int) -> tuple[dict[str, Any], int]:
    page = c.call(
        "session.timeline",
        {"workspaceId": WS, "agentSessionId": sid, "afterSequence": after, "limit": limit},
    )
    return dict(page), len(msgpack.packb(page, use_bin_type=True))


def test_timeline_pages_of_big_turns_end_at_the_byte_bound(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    made = [run_turn(c, sid, f"{i} " + "x" * TEXT)["turnId"] for i in range(TURNS)]
    shown: list[str] = []
    sizes: list[tuple[int, int]] = []
    after = 0
    while True:
        page, size = _page(c, sid, after, 1000)
        turns = page["turns"]
        assert turns, f"an empty page after {after}"
        sizes.append((len(turns), size))
        shown += [t["turnId"] for t in turns]
        if page["nextSequence"] is None:
            break
        assert page["nextSequence"] == turns[-1]["sequence"]
        after = page["nextSequence"]
    assert shown == made
    assert len(sizes) > 1, sizes
    for held, size in sizes:
        # A page past the bound holds one Turn only (the Turn alone passes it).
        assert held == 1 or size <= BOUND + (64 << 10), sizes


def test_a_turn_bigger_than_the_bound_is_a_page_of_its_own(daemon: DaemonProcess) -> None:
    c = daemon.client()
    sid = create_session(c)["agentSessionId"]
    big = run_turn(c, sid, "x" * (600 << 10))["turnId"]  # ~1.2 MB with its echo
    small = run_turn(c, sid, "small")["turnId"]
    first, _ = _page(c, sid, 0, 10)
    assert [t["turnId"] for t in first["turns"]] == [big]
    assert first["nextSequence"] == first["turns"][0]["sequence"]
    second, _ = _page(c, sid, first["nextSequence"], 10)
    assert [t["turnId"] for t in second["turns"]] == [small]
    assert second["nextSequence"] is None
