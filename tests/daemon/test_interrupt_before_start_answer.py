"""An interrupt that reaches the Session actor while its Turn's `turn.start` is still at the
worker (sent, not answered) stops the turn at the provider. It used to settle the Turn
`interrupted` in the host alone: the provider went on running it, and the Session's next Turn
was refused by the worker as "a turn is already active" (seen as a flake of the CLI's
interrupt test under load). The worker holds `turn.start` (`worker.turn.before_start`, a
sleep) so the interrupt lands in that window every time.

An in-process daemon (real store file, real worker and tutti-agent app-server)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from agenthost.daemon import Daemon
from tests.support.daemon import WS, create_session, run_turn, settle, submit, wait_for
from tests.support.in_process import in_process_daemon
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


def _sent_and_answered(daemon: Daemon) -> tuple[list[str], list[str]]:
    """The worker requests the daemon sends, and those answered, by method (each still sent
    to the real worker)."""
    sent: list[str] = []
    answered: list[str] = []
    port = daemon.ctx.workers
    real: Callable[..., Future[Any]] = port._call  # type: ignore[attr-defined]

    def send(provider: str, method: str, params: Any, timeout: float, *parse: Any) -> Future[Any]:
        sent.append(method)
        fut = real(provider, method, params, timeout, *parse)
        fut.add_done_callback(lambda _f: answered.append(method))
        return fut

    port._call = send  # type: ignore[attr-defined]
    return sent, answered


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, Client]]:
    monkeypatch.setenv("AGENTHOST_ENABLE_FAILPOINTS", "1")
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def test_an_interrupt_while_turn_start_is_unanswered_stops_the_turn_at_the_provider(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    sid = create_session(c, title="interrupt early")["agentSessionId"]
    c.call("debug.failpoints", {"points": {"worker.turn.before_start": "once:sleep:1500"}})
    sent, answered = _sent_and_answered(daemon)
    slow = submit(c, sid, "/slow 30000 never")
    # The Session's first Turn: `session.start` first, then `turn.start` (no runtime generation
    # the worker could refuse it by) is at the worker.
    wait_for(lambda: "turn.start" in sent)
    c.call(
        "turn.interrupt",
        {"workspaceId": WS, "agentSessionId": sid, "turnId": slow["turnId"], "by": "gui"},
    )
    stopped = settle(c, sid, slow["turnId"])
    # Whatever the worker did with the held `turn.start` is done before the next Turn.
    wait_for(lambda: answered.count("turn.start") == 1)
    assert stopped["outcome"] == "interrupted", stopped
    assert stopped["error"] == "by the GUI", stopped
    # The provider stopped it too: the next Turn starts there and completes.
    after = run_turn(c, sid, "after the interrupt")
    assert after["outcome"] == "completed", after
    assert [m["text"] for m in after["messages"]] == [
        "after the interrupt",
        "echo: after the interrupt",
    ]
