"""A Codex app-server's stderr and its answers, with the real `codex app-server` 0.171.0: what
it wrote before it failed to start is named in the start's error, a server that floods its
stderr fills its home's `.app-server.log` only up to the log's bound (the rest is dropped and
counted), and an error answer whose code is no integer fails its request in its words."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from codex_helpers import (
    EventLog,
    MakeDriver,
    codex_bin,
    home_of,
    relayed,
    run_turns,
    start,
)

from drivers.app_server.process import STDERR_LOG_BYTES
from drivers.errors import DriverError

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]


def test_a_codex_that_fails_to_start_is_named_with_what_it_wrote_on_stderr(
    make_driver: MakeDriver, tmp_path: Path
) -> None:
    """`codex --no-such-flag app-server` exits 2 with clap's words on stderr: the start's
    error carries them (the tail of the server's stderr), not only "exited with status 2"."""
    driver = make_driver(command=[codex_bin(), "--no-such-flag"])
    with pytest.raises(DriverError) as raised:
        start(driver, tmp_path, "src")
    assert raised.value.reason == "provider_start_failed", raised.value
    assert "--no-such-flag" in str(raised.value), raised.value
    log = home_of(tmp_path, "src") / ".app-server.log"
    assert b"--no-such-flag" in log.read_bytes()


def test_a_codex_app_server_flooding_its_stderr_fills_its_log_only_to_the_bound(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """A server that writes 3 × the bound to its stderr while it serves Turns: the Turns
    complete, its home's log ends at the bound plus one line saying how much was dropped."""
    flood = 3 * STDERR_LOG_BYTES
    done = tmp_path / "flood.done"
    script = tmp_path / "codex-flooding"
    script.write_text(
        "#!/bin/sh\n"
        f"( head -c {flood} /dev/zero | tr '\\0' x >&2; touch {done} ) &\n"
        f'exec {codex_bin()} "$@"\n'
    )
    script.chmod(0o755)
    driver = make_driver(command=[str(script)])
    start(driver, tmp_path, "src")
    run_turns(driver, log, "src", ("one", "two"))
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.exists(), "the flood never ended"
    driver.stop_session({"agentSessionId": "src"})
    data = (home_of(tmp_path, "src") / ".app-server.log").read_bytes()
    assert len(data) <= STDERR_LOG_BYTES + 200, len(data)
    assert data.rstrip().endswith(b"bytes of stderr dropped past the log's bound]"), data[-200:]


def test_an_error_answer_with_a_code_that_is_no_integer_fails_the_request_in_its_words(
    make_driver: MakeDriver, tmp_path: Path
) -> None:
    """`thread/start` answered `{"error": {"code": "oops", "message": "relay refused"}}` (a
    real Codex behind a relay that rewrites its answer): the start fails typed, in the
    answer's words, as any error answer does; the request is not left to wait out its timeout
    (the reader dropped it, raising on the code, after it took it off the pending table)."""
    calls = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("bad_error_code", calls), request_timeout_s=20)
    with pytest.raises(DriverError) as raised:
        start(driver, tmp_path, "src")
    assert raised.value.reason == "provider_session_unavailable", raised.value
    assert "relay refused" in str(raised.value), raised.value


def test_an_answer_for_the_id_true_is_no_answer_to_request_1(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    """An answer whose id is `true` (no request has it; JSON-RPC ids are numbers or strings)
    written before the real `initialize` answer (request 1): dropped, so the real one is read
    and the attestation is Codex's (before, `true` was taken for 1: the Session was attested
    as `bogus/0.0.1`, its forks refused)."""
    driver = make_driver(command=relayed("bool_id", tmp_path / "calls.jsonl"))
    started = start(driver, tmp_path, "src")
    context = started["runtimeContext"]
    assert context["userAgent"] != "bogus/0.0.1", context
    assert context["forkThroughTurn"] is True, context
    run_turns(driver, log, "src", ("one",))
