"""`bench/turn_stamp_site` (the stamps `bench.turn_split` reads) against today's code: every
point it wraps names a module, class and method that exist, and a `bench.turn_overhead
--smoke` run through the daemon stamps every leg `bench.turn_split` prints, in every timed host
Turn (a point whose method is bound before the site wraps it, or whose step moved, stamps
nothing: the three that did so went unnoticed until a run printed no end path)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench import turn_split

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "bench" / "turn_stamp_site"


def _site() -> ModuleType:
    """The site's module, inert (no `AGENTHOST_TURN_STAMPS`): its points and `unresolved`."""
    spec = importlib.util.spec_from_file_location("turn_stamp_site", SITE / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    env = os.environ.pop("AGENTHOST_TURN_STAMPS", None)
    try:
        spec.loader.exec_module(module)
    finally:
        if env is not None:
            os.environ["AGENTHOST_TURN_STAMPS"] = env
    return module


def test_every_stamp_point_names_a_method_of_todays_code(monkeypatch: pytest.MonkeyPatch) -> None:
    site = _site()
    assert site.unresolved() == []
    # The check sees a point that names what is gone (the stale `d.batch`'s kind of point).
    gone = ("actors.turn_writes", "TurnWrites", "_no_such_step", "d.x", "", None)
    monkeypatch.setattr(site, "POINTS", (*site.POINTS, gone))
    assert site.unresolved() == ["actors.turn_writes.TurnWrites._no_such_step"]


@pytest.mark.timeout(90)
def test_a_smoke_run_stamps_every_leg_turn_split_prints(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        AGENTHOST_TURN_STAMPS=str(tmp_path),
        AGENTHOST_BENCH_PROVIDERS="tutti-agent",
        PYTHONPATH=f"{SITE}{os.pathsep}{REPO}",
    )
    run = subprocess.run(
        [sys.executable, "-m", "bench.turn_overhead", "--smoke", "--json", "bench.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    per_turn, _ = turn_split.per_turn_stamps(tmp_path, "tutti-agent")
    assert per_turn
    missing = [
        label
        for label, spans, optional in turn_split.legs(per_turn)
        if not optional and len(spans) < len(per_turn)
    ]
    assert missing == [], missing
    out = subprocess.run(
        [sys.executable, "-m", "bench.turn_split", str(tmp_path), "tutti-agent"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(no stamps)" not in out.stdout and "the settlement's COMMIT" in out.stdout, out.stdout
