"""The daemon process runs with the GIL switch interval of `agenthost.gil_policy` (CPython's
5 ms), and a measurement may set another through `AGENTHOST_SWITCH_INTERVAL_MS`.

The process test starts a real daemon (real store, real worker) and reads the interval it
logged at start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agenthost import gil_policy
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.timeout(120)


def test_the_interval_is_the_policys_unless_the_environment_names_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(gil_policy.SWITCH_INTERVAL_ENV, raising=False)
    assert gil_policy.switch_interval_s() == gil_policy.SWITCH_INTERVAL_S
    assert gil_policy.SWITCH_INTERVAL_S == 0.005  # CPython's: nothing shorter measured better
    monkeypatch.setenv(gil_policy.SWITCH_INTERVAL_ENV, "0.25")
    assert gil_policy.switch_interval_s() == pytest.approx(0.00025)
    for unusable in ("", "fast", "0", "-1"):
        monkeypatch.setenv(gil_policy.SWITCH_INTERVAL_ENV, unusable)
        assert gil_policy.switch_interval_s() == gil_policy.SWITCH_INTERVAL_S


def test_apply_sets_the_process_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    previous = sys.getswitchinterval()
    monkeypatch.setenv(gil_policy.SWITCH_INTERVAL_ENV, "2")
    try:
        assert gil_policy.apply() == pytest.approx(0.002)
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(previous)  # this is the test process, not a daemon


@pytest.mark.parametrize(("env", "logged"), [("", "5.00 ms"), ("0.5", "0.50 ms")])
def test_the_daemon_process_runs_with_the_interval(tmp_path: Path, env: str, logged: str) -> None:
    # An empty value is the policy's own (whatever the caller's environment holds).
    d = DaemonProcess(tmp_path / "home", env={gil_policy.SWITCH_INTERVAL_ENV: env}).start()
    try:
        d.client(timeout=60)
    finally:
        assert d.stop() == 0
    assert f"GIL switch interval {logged}" in d.log_path.read_text(errors="replace")
