"""Suite-wide collection rule: tests marked `long` (extra providers or trials of a property that a
shorter test already pins in `make test`) run only in `make soak` (AGENTHOST_SOAK=1) or when
selected with `-m`; `make test` deselects them so the whole suite stays within its 15 minutes.
The packages' bytecode is written once per run, so the daemons the tests start do not compile
them each time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every daemon a test starts builds its accept shim (transport/accept_shim.py) once into the
# checkout's build folder, not into each test's private HOME.
os.environ.setdefault("AGENTHOST_NATIVE_DIR", str(ROOT / "build" / "native"))


def pytest_configure(config: pytest.Config) -> None:
    # The daemons, workers and providers the tests start are fresh interpreters: in a checkout
    # run with PYTHONDONTWRITEBYTECODE=1 each would compile every module it imports (~0.3 s of
    # CPU a daemon). Written once here, in the controller, as an install writes them.
    if hasattr(config, "workerinput"):
        return
    from bench.harness import byte_compile

    byte_compile(ROOT)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("AGENTHOST_SOAK") == "1" or config.getoption("markexpr"):
        return
    long = [item for item in items if item.get_closest_marker("long") is not None]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if item.get_closest_marker("long") is None]
