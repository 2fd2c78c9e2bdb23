"""The failpoint registry in-process: parsing, each action, `once:` across processes via the
state dir, run-time re-arming."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from drivers.errors import FailpointError
from drivers.failpoints import Failpoints, FailpointSpec, format_points, parse_points


def test_env_string_parses_every_action_and_round_trips() -> None:
    text = "a=kill;b=once:error; c = sleep:25 ;d=hang;e=off"
    points = parse_points(text)
    assert points == {"a": "kill", "b": "once:error", "c": "sleep:25", "d": "hang", "e": "off"}
    assert parse_points(format_points(points)) == points


def test_once_before_the_name_arms_the_named_point_once() -> None:
    assert parse_points("once:a=error;once:b=sleep:5") == {"a": "once:error", "b": "once:sleep:5"}
    fp = Failpoints({"once:a": "error"})
    assert fp.snapshot() == {"a": "once:error"}
    with pytest.raises(ValueError):
        parse_points("once:=kill")


@pytest.mark.parametrize("bad", ["a=boom", "a=sleep:x", "a=sleep", "=kill", "a"])
def test_malformed_entries_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_points(bad)


def test_spec_keeps_once_and_milliseconds() -> None:
    spec = FailpointSpec.parse("once:sleep:7")
    assert spec.once and spec.sleep_ms == 7 and str(spec) == "once:sleep:7"


def test_unarmed_point_does_nothing() -> None:
    Failpoints().hit("worker.fork.before_provider_call")


def test_error_point_raises_typed_failpoint_error_every_time() -> None:
    fp = Failpoints({"x": "error"})
    for _ in range(2):
        with pytest.raises(FailpointError) as info:
            fp.hit("x")
    assert info.value.params == {"failpoint": "x"}
    fp.hit("y")


def test_once_fires_only_on_the_first_hit_and_rearming_restores_it() -> None:
    fp = Failpoints({"x": "once:error"})
    with pytest.raises(FailpointError):
        fp.hit("x")
    fp.hit("x")
    fp.set({"x": "once:error"})
    with pytest.raises(FailpointError):
        fp.hit("x")


def test_once_spent_in_one_process_is_spent_for_another_sharing_the_state_dir(
    tmp_path: Path,
) -> None:
    first = Failpoints({"x": "once:error"}, state_dir=tmp_path)
    with pytest.raises(FailpointError):
        first.hit("x")
    # A restarted process arms the same env string but must not fire again.
    Failpoints({"x": "once:error"}, state_dir=tmp_path).hit("x")


def test_off_disarms_a_point() -> None:
    fp = Failpoints({"x": "error"})
    assert fp.set({"x": "off"}) == {}
    fp.hit("x")


def test_sleep_point_continues_after_sleeping() -> None:
    fp = Failpoints({"x": "sleep:1"})
    started = time.monotonic()
    fp.hit("x")
    assert time.monotonic() >= started  # returns rather than raising or hanging


def test_bad_map_leaves_registry_unchanged() -> None:
    fp = Failpoints({"x": "error"})
    with pytest.raises(ValueError):
        fp.set({"y": "kill", "z": "nope"})
    assert fp.snapshot() == {"x": "error"}


def test_env_configures_points_and_state_dir(tmp_path: Path) -> None:
    fp = Failpoints.from_env(
        {"AGENTHOST_FAILPOINTS": "x=once:error", "AGENTHOST_FAILPOINTS_STATE": str(tmp_path)}
    )
    with pytest.raises(FailpointError):
        fp.hit("x")
    assert (tmp_path / "fired.x").exists()


def test_hang_holds_until_the_point_is_disarmed() -> None:
    fp = Failpoints({"p": "hang"})
    passed = threading.Event()
    hung = threading.Thread(target=lambda: (fp.hit("p"), passed.set()), daemon=True)
    hung.start()
    assert not passed.wait(0.3)  # held while armed
    fp.set({"other": "error"})  # a change to another point does not release it
    assert not passed.wait(0.3)
    fp.set({"p": "off"})
    assert passed.wait(5)


def test_a_once_point_whose_state_dir_was_removed_still_fires_typed(tmp_path: Path) -> None:
    # The daemon's `run/` (the state dir's parent) removed under it, as a cleaner of /tmp does:
    # the point fires once in this process, typed (it raised a bare FileNotFoundError where a
    # Turn's start hit it), and makes no directory (`run/` is the daemon's to make, 0700).
    state = tmp_path / "run" / "failpoints-host"
    state.mkdir(parents=True)
    fp = Failpoints({"x": "once:error"}, state_dir=state)
    (tmp_path / "run" / "failpoints-host").rmdir()
    (tmp_path / "run").rmdir()
    with pytest.raises(FailpointError):
        fp.hit("x")
    fp.hit("x")
    assert not (tmp_path / "run").exists()
