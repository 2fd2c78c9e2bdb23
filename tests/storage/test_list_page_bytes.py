"""A `session.list` page is bounded in bytes as well as in count: it ends before the Session
that would take its stored text past `max_bytes` (never before the first), and the cursor
continues from there, so every Session is still listed once, in order."""

from __future__ import annotations

from storage.store import Store

WS = "ws"


def test_a_page_ends_at_its_byte_bound_and_the_cursor_continues(store: Store) -> None:
    big = {"blob": "x" * 40_000}
    sids = [f"s{i:02d}" for i in range(10)]
    for i, sid in enumerate(sids):
        settings = big if i % 3 == 0 else {}
        store.sessions.create_session(
            WS, session_id=sid, provider="p", title=sid, cwd="/", settings=settings
        )
    pages: list[list[str]] = []
    cursor = None
    while True:
        page, cursor = store.sessions.list_sessions(WS, cursor=cursor, limit=200, max_bytes=50_000)
        pages.append([s.session_id for s in page])
        if cursor is None:
            break
    assert [sid for page in pages for sid in page] == sids  # each once, in order
    assert all(page for page in pages)  # never an empty page
    # A big Session starts a page (no page holds two: 2 × 40 KB > 50 KB).
    for page in pages:
        assert sum(1 for sid in page if int(sid[1:]) % 3 == 0) <= 1, pages
    assert len(pages) == 4, pages


def test_one_session_over_the_bound_is_a_page_of_its_own(store: Store) -> None:
    store.sessions.create_session(
        WS, session_id="a", provider="p", title="a", cwd="/", settings={"b": "y" * 9000}
    )
    store.sessions.create_session(WS, session_id="b", provider="p", title="b", cwd="/", settings={})
    page, cursor = store.sessions.list_sessions(WS, limit=200, max_bytes=1000)
    assert [s.session_id for s in page] == ["a"] and cursor is not None
    assert page[0].settings == {"b": "y" * 9000}  # whole, never cut
    page, cursor = store.sessions.list_sessions(WS, cursor=cursor, limit=200, max_bytes=1000)
    assert [s.session_id for s in page] == ["b"] and cursor is None


def test_without_a_byte_bound_the_count_alone_pages(store: Store) -> None:
    for sid in "abc":
        store.sessions.create_session(
            WS, session_id=sid, provider="p", title=sid, cwd="/", settings={"x": "z" * 5000}
        )
    page, cursor = store.sessions.list_sessions(WS, limit=2)
    assert [s.session_id for s in page] == ["a", "b"] and cursor is not None
