"""A call waiting for its reply asks the client's `gone` check while it waits: words from it
(the server stopped, or is stopping) end the wait at once, `ServerGone` carrying them, the
request forgotten; without such words the call waits for its `timeout` as before. A real ROUTER
socket takes the request and never answers (a daemon that closed its socket after reading)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from transport.client import Client, ClientTimeout, ServerGone

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[tuple[str, threading.Event]]:
    """An ipc endpoint whose ROUTER reads every request and answers none; the event is set
    once it has read one."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path / 'api.sock'}"
    router.bind(endpoint)
    read = threading.Event()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if router.poll(50, zmq.POLLIN):
                router.recv_multipart()
                read.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield endpoint, read
    finally:
        stop.set()
        thread.join(5)
        router.close()
        ctx.term()


def test_a_call_whose_server_is_gone_ends_with_the_checks_words(
    silent: tuple[str, threading.Event],
) -> None:
    endpoint, read = silent
    # Words only once the server has the request: the wait began, and only the check ends it
    # (the timeout is far beyond the test's limit).
    client = Client(
        endpoint, timeout=600, gone=lambda: "the daemon stopped" if read.is_set() else None
    )
    try:
        with pytest.raises(ServerGone) as gone:
            client.call_raw("host.status", {})
        assert str(gone.value) == "the daemon stopped"
        assert isinstance(gone.value, ClientTimeout)  # a caller of timeouts still catches it
        assert client._pending == {}  # noqa: SLF001 - the request is forgotten, as on a timeout
    finally:
        client.close()


def test_a_check_without_words_waits_for_the_timeout(silent: tuple[str, threading.Event]) -> None:
    endpoint, read = silent
    client = Client(endpoint, timeout=0.5, gone=lambda: None)
    try:
        with pytest.raises(ClientTimeout) as timed_out:
            client.call_raw("host.status", {})
        assert not isinstance(timed_out.value, ServerGone)
        assert read.is_set()
    finally:
        client.close()
