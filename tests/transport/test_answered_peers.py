"""The transport's memory of recently answered clients (`ReplyRouter.answered_at`, which keeps
the descriptor guard off a connection whose next request may be in ZeroMQ's pipe) under many
clients: past `MAX_ANSWERED_PEERS` it is pruned of clients answered long ago, and while more
than that many were answered within `RECENTLY_ANSWERED_S` (thousands of short-lived clients)
every further answer rebuilt the whole map — O(clients) per reply, quadratic over a burst.
Now a prune comes only after as many answers again as it kept: a burst of 20,000 clients
costs a handful of rebuilds, and every client answered recently is still remembered."""

from __future__ import annotations

from transport.server import MAX_ANSWERED_PEERS, ReplyRouter

CLIENTS = 20_000


def test_a_burst_of_clients_rebuilds_the_answered_map_a_few_times() -> None:
    replies = ReplyRouter()
    rebuilds = 0
    held = replies.answered_at
    for n in range(CLIENTS):
        peer = b"client-%d" % n
        replies.started(peer)
        replies.finished(peer)
        if replies.answered_at is not held:
            rebuilds += 1
            held = replies.answered_at
    # Doubling thresholds: log2(20,000 / 4,096) + 1 rebuilds at most (19,904 before).
    assert rebuilds <= 4, rebuilds
    # Every client of the burst was answered just now: each still counts as talking.
    assert all(replies.unread(b"client-%d" % n) for n in range(CLIENTS))
    assert len(replies.answered_at) == CLIENTS
    assert not replies.peer_in_flight
    assert MAX_ANSWERED_PEERS < CLIENTS
