"""Fixtures for the driver tests: a real `WorkerSupervisor` in a tmp run dir; real
tutti-agent drivers (`make_driver`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import TUTTI_BIN

from drivers.app_server.driver import AppServerDriver
from drivers.failpoints import Failpoints
from drivers.supervisor import WorkerSupervisor
from drivers.tutti_agent import create_driver as tutti_agent_driver


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def supervisor(run_dir: Path) -> Iterator[WorkerSupervisor]:
    sup = WorkerSupervisor(run_dir)
    try:
        yield sup
    finally:
        sup.close()


@pytest.fixture
def make_driver() -> Iterator[Callable[..., AppServerDriver]]:
    """A tutti-agent driver per call (`failpoints` armed, the rest its config), each closed
    at the test's end."""
    made: list[AppServerDriver] = []

    def make(failpoints: dict[str, str] | None = None, **config: Any) -> AppServerDriver:
        config.setdefault("command", TUTTI_BIN)
        driver = tutti_agent_driver(config, Failpoints(failpoints))
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()
