"""A tutti-agent fork validates the source's rollout into the binder's spans while the provider
forks (`ForkThroughTurn._validate_ahead`, `RolloutBinder.validate_ahead`): the bind then takes the
lines the child copied from the source, compared byte for byte, and decodes only the child's own.
Only a cache is warmed: a copy damaged after the bind still makes the fork `unknown`, a source
under `AHEAD_MIN_BYTES` is left to the bind, and Codex (whose Referenced child copies nothing)
never validates ahead."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drv_helpers import EventLog
from test_tutti_driver import fork_request, open_session

import drivers.binder as binder_module
from domain.enums import DeliveryDisposition
from drivers.app_server.driver import AppServerDriver
from drivers.binder import iter_rollouts
from drivers.codex.driver import CodexProvider

Make = Callable[..., AppServerDriver]
pytestmark = pytest.mark.timeout(90)


def test_the_first_fork_of_a_big_source_binds_its_copied_lines_from_the_source_validated_ahead(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binder_module, "AHEAD_MIN_BYTES", 0)  # every source counts as big
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path)
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "c1"))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None
    assert result.binding.receipt["readabilityProof"] == "in_worker"
    # The worker bound nothing before: the source's parse ahead found no span (a miss), and
    # the child's bind took the source's (a hit).
    assert (driver.binder.spans.hits, driver.binder.spans.misses) == (1, 1)
    # A fork through an earlier Turn takes the run of whole lines it shares with the span.
    early = driver.fork(fork_request(home, thread_id, version, turns[:1], tmp_path / "c2"))
    assert early.disposition is DeliveryDisposition.ACCEPTED, early.error
    assert driver.binder.spans.hits == 2


def test_a_small_source_is_left_to_the_bind(make_driver: Make, tmp_path: Path) -> None:
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path)
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "c1"))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert (driver.binder.spans.hits, driver.binder.spans.misses) == (0, 1)


def test_a_copy_tampered_after_a_bind_from_the_spans_is_still_unknown(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binder_module, "AHEAD_MIN_BYTES", 0)
    driver = make_driver({"worker.bind.after_copy": "tamper"})
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path, texts=("a", "b"))
    target = tmp_path / "t"
    result = driver.fork(fork_request(home, thread_id, version, turns, target))
    assert driver.binder.spans.hits == 1  # the bind took the source's lines validated ahead
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert result.error is not None and "not readable from its home" in result.error
    [copied] = list(iter_rollouts(target))
    assert len(copied.read_bytes().splitlines()) == 1


def test_only_a_provider_whose_child_copies_the_source_validates_ahead() -> None:
    assert CodexProvider.fork_copies_source is False


def test_the_proofs_derivations_are_made_on_a_thread_while_the_bind_writes(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binder_module, "AHEAD_MIN_BYTES", 0)
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path)
    order: list[tuple[str, str]] = []
    provider = driver.provider
    real_derive, real_read = provider.derive_for_proof, provider.read_child

    def derive(known: Any) -> None:
        order.append(("derive", threading.current_thread().name))
        real_derive(known)

    def read_child(*args: Any, **kwargs: Any) -> Any:
        order.append(("read", threading.current_thread().name))
        return real_read(*args, **kwargs)

    monkeypatch.setattr(provider, "derive_for_proof", derive)
    monkeypatch.setattr(provider, "read_child", read_child)
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "c1"))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    fork_thread = threading.current_thread().name
    assert order == [("derive", "derive-for-proof"), ("read", fork_thread)]


def test_the_forks_re_attestation_starts_the_validation_and_the_fork_joins_it(
    make_driver: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runtime.attest` (sent only by a fork, right before its dispatch) on the source's live
    runtime starts the source's validation; the fork finds it done or running and joins it
    rather than parsing the source a second time."""
    monkeypatch.setattr(binder_module, "AHEAD_MIN_BYTES", 0)
    driver = make_driver()
    home, thread_id, version, turns = open_session(driver, EventLog(), tmp_path)
    started: list[str] = []
    real_validate = driver.binder.validate_ahead

    def validate(at: Path, thread: str) -> bool:
        started.append(threading.current_thread().name)
        return real_validate(at, thread)

    monkeypatch.setattr(driver.binder, "validate_ahead", validate)
    driver.attest({"home": str(home), "cwd": str(tmp_path)})
    # Started by the attestation, before any fork: running, or done (its span kept).
    running = driver.binder._running.get((str(home), thread_id))
    if running is not None:
        running.join()
    assert not driver.binder.wants_ahead(home, thread_id)
    assert started == ["validate-ahead"]
    result = driver.fork(fork_request(home, thread_id, version, turns, tmp_path / "c1"))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert started == ["validate-ahead"]  # once, on its own thread, from the attestation
    assert (driver.binder.spans.hits, driver.binder.spans.misses) == (1, 1)
