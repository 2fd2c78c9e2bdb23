"""Suite-wide collection rule: tests marked `long` (extra providers or trials of a property that a
shorter test already pins in `make test`) run only in `make soak` (AGENTHOST_SOAK=1) or when
selected with `-m`; `make test` deselects them so the whole suite stays within its 15 minutes."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("AGENTHOST_SOAK") == "1" or config.getoption("markexpr"):
        return
    long = [item for item in items if item.get_closest_marker("long") is not None]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if item.get_closest_marker("long") is None]
