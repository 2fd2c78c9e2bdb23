"""The reads a GUI lives on, in the soaks' chaos (docs/protocol.md, "session.list",
"session.timeline", "session.lineage"; docs/reliability.md, the reads' laws): a reader pages
`session.list` to its end with a small `limit`, pages a Session's timeline with
`afterSequence`, or reads a Session's lineage, while the other clients create, delete, rename,
pin, fork and run Turns (and, in the crash soak, while the daemon is killed). Around each read
it reads the store (`read_view`: before the first request, after the last answer), and
`check_read_answers` holds each answer to both (`list_pages`, `timeline_pages`,
`lineage_answer`). A read a kill cut (no reply) or a Session deleted meanwhile (404) is
counted and dropped, not a failure; any other error answer is a failure. A reader's step is at
times a write a page shows instead (`session.pin`, `session.updateTitle`), so the readers race
pins and renames in both soaks; only a 500 to it is a failure."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.support.daemon import WS
from tests.support.invariants import (
    ForkPaging,
    LineageRead,
    ListPaging,
    ReadAnswer,
    TimelinePaging,
    Violation,
    check_read_answers,
    read_view,
)
from transport.client import Client, ClientClosed, ClientTimeout

LIST_LIMIT = 3
"""`session.list`'s `limit` while paging: small, so a paging spans many pages and writes."""
TIMELINE_LIMIT = 2
"""`session.timeline`'s `limit` while paging."""
FORKS_LIMIT = 1
"""`session.lineage`'s `maxNodes` while paging a Session's forks by `afterOrdinal`."""
MAX_PAGES = 500
"""A paging that has not ended after this many pages is a failure (a cursor that loops)."""
GONE = ("workspace_agent_session_not_found",)
"""The refusal a law allows a read of one Session: it was deleted meanwhile."""
BUSY = ("store_busy",)
"""A read refused while another process holds the store (counted; none seen so far)."""


class Cut(Exception):
    """A read ended without an answer to keep (no reply, or its Session deleted)."""


class Reader:
    """The read actions of one soak's clients, and what they were answered."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.lock = threading.Lock()
        self.reads: list[ReadAnswer] = []
        self.checked = 0
        """How many of `reads` `check` has held to their laws (each is checked once)."""
        self.calls: Counter[str] = Counter()
        self.failures: list[str] = []

    def step(self, c: Client, rng: random.Random, sids: Iterable[str], tag: str) -> None:
        """One read: page the Sessions, page a Session's timeline, or read its lineage."""
        mine = sorted(sids)
        how = rng.choice(["list", "timeline", "lineage", "forks", "write"]) if mine else "list"
        if how == "write":
            self.write(c, rng, rng.choice(mine), tag)
            return
        try:
            read = self.read(c, how, rng.choice(mine) if mine else "")
        except Cut as why:
            with self.lock:
                self.calls[f"read {how} cut: {why}"] += 1
            return
        except AssertionError as exc:
            with self.lock:
                self.failures.append(f"{tag}: {how}: {exc}")
            return
        with self.lock:
            self.reads.append(read)
            self.calls[f"read {how} kept"] += 1

    def read(self, c: Client, how: str, sid: str) -> ReadAnswer:
        """One read of `how` (`list`, `timeline`, `forks`, `lineage`; `sid` the Session of
        the three last)."""
        if how == "list":
            return self.page_list(c)
        if how == "timeline":
            return self.page_timeline(c, sid)
        if how == "forks":
            return self.page_forks(c, sid)
        return self.lineage(c, sid)

    def write(self, c: Client, rng: random.Random, sid: str, tag: str) -> None:
        """A write a page shows, racing the other readers: a pin, a rename or a goal (set or
        cleared: its text counts in a `session.list` page's bytes) of `sid`."""
        params: dict[str, Any] = {"workspaceId": WS, "agentSessionId": sid}
        draw = rng.random()
        if draw < 0.3:
            method, params["pinned"] = "session.pin", rng.random() < 0.5
        elif draw < 0.6:
            method, params["title"] = "session.updateTitle", f"r{rng.randrange(1000)}"
        elif draw < 0.8:
            method, params["goal"] = "goal.set", "x" * rng.randrange(1, 2000)
        else:
            method = "goal.clear"
        try:
            status, body = c.call_raw(method, params)
        except (ClientTimeout, ClientClosed):
            status, body = 0, {"reason": "lost"}
        with self.lock:
            self.calls[f"{method} {status} {body.get('reason', '')}".rstrip()] += 1
            if status == 500:
                self.failures.append(f"{tag}: {method} → 500 {body}")

    def sweep(self, c: Client, sids: Iterable[str]) -> None:
        """Each read once, over one Session of `sids` (after a restart: what it reads back)."""
        mine = sorted(sids)
        rng = random.Random(len(self.reads))
        for how in ("list", "timeline", "lineage", "forks"):
            if how != "list" and not mine:
                return
            try:
                read = self.read(c, how, rng.choice(mine) if mine else "")
            except Cut as why:
                with self.lock:
                    self.calls[f"sweep {how} cut: {why}"] += 1
                continue
            with self.lock:
                self.reads.append(read)
                self.calls[f"sweep {how} kept"] += 1

    def check(self) -> list[Violation]:
        """The reads' laws over the reads not checked yet."""
        with self.lock:
            fresh = self.reads[self.checked :]
            self.checked = len(self.reads)
        return check_read_answers(fresh)

    def _call(self, c: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            status, body = c.call_raw(method, params)
        except (ClientTimeout, ClientClosed) as exc:
            raise Cut(f"{method} {type(exc).__name__}") from None
        if status == 404 and body.get("reason") in GONE:
            raise Cut(f"{method} 404")
        if status == 503 and body.get("reason") in BUSY:
            raise Cut(f"{method} 503")
        assert status == 200, f"{method} {params} → {status} {body}"
        return body

    def page_list(self, c: Client) -> ListPaging:
        """`session.list` paged to its end (`nextCursor` until null)."""
        before = read_view(self.home, WS)
        pages: list[tuple[tuple[str, ...], bool]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"workspaceId": WS, "limit": LIST_LIMIT}
            if cursor is not None:
                params["cursor"] = cursor
            body = self._call(c, "session.list", params)
            cursor = body.get("nextCursor")
            ids = tuple(str(s["agentSessionId"]) for s in body["sessions"])
            pages.append((ids, cursor is not None))
            if cursor is None:
                break
            assert len(pages) < MAX_PAGES, f"session.list paged {len(pages)} times"
        return ListPaging(LIST_LIMIT, tuple(pages), before, read_view(self.home, WS))

    def page_timeline(self, c: Client, sid: str) -> TimelinePaging:
        """`session.timeline` of `sid` paged to its end (`afterSequence` = `nextSequence`)."""
        before = read_view(self.home, WS, [sid])
        pages: list[tuple[tuple[tuple[str, int], ...], bool]] = []
        after = 0
        while True:
            params = {
                "workspaceId": WS,
                "agentSessionId": sid,
                "afterSequence": after,
                "limit": TIMELINE_LIMIT,
            }
            body = self._call(c, "session.timeline", params)
            turns = tuple((str(t["turnId"]), int(t["sequence"])) for t in body["turns"])
            nxt = body.get("nextSequence")
            pages.append((turns, nxt is not None))
            if nxt is None:
                break
            after = int(nxt)
            assert len(pages) < MAX_PAGES, f"session.timeline paged {len(pages)} times"
        return TimelinePaging(
            sid, TIMELINE_LIMIT, tuple(pages), before, read_view(self.home, WS, [sid])
        )

    def lineage(self, c: Client, sid: str) -> LineageRead:
        """`session.lineage` of `sid`."""
        before = read_view(self.home, WS)
        body = self._call(c, "session.lineage", {"workspaceId": WS, "agentSessionId": sid})
        return LineageRead(sid, body, before, read_view(self.home, WS))

    def page_forks(self, c: Client, sid: str) -> ForkPaging:
        """`sid`'s own forks paged by `afterOrdinal`, `FORKS_LIMIT` a page, to the end."""
        before = read_view(self.home, WS)
        pages: list[tuple[tuple[str, int], ...]] = []
        after = 0
        while True:
            params = {
                "workspaceId": WS,
                "agentSessionId": sid,
                "maxNodes": FORKS_LIMIT,
                "afterOrdinal": after,
            }
            body = self._call(c, "session.lineage", params)
            page = tuple((str(n["agentSessionId"]), int(n["ordinal"])) for n in body["descendants"])
            pages.append(page)
            cut = body.get("truncated")
            if cut is None or not cut.get("omittedChildren") or not page:
                break
            after = page[-1][1]
            assert len(pages) < MAX_PAGES, f"session.lineage paged {len(pages)} times"
        return ForkPaging(sid, FORKS_LIMIT, tuple(pages), before, read_view(self.home, WS))
