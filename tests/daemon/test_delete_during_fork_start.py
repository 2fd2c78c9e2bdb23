"""A `session.delete` that arrives while a `fork.create` of the same Session waits for its
runtime (a provider runtime slot, then `session.start`), before any operation exists.

Nothing fences the Session yet, so the delete used to commit at once, stop the runtime and
remove the Session's runtime directory; the fork's preparation then went on for a deleted
Session: `session.start` made its provider home again (left on disk for a Session that is
gone) and failed in it, and the fork was answered 502 `agent_session_fork_failed` (its
message an internal error of the worker). Then the delete waited for the preparation to end,
as long as the fork waited for a slot (with every slot busy: until another Session's Turn
ended). Now the fork, accepted first, goes first and the delete meets it at once: 409
`agent_session_fork_in_progress` (retryable), while the fork still waits.

Through the real daemon and tutti-agent: one runtime slot (`max_runtimes_per_provider = 1`)
held by another Session's Turn waiting on a question, so the fork queues for the slot until
the question is answered."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_fork_saga import until_terminal
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    respond,
    run_turn,
    settle,
    submit,
    wait_for,
)
from tests.support.git_repos import pending_request
from tests.support.homes import processes_naming
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.timeout(180)


def _queued_forks(d: DaemonProcess) -> int:
    runtimes = d.client().call("host.status")["runtimes"]
    return int((runtimes.get("tutti-agent") or {}).get("queuedForks", 0))


def test_a_delete_during_a_forks_runtime_wait_meets_the_fork_at_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nmax_runtimes_per_provider = 1\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        source = create_session(c, title="source")["agentSessionId"]
        boundary = run_turn(c, source, "hello")
        source_home = home / "runtimes" / WS / source
        assert source_home.is_dir()
        holder = create_session(c)["agentSessionId"]
        held = submit(c, holder, "/ask hold the only runtime slot")["turnId"]
        question = pending_request(c, holder, held)

        answers: dict[str, tuple[int, dict[str, Any]]] = {}

        def call(name: str, method: str, params: dict[str, Any]) -> None:
            answers[name] = d.client(timeout=90).call_raw(method, params, timeout=90)

        fork = threading.Thread(
            target=call, args=("fork", "fork.create", fork_params(WS, source, boundary["turnId"]))
        )
        fork.start()
        # The fork waits for the slot: no operation, no fence yet.
        wait_for(lambda: _queued_forks(d) == 1, 30)
        # The delete is answered while the fork still waits (the holder's question is
        # unanswered: the slot stays held): it meets the fork, accepted first.
        delete_status, delete_body = d.client(timeout=30).call_raw(
            "session.delete", {"workspaceId": WS, "agentSessionId": source}, timeout=30
        )
        assert _queued_forks(d) == 1
        assert "fork" not in answers
        respond(c, holder, held, question, {"text": "yes"})
        settle(c, holder, held)
        fork.join(90)
        fork_status, fork_body = answers["fork"]

        # The fork goes on: the delete changed nothing.
        assert fork_status in (200, 202), (fork_status, fork_body, delete_status, delete_body)
        assert delete_status == 409, (delete_status, delete_body)
        assert delete_body["reason"] == "agent_session_fork_in_progress", delete_body
        assert delete_body["retryable"] is True, delete_body
        op = until_terminal(c, fork_body["operation"])
        assert op["status"] == "committed", op
        # The source is whole: its runtime home was never removed under its fork.
        assert c.call("session.get", {"workspaceId": WS, "agentSessionId": source})["session"]
        assert source_home.is_dir()

        # Deleted now, once the fork ended: its runtime directory goes and stays gone.
        c.call("session.delete", {"workspaceId": WS, "agentSessionId": source})
        wait_for(lambda: not source_home.exists(), 30)
    finally:
        d.stop()
    assert not source_home.exists()
    assert_invariants(home)


def test_a_delete_after_an_interrupt_during_a_turns_slot_wait_is_applied_at_once(
    tmp_path: Path,
) -> None:
    """A Turn whose runtime waits for the slot, interrupted there (settled at once: nothing
    reached the provider), then its Session deleted: the delete is applied at once, while the
    preparation still waits, and the preparation, granted its slot later, starts nothing. Run
    at once before, the preparation then made the deleted Session's provider home again and
    started a runtime in it, both left behind; then the delete waited for the slot. A later
    Turn or fork of the Session gets what a deleted Session gets."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "agenthost.toml").write_text("[daemon]\nmax_runtimes_per_provider = 1\n")
    d = DaemonProcess(home).start()
    try:
        c = d.client(timeout=60)
        source = create_session(c, title="source")["agentSessionId"]
        boundary = run_turn(c, source, "hello")
        source_home = home / "runtimes" / WS / source
        holder = create_session(c)["agentSessionId"]
        held = submit(c, holder, "/ask hold the only runtime slot")["turnId"]
        question = pending_request(c, holder, held)
        # The source's runtime went for the holder's; its next Turn queues for the slot.
        waiting = submit(c, source, "queued for the slot")["turnId"]
        wait_for(lambda: _queued(d) == 1, 30)
        c.call("turn.interrupt", {"workspaceId": WS, "agentSessionId": source, "turnId": waiting})
        assert settle(c, source, waiting)["outcome"] == "interrupted"

        # Answered while the slot is still held (the holder's question unanswered).
        status, body = d.client(timeout=30).call_raw(
            "session.delete", {"workspaceId": WS, "agentSessionId": source}, timeout=30
        )
        assert status == 200, (status, body)
        assert _queued(d) == 1
        wait_for(lambda: not source_home.exists(), 30)
        # Mutations after it get what a deleted Session gets.
        later = [
            c.call_raw(
                "turn.submit",
                {
                    "workspaceId": WS,
                    "agentSessionId": source,
                    "requestId": "after-the-delete",
                    "input": [{"type": "text", "text": "after"}],
                },
            ),
            c.call_raw("fork.create", fork_params(WS, source, boundary["turnId"])),
        ]
        assert [s for s, _ in later] == [404, 404], later
        assert {b["reason"] for _, b in later} == {"workspace_agent_session_not_found"}, later

        respond(c, holder, held, question, {"text": "yes"})
        settle(c, holder, held)
        # The source's preparation is over (nothing queued or starting): its directory stays
        # gone, not made again by it, and no runtime of it lives.
        wait_for(lambda: _queued(d) == 0 and _starting(d) == 0, 30)
        assert not source_home.exists()
        assert _runtimes(d)["live"] <= 1
    finally:
        d.stop()
    assert not source_home.exists()
    assert_invariants(home)


def test_a_delete_beside_a_turns_runtime_start_is_applied_at_once(tmp_path: Path) -> None:
    """A delete while a Turn's `session.start` is in progress (the Turn interrupted meanwhile)
    is applied at once, not after the start (it waited up to `session_start_s`): 200 while the
    start is still held, and a `turn.submit` after it gets what a deleted Session gets (404).
    Once the start ends, its answer is discarded: the runtime it started is stopped and the
    Session's runtime directory goes and stays gone.

    The start is held by the real `tutti-agent` behind a front that waits while a file
    exists (`_held_tutti`)."""
    home = tmp_path / "home"
    home.mkdir()
    hold = tmp_path / "hold"
    (home / "agenthost.toml").write_text(
        "[daemon]\nmax_runtimes_per_provider = 1\n" + _held_tutti(tmp_path, hold)
    )
    d = DaemonProcess(home).start()
    source_home = home / "runtimes" / WS
    try:
        c = d.client(timeout=60)
        source = create_session(c, title="source")["agentSessionId"]
        source_home = source_home / source
        run_turn(c, source, "hello")
        # Another Session's Turn takes the only slot: the source's runtime is evicted, and
        # its next Turn starts one (`session.start`), held by the front.
        run_turn(c, create_session(c)["agentSessionId"], "evicts the source's runtime")
        hold.touch()
        cold = submit(c, source, "its runtime start is held")["turnId"]
        wait_for(lambda: Path(f"{hold}.met").exists(), 30)
        c.call("turn.interrupt", {"workspaceId": WS, "agentSessionId": source, "turnId": cold})
        assert settle(c, source, cold)["outcome"] == "interrupted"

        status, body = d.client(timeout=30).call_raw(
            "session.delete", {"workspaceId": WS, "agentSessionId": source}, timeout=30
        )
        assert status == 200, (status, body)
        assert _starting(d) == 1  # answered while the start is still held
        later = c.call_raw(
            "turn.submit",
            {
                "workspaceId": WS,
                "agentSessionId": source,
                "requestId": "after-the-delete",
                "input": [{"type": "text", "text": "after the delete"}],
            },
        )
        assert (later[0], later[1].get("reason")) == (404, "workspace_agent_session_not_found")
        hold.unlink()  # the start goes on, for a Session that is gone
        wait_for(lambda: _starting(d) == 0, 30)
        # Its runtime is stopped and its directory removed once it answered.
        wait_for(lambda: not processes_naming(source), 30)
        wait_for(lambda: not source_home.exists(), 30)
        assert _runtimes(d)["live"] == 0  # its slot is free
        # Another Session's Turn gets the slot the deleted Session's start held.
        assert run_turn(c, create_session(c)["agentSessionId"], "next")["outcome"] == "completed"
    finally:
        if hold.exists():
            hold.unlink()
        d.stop()
    assert not source_home.exists()
    assert_invariants(home)


def _held_tutti(tmp_path: Path, hold: Path) -> str:
    """The `[providers.tutti-agent]` table of a `tutti-agent` (the real one beside this
    Python) whose every start waits while `hold` exists (and then makes `<hold>.met`: a
    `session.start` is in the worker)."""
    real = Path(sys.executable).parent / "tutti-agent"
    front = tmp_path / "held-tutti-agent"
    front.write_text(
        f"#!/bin/sh\n[ -e '{hold}' ] && touch '{hold}.met'\n"
        f"while [ -e '{hold}' ]; do sleep 0.05; done\nexec '{real}' \"$@\"\n"
    )
    front.chmod(0o755)
    return f'[providers."tutti-agent"]\ncommand = ["{front}"]\n'


def _runtimes(d: DaemonProcess) -> dict[str, Any]:
    return dict(d.client().call("host.status")["runtimes"].get("tutti-agent") or {})


def _queued(d: DaemonProcess) -> int:
    return int(_runtimes(d).get("queued", 0))


def _starting(d: DaemonProcess) -> int:
    return int(_runtimes(d).get("starting", 0))
