"""Fixtures for the Tutti Agent tests: an app-server subprocess factory on tmp homes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tutti_agent.appserver import TUTTI_AGENT, AppServerProcess, tutti_env


@pytest.fixture
def tutti_server(tmp_path: Path) -> Iterator[Callable[..., AppServerProcess]]:
    """Factory: start `tutti-agent app-server` (initialized) on this test's tmp home."""
    started: list[AppServerProcess] = []

    def start(*, extra_args: list[str] | None = None, **kwargs: Any) -> AppServerProcess:
        env = tutti_env(tmp_path, **kwargs.pop("env", {}))
        server = AppServerProcess(TUTTI_AGENT + (extra_args or []), env, **kwargs)
        started.append(server)
        server.initialize()
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.close()
