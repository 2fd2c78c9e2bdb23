"""Fixtures for the transport tests: a real ApiServer on real ipc and tcp sockets driven by the
in-test dispatcher of `transport_harness`, and clients that are closed after each test."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from transport_harness import EchoDispatcher, Running

from transport.client import Client
from transport.server import ApiServer


@pytest.fixture
def short_tmp() -> Iterator[str]:
    # ipc paths are limited to ~107 bytes; pytest's tmp_path can be longer than that.
    path = tempfile.mkdtemp(prefix="ah-t-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_server(short_tmp: str) -> Iterator[Callable[..., Running]]:
    started: list[ApiServer] = []

    def make(**kwargs: Any) -> Running:
        dispatcher = EchoDispatcher()
        home = tempfile.mkdtemp(prefix="h", dir=short_tmp)
        server = ApiServer(
            [f"ipc://{home}/run/api.sock", "tcp://127.0.0.1:0"],
            f"ipc://{home}/run/events.sock",
            dispatcher,
            **kwargs,
        )
        dispatcher.server = server
        server.start()
        started.append(server)
        return Running(server, dispatcher, home)

    yield make
    for server in started:
        server.close()


@pytest.fixture
def running(make_server: Callable[..., Running]) -> Running:
    return make_server()


@pytest.fixture
def client_for() -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []

    def make(endpoint: str, **kwargs: Any) -> Client:
        client = Client(endpoint, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
