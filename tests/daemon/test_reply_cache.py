"""The point reads' reply cache (`agenthost.reply_cache`): bounded, and exact — a
kept reply is never served once anything was committed after it was read."""

from __future__ import annotations

from agenthost.reply_cache import ReplyCache


def test_a_new_generation_empties_the_cache() -> None:
    cache = ReplyCache()
    assert cache.get(1, "a") is None
    cache.put(1, "a", b"one")
    assert cache.get(1, "a") == b"one"
    assert cache.hits == 1
    # Anything committed since (a new generation): nothing kept may be served.
    assert cache.get(2, "a") is None
    assert len(cache) == 0 and cache.size_bytes == 0
    assert cache.get(1, "a") is None  # an old generation empties it again, never serves


def test_a_reply_read_under_an_older_generation_is_not_kept() -> None:
    """The generation is taken before the read: if the cache moved on meanwhile, the reply
    may predate a commit and is dropped."""
    cache = ReplyCache()
    cache.get(1, "x")
    cache.get(2, "y")
    cache.put(1, "x", b"stale?")
    assert cache.get(2, "x") is None
    assert len(cache) == 0


def test_entries_and_bytes_are_bounded_oldest_out() -> None:
    cache = ReplyCache(max_entries=3, max_bytes=10, max_reply_bytes=6)
    cache.get(1, "k")
    for key in ("a", "b", "c", "d"):
        cache.put(1, key, b"12")
    assert len(cache) == 3 and cache.get(1, "a") is None and cache.get(1, "d") == b"12"
    cache.put(1, "big", b"1234567")  # over max_reply_bytes: not kept
    assert cache.get(1, "big") is None
    cache.put(1, "e", b"123456")  # 6 + 3 x 2 > 10: the oldest go until it fits
    assert cache.size_bytes <= 10
    assert cache.get(1, "e") == b"123456"
    assert cache.get(1, "b") is None
    cache.put(1, "e", b"1")  # replacing a key keeps the byte count right
    assert cache.size_bytes == sum(len(cache.get(1, k) or b"") for k in ("c", "d", "e"))


def test_a_zero_sized_cache_keeps_nothing() -> None:
    cache = ReplyCache(max_entries=0)
    cache.get(1, "a")
    cache.put(1, "a", b"x")
    assert cache.get(1, "a") is None and len(cache) == 0
