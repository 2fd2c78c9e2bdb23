"""The daemon's and the worker's ZeroMQ modules look at socket options without pyzmq's enum call
(`transport.zmq_options`): a `zmq.EVENTS` or `zmq.RCVMORE` look enters no Python function, and
every option reads and writes as before (a known one by its type, an unknown one refused)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

import transport.worker_link  # noqa: F401 - installs the lookup, as the daemon and worker do
from tests.support.python_calls import python_calls
from transport.zmq_options import install

_get: Callable[..., Any] = zmq.backend.Socket.get
_set: Callable[..., Any] = zmq.backend.Socket.set


@pytest.fixture
def sock() -> Iterator[zmq.Socket[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind("inproc://options")
    try:
        yield s
    finally:
        s.close(0)
        ctx.term()


def _python_calls(fn: Callable[[], Any]) -> list[str]:
    return python_calls(fn)[1:]  # the lambda itself


def test_an_option_look_enters_no_python_function(sock: zmq.Socket[Any]) -> None:
    assert install()
    for option in (zmq.EVENTS, zmq.RCVMORE):
        assert _python_calls(lambda o=int(option): _get(sock, o)) == []


def test_options_read_and_write_as_before(sock: zmq.Socket[Any]) -> None:
    assert _get(sock, int(zmq.EVENTS)) & int(zmq.POLLIN) == 0  # nothing to read
    assert _get(sock, int(zmq.RCVMORE)) == 0
    assert isinstance(_get(sock, int(zmq.FD)), int)
    _set(sock, int(zmq.LINGER), 7)
    assert _get(sock, int(zmq.LINGER)) == 7
    assert isinstance(_get(sock, int(zmq.IDENTITY)), bytes)  # a bytes option stays bytes
    _set(sock, int(zmq.MAXMSGSIZE), 1 << 20)  # an int64 option
    assert _get(sock, int(zmq.MAXMSGSIZE)) == 1 << 20
    assert sock.getsockopt(zmq.EVENTS) == _get(sock, int(zmq.EVENTS))
    with pytest.raises(zmq.ZMQError):
        _get(sock, 99_999)  # unknown to pyzmq and to libzmq: refused as before
