"""A Turn on a warm runtime: a Session whose last `session.start` reported a
runtime generation that is still live and unchanged starts its next Turn with `turn.start`
alone (no `session.start` round trip), naming that generation. If the runtime was replaced
after the host chose it, the worker refuses the Turn before the provider sees it; the host
prepares the runtime and starts the Turn once more — the provider runs it exactly once. A
settled Turn that lacks its provider binding sends the next Turn down the cold path, so the
re-bind from the provider's history still runs first.

An in-process daemon (real store file, real worker and tutti-agent app-server); the worker
port is wrapped to count the requests the daemon sent (each still goes to the real worker)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from actors.context import runtime_key
from actors.messages import Mutate
from actors.turn_writes import TurnWrites
from agenthost.daemon import Daemon
from domain.errors import Conflict
from domain.worker_messages import HistoryRequest
from tests.daemon.split_start import started_and_binding
from tests.daemon.test_hung_provider import _app_servers
from tests.support.daemon import (
    WS,
    create_session,
    run_turn,
    settle,
    submit,
    turn_of,
    wait_for,
)
from tests.support.in_process import in_process_daemon
from tests.support.worker_requests import SentRequests, turn_after_worker_kill
from transport.client import Client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, Client]]:
    monkeypatch.setenv("AGENTHOST_ENABLE_FAILPOINTS", "1")
    with in_process_daemon(tmp_path / "home", timeout=30.0) as running:
        yield running


def _warm_session(c: Client) -> str:
    """A Session whose runtime the last `session.start` reported with a generation: the first
    Turn's start spawns the app-server and is stamped with the generation that answered it."""
    sid = create_session(c, title="warm turns")["agentSessionId"]
    run_turn(c, sid, "spawn")
    return sid


def _provider_turns(daemon: Daemon, sid: str) -> list[dict[str, str]]:
    """The provider's own history of the Session's thread, through the real worker."""
    fut = daemon.ctx.workers.history("tutti-agent", HistoryRequest(runtime_key(WS, sid)), 30.0)
    return [turn.to_wire() for turn in fut.result(timeout=30).turns]


def test_a_turn_on_a_warm_runtime_sends_no_session_start(
    running: tuple[Daemon, Client],
) -> None:
    daemon, c = running
    sid = _warm_session(c)
    sent = SentRequests(daemon)
    turns = [run_turn(c, sid, f"warm {i}") for i in range(3)]
    assert [t["phase"] for t in turns] == ["settled"] * 3
    assert [t["outcome"] for t in turns] == ["completed"] * 3, turns
    assert all(t["rootProviderTurnId"] for t in turns), turns
    requests = sent.take()
    assert requests["session.start"] == 0, requests
    assert requests["turn.start"] == 3, requests


def test_a_new_sessions_second_turn_starts_on_the_runtime_its_first_spawned(
    running: tuple[Daemon, Client],
) -> None:
    """The first Turn's `session.start` spawned the app-server: the driver names the runtime
    that gave the verdict, which is still the live one after the call, so the start is
    stamped and the second Turn needs no `session.start` of its own (before, a spawning start
    carried no generation and every new Session's second Turn started the runtime again)."""
    daemon, c = running
    sent = SentRequests(daemon)
    sid = create_session(c, title="second turn")["agentSessionId"]
    first = run_turn(c, sid, "spawn")
    assert sent.take()["session.start"] == 1
    second = run_turn(c, sid, "warm at once")
    assert [first["outcome"], second["outcome"]] == ["completed", "completed"]
    requests = sent.take()
    assert requests["session.start"] == 0, requests
    assert requests["turn.start"] == 1, requests


def test_a_turn_right_after_its_workers_kill_takes_the_cold_path_at_once(
    running: tuple[Daemon, Client],
) -> None:
    """The warm runtime lives under its worker: a worker SIGKILLed a moment ago (its
    app-server not yet ended by the parent-death signal, the supervisor not yet told) is gone
    to the host from the moment its kill returns (the stamp's `workerPid`, its SIGKILL
    pending), so the next Turn starts the runtime again and is sent once — never to the
    dying worker, where its `turn.start` would be lost with it and the Turn failed."""
    daemon, c = running
    sid = _warm_session(c)
    after, requests = turn_after_worker_kill(daemon, c, sid, "tutti-agent")
    assert after["outcome"] == "completed", after
    assert requests["session.start"] == 1, requests
    assert requests["turn.start"] == 1, requests


def test_a_warm_turn_whose_runtime_was_replaced_is_refused_then_started_once(
    running: tuple[Daemon, Client],
) -> None:
    """The host chose the warm runtime; its app-server dies before `turn.start` leaves (held
    in `host.turn.before_warm_start`). The worker refuses the Turn (the generation is no
    longer live), the host starts the runtime again and sends the Turn once more: it
    completes, and the provider's history holds it once."""
    daemon, c = running
    sid = _warm_session(c)
    sent = SentRequests(daemon)
    c.call("debug.failpoints", {"points": {"host.turn.before_warm_start": "once:sleep:1500"}})
    turn_id = submit(c, sid, "only once")["turnId"]
    # The runtime dies while the warm `turn.start` is held at the failpoint (its `once:`
    # marker is written when it fires, before the sleep).
    fired = daemon.config.run_dir / "failpoints-host" / "fired.host.turn.before_warm_start"
    wait_for(fired.exists, 10)
    pids = _app_servers(sid)
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    turn = settle(c, sid, turn_id)
    assert turn["outcome"] == "completed", turn
    requests = sent.take()
    assert requests["turn.start"] == 2, requests  # refused once, then started
    assert requests["session.start"] == 1, requests
    texts = [t["userText"] for t in _provider_turns(daemon, sid)]
    assert texts.count("only once") == 1, texts
    assert turn_of(c, sid, turn_id)["rootProviderTurnId"], turn


def test_a_turn_after_an_unbound_settled_turn_takes_the_cold_path_and_rebinds_it(
    running: tuple[Daemon, Client],
) -> None:
    """A settled completed Turn without its provider binding (as a lost binding write leaves
    it) must be re-bound from the provider's history before the next Turn: the warm path is
    not taken while one exists, so `session.start` and the re-bind run. The binding is
    dropped by a write serialised through the Session's actor (a `Mutate`, as every write to
    a live Session goes), so the actor's own knowledge of its Turns' bindings is not
    bypassed behind its back."""
    daemon, c = running
    sid = _warm_session(c)
    lost = run_turn(c, sid, "lost binding")["turnId"]

    def _unbind() -> None:
        conn = apsw.Connection(str(daemon.config.store_path))
        try:
            conn.execute(
                "UPDATE turns SET root_provider_turn_id = NULL, provider_turn_binding_json = NULL"
                " WHERE turn_id = ?",
                (lost,),
            )
        finally:
            conn.close()

    answered = threading.Event()
    assert daemon.routes.tell(WS, sid, Mutate(_unbind, lambda _reply: answered.set()))
    assert answered.wait(10)
    assert turn_of(c, sid, lost)["rootProviderTurnId"] is None
    sent = SentRequests(daemon)
    assert run_turn(c, sid, "next")["outcome"] == "completed"
    requests = sent.take()
    assert requests["session.start"] == 1, requests
    assert requests["session.history"] == 1, requests
    assert turn_of(c, sid, lost)["rootProviderTurnId"], "the lost binding was not re-bound"


def test_a_turn_whose_binding_write_failed_sends_the_next_turn_down_the_cold_path(
    running: tuple[Daemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Session actor keeps, between runtime starts, whether every settled Turn of its
    Session holds its provider binding: a Turn it settles `completed` after its binding write
    failed must still send the next Turn down the cold path, and the re-bind must run."""
    daemon, c = running
    sid = _warm_session(c)

    def _refused(*_args: object, **_kwargs: object) -> None:
        raise Conflict("the store refused the binding (injected)")

    with monkeypatch.context() as patch:
        patch.setattr(daemon.store.turns, "record_provider_turn", _refused)
        # The bind lands alone, as it does when its Turn outlasts `START_LINGER_S` (else the
        # settlement writes it in its own statement, and neither lands without the other).
        patch.setattr(TurnWrites, "take_bound", lambda _self, _turn_id: [])
        lost = run_turn(c, sid, "binding write fails")
    assert lost["outcome"] == "completed", lost
    assert turn_of(c, sid, lost["turnId"])["rootProviderTurnId"] is None
    sent = SentRequests(daemon)
    assert run_turn(c, sid, "next")["outcome"] == "completed"
    requests = sent.take()
    assert requests["session.start"] == 1, requests
    assert requests["session.history"] == 1, requests
    assert turn_of(c, sid, lost["turnId"])["rootProviderTurnId"], "the binding was not re-bound"


@pytest.fixture
def running_without_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Daemon, Client]]:
    """Workspace checkpoints off: the `before` checkpoint is taken off the actor's thread and
    `turn.start` waits for it, so a mutation told right after the submit would run before the
    start is even sent, not while the worker holds it, as the next test needs."""
    monkeypatch.setenv("AGENTHOST_ENABLE_FAILPOINTS", "1")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "agenthost.toml").write_text("[workspace]\ncheckpoints = false\n")
    with in_process_daemon(home, timeout=30.0) as running:
        yield running


def test_a_turns_start_answer_queued_among_its_events_does_not_split_their_batch(
    running_without_checkpoints: tuple[Daemon, Client],
) -> None:
    """The provider's answer to `turn.start` only queues more of the Turn's
    writes, so the writes held for the Turn's queued events wait for it too. The worker holds
    `turn.start` (`worker.turn.before_start`) while a mutation keeps the Session's actor busy:
    the Turn's events and that answer queue behind it, in the provider's order (the answer
    after the start and binding events, before the items). Their writes land as one store
    transaction, not one before the answer and one after."""
    daemon, c = running_without_checkpoints
    sid = _warm_session(c)
    assert daemon.store is not None
    stats = daemon.store.db.write_stats
    c.call("debug.failpoints", {"points": {"worker.turn.before_start": "once:sleep:400"}})
    turn_id = submit(c, sid, "one batch")["turnId"]
    before = (stats.transactions, stats.batched)
    answered = threading.Event()
    held = Mutate(lambda: time.sleep(1.5), lambda _reply: answered.set())
    assert daemon.routes.tell(WS, sid, held)  # straight into the live actor's inbox
    turn = settle(c, sid, turn_id)
    assert answered.wait(10)
    assert turn["outcome"] == "completed", turn
    assert [m["text"] for m in turn["messages"]] == ["one batch", "echo: one batch"]
    assert turn["rootProviderTurnId"], turn
    transactions, batched = stats.transactions - before[0], stats.batched - before[1]
    assert transactions == 1, (transactions, batched)
    # The settlement alone: its write inserts the reply, its statement writes the start's bind
    # and binding (no batch of writes).
    assert batched == 0, (transactions, batched)


def test_a_turns_start_events_land_as_one_transaction_when_they_arrive_apart(
    running_without_checkpoints: tuple[Daemon, Client],
) -> None:
    """The Turn's `turn.started` and its `turn.binding` reach the Session actor apart (the
    binding held 300 ms on the delivery thread, so the actor has handled the start and its
    inbox is empty): their writes wait for the answer to `turn.start`, which the worker sends
    after both, and land as one transaction — one COMMIT and one `turn.updated`, not one
    each. The assistant's Message is held back on the delivery thread until the test has
    counted, so nothing later joins that transaction."""
    daemon, c = running_without_checkpoints
    sid = _warm_session(c)
    assert daemon.store is not None and daemon.supervisor is not None
    stats = daemon.store.db.write_stats
    release = threading.Event()
    forward = daemon._on_worker_event

    def sink(provider: str, key: str, event: dict[str, object]) -> None:
        for part in started_and_binding(event):  # the binding apart from its start
            if part.get("type") == "turn.binding":
                time.sleep(0.3)
            item = part.get("item")
            if isinstance(item, dict) and item.get("kind") == "assistant":
                release.wait(30)
            forward(provider, key, part)

    daemon.supervisor.set_event_sink(sink)
    try:
        turn_id = submit(c, sid, "one start")["turnId"]  # answered once the claim is durable
        claimed = stats.transactions

        def bound() -> bool:
            turn = daemon.store.turns.get_turn(WS, sid, turn_id)  # type: ignore[union-attr]
            return bool(turn.root_provider_turn_id and turn.provider_turn_binding_json)

        wait_for(bound, 30)
        assert stats.transactions - claimed == 1
    finally:
        release.set()
        daemon.supervisor.set_event_sink(forward)
    turn = settle(c, sid, turn_id)
    assert turn["outcome"] == "completed", turn
    assert [m["text"] for m in turn["messages"]] == ["one start", "echo: one start"]


def test_a_settings_change_between_turns_is_not_answered_from_the_row_cache(
    running: tuple[Daemon, Client],
) -> None:
    """A Turn's start reads the Session from its actor's row cache; `session.updateSettings`
    (a mutation through the same actor) empties it, so the next Turn sees the new settings,
    which differ from the warm runtime's: it takes the cold path (`session.start` with them).
    A stale row would match the warm runtime and start the Turn there with the old
    settings. The Turn after it, with nothing changed, is warm again."""
    daemon, c = running
    sid = _warm_session(c)
    run_turn(c, sid, "cached")  # the row is cached now
    base = {"workspaceId": WS, "agentSessionId": sid}
    assert c.call("session.updateSettings", {**base, "settings": {"x": 2}})["session"]
    sent = SentRequests(daemon)
    assert run_turn(c, sid, "after the change")["outcome"] == "completed"
    requests = sent.take()
    assert requests["session.start"] == 1, requests
    assert requests["turn.start"] == 1, requests
    assert run_turn(c, sid, "warm again")["outcome"] == "completed"
    requests = sent.take()
    assert requests["session.start"] == 0, requests
