"""Fixtures for the Codex tests: the real pinned `codex app-server` driven by a real
`CodexDriver`, against the local fake Responses API (the only fake)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from codex_helpers import EventLog, codex_bin

from drivers.codex import CodexDriver
from drivers.failpoints import Failpoints
from model_fakes.responses import ResponsesServer

MakeDriver = Callable[..., CodexDriver]


@pytest.fixture
def model() -> Iterator[ResponsesServer]:
    with ResponsesServer() as server:
        yield server


@pytest.fixture
def make_driver(model: ResponsesServer) -> Iterator[MakeDriver]:
    made: list[CodexDriver] = []

    def make(failpoints: dict[str, str] | None = None, **config: Any) -> CodexDriver:
        config.setdefault("command", [codex_bin()])
        config.setdefault("model", "mock-model")
        config.setdefault("model_base_url", model.base_url)
        driver = CodexDriver(config, Failpoints(failpoints))
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


@pytest.fixture
def log() -> EventLog:
    return EventLog()
