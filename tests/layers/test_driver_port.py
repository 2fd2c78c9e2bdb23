"""The driver port carries fork.resolve: every provider driver implements `inspect_fork`,
`adopt_fork` and `quarantine_fork`, and the worker reaches them through the port, never by
probing a driver's attributes."""

from __future__ import annotations

import inspect
from pathlib import Path

from drivers.app_server.driver import AppServerDriver
from drivers.base import ProviderDriver
from drivers.claude.driver import ClaudeDriver

ROOT = Path(__file__).resolve().parents[2]
RESOLVE = ("inspect_fork", "adopt_fork", "quarantine_fork")


def test_the_port_declares_resolve_and_every_driver_implements_it() -> None:
    for name in RESOLVE:
        assert name in ProviderDriver.__dict__, name
        for driver in (AppServerDriver, ClaudeDriver):
            method = getattr(driver, name)
            assert inspect.isfunction(method), (driver.__name__, name)
            assert method.__annotations__.get("request") is not None


def test_no_resolution_module_probes_a_driver_with_hasattr() -> None:
    for path in (
        "drivers/app_server/resolution.py",
        "drivers/claude/resolution.py",
        "drivers/worker.py",
    ):
        assert "hasattr(" not in (ROOT / path).read_text(), path
