"""The domain's words are defined once: every old home re-exports the same object, the one
code → status table gives every typed error its status, and the fork state machine as data
agrees with the contract (ARCHITECTURE.md "Contract decision") and with the store's SQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import agenthost.catalog
import drivers.base
import drivers.errors
import storage.models
from domain import errors, fork_states, providers
from domain.fork_states import ForkStatus

PRODUCTION = ("domain", "storage", "actors", "transport", "drivers", "tutti_agent", "agenthost",
              "client", "model_fakes", "workspace", "protocol")  # fmt: skip


def test_no_module_re_exports_a_name_it_imports() -> None:
    """`from x import Y as Y` is the explicit re-export mypy --strict honours; with none, every
    importer (checked by mypy --strict: no implicit re-export) names the defining module."""
    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"import (\w+) as \1\b")
    found = [
        f"{path.relative_to(root)}: {m.group(0)}"
        for package in PRODUCTION
        for path in sorted((root / package).rglob("*.py"))
        for m in pattern.finditer(path.read_text())
    ]
    assert len(list((root / "storage").rglob("*.py"))) > 10  # the walk found the packages
    assert found == []


def test_the_typed_errors_have_one_home() -> None:
    """`domain.errors` is where every typed error is imported from: no module re-exports it."""
    import importlib.util

    assert importlib.util.find_spec("storage.errors") is None


def test_every_typed_error_takes_its_status_from_the_one_table() -> None:
    def subclasses(cls: type[errors.HostError]) -> list[type[errors.HostError]]:
        found = [cls]
        for sub in cls.__subclasses__():
            found.extend(subclasses(sub))
        return found

    for cls in subclasses(errors.HostError):
        if cls is drivers.errors.WorkerError:
            continue  # takes code and status from the worker's answer, checked below
        assert cls.status == errors.STATUS_BY_CODE[cls.code], cls


@pytest.mark.parametrize("code", sorted(errors.STATUS_BY_CODE))
def test_a_worker_error_map_gets_its_status_from_the_table(code: str) -> None:
    err = drivers.errors.WorkerError({"code": code, "reason": "r", "message": "m"})
    assert err.status == errors.STATUS_BY_CODE[code]
    assert drivers.errors.WorkerError({"code": "no_such_code"}).status == 500


def test_the_provider_list_is_one() -> None:
    assert providers.PROVIDERS == ("tutti-agent", "codex", "claude-code")
    assert agenthost.catalog.Catalog().providers() == providers.PROVIDERS


def test_restart_rule() -> None:
    assert fork_states.after_restart(ForkStatus.PREPARED) is ForkStatus.FAILED
    assert fork_states.after_restart(ForkStatus.DISPATCHING) is ForkStatus.UNKNOWN
    assert fork_states.after_restart(ForkStatus.PROVIDER_ACCEPTED) is ForkStatus.COMMITTED
    for status in fork_states.TERMINAL:
        assert fork_states.after_restart(status) is None
    # Every restart move is an allowed transition.
    for status in fork_states.ACTIVE:
        to = fork_states.after_restart(status)
        assert to is not None and fork_states.can_transition(status, to)
    # `unknown` is left only by fork.resolve (adopt or abandon), never by a restart.
    assert fork_states.TRANSITIONS[ForkStatus.UNKNOWN] == {
        ForkStatus.PROVIDER_ACCEPTED,
        ForkStatus.ABANDONED,
    }


def test_transitions_and_sets() -> None:
    assert fork_states.sources_of(ForkStatus.DISPATCHING) == (ForkStatus.PREPARED,)
    assert fork_states.sources_of(ForkStatus.FAILED) == (
        ForkStatus.PREPARED,
        ForkStatus.DISPATCHING,
    )
    assert fork_states.sources_of(ForkStatus.UNKNOWN) == (ForkStatus.DISPATCHING,)
    assert fork_states.sources_of(ForkStatus.COMMITTED) == (ForkStatus.PROVIDER_ACCEPTED,)
    # The transitions' guard table is `sources_of` of every status, nothing else.
    assert dict(fork_states.SOURCES) == {to: fork_states.sources_of(to) for to in ForkStatus}
    terminal = {ForkStatus.COMMITTED, ForkStatus.FAILED, ForkStatus.UNKNOWN, ForkStatus.ABANDONED}
    assert terminal == fork_states.TERMINAL
    assert set(ForkStatus) - fork_states.TERMINAL == fork_states.ACTIVE


def test_barrier_rule() -> None:
    for status in ForkStatus:
        expected = status in fork_states.ACTIVE or status is ForkStatus.UNKNOWN
        assert fork_states.holds_barrier(status, client_observed=True) is expected
        expected_unacked = expected or status is ForkStatus.COMMITTED
        assert fork_states.holds_barrier(status, client_observed=False) is expected_unacked


def test_generated_sql_is_the_spelling_the_store_used() -> None:
    assert fork_states.ACTIVE_SQL == "('prepared', 'dispatching', 'provider_accepted')"
    # Comparisons, not `IN (…)`: the barrier index's WHERE since schema v20 (no ephemeral
    # B-tree per status change; tests/storage/test_fork_status_ephemeral.py).
    assert fork_states.BARRIER_RULE_SQL == (
        "(status = 'prepared' OR status = 'dispatching' OR status = 'provider_accepted'"
        " OR status = 'unknown' OR (status = 'committed' AND client_observed_at_ms IS NULL))"
    )
    # The barrier's set as its flag (schema v22): the status steps never name it.
    assert fork_states.BARRIER_SQL == "barrier = 1"


def test_the_store_sql_sets_decide_exactly_what_the_domain_rules_decide() -> None:
    """The barrier and fence are decided in SQL (inside the write transaction); the SQL is
    generated from the domain's rules and must agree with them on every status, ACKed or not
    (there is no second, Python spelling of the barrier on `ForkOperation`)."""
    import sqlite3

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE fork_operations (status TEXT, client_observed_at_ms INTEGER)")
    rows = [(s.value, acked) for s in ForkStatus for acked in (None, 1)]
    conn.executemany("INSERT INTO fork_operations VALUES (?, ?)", rows)
    barrier = set(
        conn.execute(
            "SELECT status, client_observed_at_ms FROM fork_operations"
            f" WHERE {fork_states.BARRIER_RULE_SQL}"
        )
    )
    assert barrier == {
        (s, acked)
        for s, acked in rows
        if fork_states.holds_barrier(ForkStatus(s), acked is not None)
    }
    active = {
        s
        for (s,) in conn.execute(
            f"SELECT status FROM fork_operations WHERE status IN {fork_states.ACTIVE_SQL}"
        )
    }
    assert active == {s.value for s in fork_states.ACTIVE}
    assert not hasattr(storage.models.ForkOperation, "holds_barrier")


def test_internal_errors_have_one_builder() -> None:
    """Every 500 `internal` is built by `domain.errors.internal_error` (which logs the text under
    a reference id and never sends it): no other module spells one."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spellings = ('"internal error', '"code": "internal"', "reason=WireReason.INTERNAL_ERROR")
    offenders = [
        f"{path.relative_to(root)}: {spelling}"
        for pkg in ("domain", "storage", "actors", "transport", "drivers", "agenthost")
        for path in sorted((root / pkg).rglob("*.py"))
        if path != root / "domain" / "errors.py"
        for spelling in spellings
        if spelling in path.read_text()
    ]
    assert offenders == []
    error = errors.internal_error(ValueError("secret /path"), "a test")
    assert (error.status, error.code, error.reason) == (500, "internal", "internal_error")
    assert "secret" not in error.message and "ValueError" in error.message
    assert "(ref " in error.message
