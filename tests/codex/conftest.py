"""Fixtures for the Codex tests: the real pinned `codex app-server` driven by a real
the Codex `AppServerDriver`, or a real daemon running it (`codex_daemon`), against the local
fake Responses API (the only fake)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from codex_helpers import EventLog, MakeDriver, codex_bin, write_config

from drivers.app_server.driver import AppServerDriver
from drivers.codex.driver import create_driver as codex_driver
from drivers.failpoints import Failpoints
from model_fakes.responses import ResponsesServer
from tests.support.daemon import DaemonProcess


@pytest.fixture
def model() -> Iterator[ResponsesServer]:
    with ResponsesServer() as server:
        yield server


@pytest.fixture
def make_driver(model: ResponsesServer) -> Iterator[MakeDriver]:
    made: list[AppServerDriver] = []

    def make(failpoints: dict[str, str] | None = None, **config: Any) -> AppServerDriver:
        config.setdefault("command", [codex_bin()])
        config.setdefault("model", "mock-model")
        config.setdefault("model_base_url", model.base_url)
        driver = codex_driver(config, Failpoints(failpoints))
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


@pytest.fixture
def log() -> EventLog:
    return EventLog()


@pytest.fixture
def codex_daemon(tmp_path: Path, model: ResponsesServer) -> Iterator[DaemonProcess]:
    """A daemon at `tmp_path/home` whose Codex talks to `model`."""
    home = tmp_path / "home"
    write_config(home, model)
    d = DaemonProcess(home).start()
    try:
        yield d
    finally:
        d.stop()
