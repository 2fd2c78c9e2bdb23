"""`bench/stamp_site` (the stamps `bench.fork_daemon --stamps` and `bench.fork_hops` read)
against today's code: every point it wraps, in the daemon and in a worker, names a module, class
and method that exist (a worker point that is gone stamps nothing, silently: `ClaudeFork`'s
`begin_relocate` stayed listed for sessions after it was renamed)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

SITE = Path(__file__).resolve().parents[2] / "bench" / "stamp_site" / "sitecustomize.py"
ENV = ("AGENTHOST_STAMPS", "AGENTHOST_NAME_THREADS", "AGENTHOST_WRITE_STATS", "AGENTHOST_GC_TIMES")


def _site(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The site's module, inert (none of its switches set): its points and `unresolved`."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    spec = importlib.util.spec_from_file_location("stamp_site", SITE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stamp_point_names_a_function_of_todays_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = _site(monkeypatch)
    assert len(site.POINTS) > 10 and len(site.WORKER_POINTS) > 10
    assert site.unresolved() == []


def test_the_check_sees_a_point_that_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    site = _site(monkeypatch)
    gone = ("drivers.claude.fork", "ClaudeFork", "begin_relocate", "c.relocate", "c.relocate.end")
    monkeypatch.setattr(site, "WORKER_POINTS", (*site.WORKER_POINTS, gone))
    monkeypatch.setattr(
        site, "POINTS", (*site.POINTS, ("storage.no_such_module", "", "f", "x", ""))
    )
    missing = site.unresolved()
    assert "drivers.claude.fork.ClaudeFork.begin_relocate" in missing
    assert any(m.startswith("storage.no_such_module") for m in missing)
    assert len(missing) == 2
    assert os.environ.get("AGENTHOST_STAMPS") is None
