"""Fixtures for the driver tests: a real `WorkerSupervisor` in a tmp run dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.supervisor import WorkerSupervisor


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
