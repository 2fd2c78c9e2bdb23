"""Soak cells of a delete beside a runtime slot wait and of controls in flight past the idle
reap, on a daemon of their own (its home beside the soak's): one runtime slot per provider
(`max_runtimes_per_provider = 1`), held by a Tutti Agent Turn waiting on a question, and a
short idle limit (`idle_actor_seconds`, `IDLE_S`).

- a delete beside a queued fork: a `fork.create` of a Session queued for the slot (no
  operation, no fence yet), then its `session.delete`: answered at once, the slot still held,
  409 `agent_session_fork_in_progress` (retryable) — the fork, accepted first, goes on; a
  second Session's Turn queued for the slot and interrupted there, then deleted: 200 at once,
  and its later `turn.submit` and `fork.create` get 404 (what a deleted Session gets). In the
  crash soak the cell's daemon is SIGKILLed at random there (the fork queued): after its
  restart the queued fork left nothing. Then the slot is freed: the fork commits (or, killed,
  is gone) and the source's delete is applied; no deleted Session's runtime directory is made
  again by a preparation that waited for the slot;
- a request after a delete that waits: a Turn's `session.start` held (the real `tutti-agent`
  behind a front that waits while a file exists), the Turn interrupted, the Session deleted
  (the delete waits for the start), then a `turn.submit` or `fork.create` of it: once the start
  is let go, the delete is applied (200) and the later request gets 404 — never applied first;
- controls in flight past the idle reap: an `interaction.respond` and a `turn.interrupt` the
  provider took, whose worker's reply is held past the idle limit
  (`worker.interaction.after_answer`, `worker.turn.after_interrupt` `sleep:`) while the Turn
  settles: each answered 200, applied and recorded.

What the clients were answered is judged by `check_interaction_answers` and
`check_interrupts`; the cell's home by `check_invariants` (`fence_window`: no source deleted
inside a fence window; `turn_claim`; `interaction_state`; the processes' laws) after each
round that ran it."""

from __future__ import annotations

import random
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import apsw

from tests.reliability.interaction_chaos import took
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    fork_params,
    respond,
    run_turn,
    settle,
    submit,
    timeline,
    turn_of,
    wait_for,
)
from tests.support.git_repos import pending_request
from tests.support.invariants import (
    Answered,
    Violation,
    check_interaction_answers,
    check_interrupts,
    check_invariants,
)
from transport.client import Client, ClientClosed, ClientTimeout

IDLE_S = 0.2
"""The cell daemon's `idle_actor_seconds`: far shorter than a held worker reply."""
CONFIG = f"[daemon]\nmax_runtimes_per_provider = 1\nidle_actor_seconds = {IDLE_S}\n"
TUTTI = "tutti-agent"
HOLD = "hold-starts"
ANSWER_POINT = "worker.interaction.after_answer"
INTERRUPT_POINT = "worker.turn.after_interrupt"


class SlotDelete:
    """The cells of one soak: `start` runs them in a thread (beside the round's load), `join`
    waits for them and judges their daemon's home; `ran` tallies what they met."""

    def __init__(self, base: Path, seed: int) -> None:
        self.base = base
        self.rng = random.Random(seed ^ 0x5107DE1E)
        self.runs = 0
        self.ran: Counter[str] = Counter()
        self.failures: list[str] = []
        self._thread: threading.Thread | None = None
        self._home: Path | None = None

    def start(self, *, kill: bool | None = None) -> None:
        """The cells, in a thread; `kill`: SIGKILL their daemon with the fork queued (None: at
        random, one run in two)."""
        kill = self.rng.random() < 0.5 if kill is None else kill
        self.runs += 1
        home = self._home = self.base / str(self.runs)  # short: its sockets live in it
        home.mkdir(parents=True)
        (home / "agenthost.toml").write_text(CONFIG + held_tutti(home))
        seed = self.rng.randrange(2**32)
        self._thread = threading.Thread(
            target=self._run, args=(home, seed, kill), name="slot-delete", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float = 240.0) -> list[Violation]:
        """The cells' end (their failures raised here) and their home's laws."""
        thread, home = self._thread, self._home
        if thread is None or home is None:
            return []
        thread.join(timeout)
        assert not thread.is_alive(), f"slot-delete cells still running after {timeout} s"
        self._thread = None
        assert not self.failures, self.failures
        return list(check_invariants(home).violations)

    def _run(self, home: Path, seed: int, kill: bool) -> None:
        try:
            self.ran.update(run_cells(home, random.Random(seed), kill=kill))
        except BaseException as exc:  # noqa: BLE001 - judged by `join`
            self.failures.append(f"slot-delete seed {seed}: {type(exc).__name__}: {exc}")


def run_cells(home: Path, rng: random.Random, *, kill: bool = False) -> Counter[str]:
    """Both cells on a daemon started on `home` (its `CONFIG` written), stopped at the end."""
    ran: Counter[str] = Counter()
    d = DaemonProcess(home).start()
    try:
        d = delete_beside_queued_fork(d, rng, ran, kill=kill)
        request_after_waiting_delete(d, rng, ran)
        controls_past_idle(d.client(timeout=60), rng, ran)
    finally:
        d.stop()
    return ran


def _call(d: DaemonProcess, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, body = d.client(timeout=60).call_raw(method, params, timeout=60)
    return status, dict(body)


def _tutti(d: DaemonProcess) -> dict[str, Any]:
    runtimes = d.client().call("host.status")["runtimes"]
    return dict(runtimes.get(TUTTI) or {})


def delete_beside_queued_fork(
    d: DaemonProcess, rng: random.Random, ran: Counter[str], *, kill: bool
) -> DaemonProcess:
    """The first cell (see the module); the daemon it ends with (another one if it killed)."""
    c = d.client(timeout=60)
    source = create_session(c, title="slot source")["agentSessionId"]
    other = create_session(c, title="slot other")["agentSessionId"]
    boundary = run_turn(c, source, "hello")
    run_turn(c, other, "hello")
    holder = create_session(c, title="slot holder")["agentSessionId"]
    held = submit(c, holder, "/ask hold the only runtime slot")["turnId"]
    question = pending_request(c, holder, held)

    forked: dict[str, tuple[int, dict[str, Any]]] = {}

    def fork() -> None:
        try:
            forked["fork"] = _call(d, "fork.create", fork_params(WS, source, boundary["turnId"]))
        except (ClientClosed, ClientTimeout):
            forked["fork"] = (0, {})  # its daemon killed under it

    thread = threading.Thread(target=fork, daemon=True)
    thread.start()
    wait_for(lambda: _tutti(d).get("queuedForks", 0) == 1, 30)
    order = ["source", "other"]
    rng.shuffle(order)
    for which in order:
        if which == "source":
            status, body = _call(d, "session.delete", {"workspaceId": WS, "agentSessionId": source})
            assert status == 409, (status, body)
            assert body["reason"] == "agent_session_fork_in_progress", body
            assert body["retryable"] is True, body
            ran["delete_meets_queued_fork"] += 1
        else:
            waiting = submit(c, other, "queued for the slot")["turnId"]
            wait_for(lambda: _tutti(d).get("queued", 0) == 2, 30)
            c.call(
                "turn.interrupt", {"workspaceId": WS, "agentSessionId": other, "turnId": waiting}
            )
            assert settle(c, other, waiting)["outcome"] == "interrupted"
            status, body = _call(d, "session.delete", {"workspaceId": WS, "agentSessionId": other})
            assert status == 200, (status, body)
            later = [
                _call(
                    d,
                    "turn.submit",
                    {
                        "workspaceId": WS,
                        "agentSessionId": other,
                        "requestId": str(uuid.uuid4()),
                        "input": [{"type": "text", "text": "after the delete"}],
                    },
                ),
                _call(d, "fork.create", fork_params(WS, other, waiting)),
            ]
            assert [s for s, _ in later] == [404, 404], later
            ran["delete_beside_queued_turn"] += 1
    assert "fork" not in forked, forked  # still queued: the slot is held
    other_home = home_of(d, other)
    if kill:
        d.kill()
        thread.join(60)
        d = DaemonProcess(d.home).start()
        c = d.client(timeout=60)
        assert not operations_of(d.home, source)  # the queued fork began nothing
        ran["killed_with_fork_queued"] += 1
        # Start-up recovery settled the holder's Turn: the slot is free.
        settle(c, holder, held)
    else:
        respond(c, holder, held, question, {"text": "yes"})
        settle(c, holder, held)
        thread.join(90)
        status, body = forked["fork"]
        assert status in (200, 202), (status, body)
        op = wait_for(lambda: _terminal(c, str(body["operation"]["operationId"])), 90, interval=0.2)
        assert op["status"] == "committed", op
        ran["queued_fork_committed"] += 1
    wait_for(lambda: _tutti(d).get("queued", 0) == 0 and _tutti(d).get("starting", 0) == 0, 60)
    assert not other_home.exists(), f"{other_home}: a deleted Session's home made again"
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": source})
    wait_for(lambda: not home_of(d, source).exists(), 30)
    return d


def operations_of(home: Path, sid: str) -> list[str]:
    """The fork operations of source `sid` in `home`'s store."""
    db = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = db.execute(
            "SELECT operation_id FROM fork_operations WHERE source_session_id = ?", (sid,)
        ).fetchall()
    finally:
        db.close()
    return [str(r[0]) for r in rows]


def home_of(d: DaemonProcess, sid: str) -> Path:
    return d.home / "runtimes" / WS / sid


def _terminal(c: Client, op_id: str) -> dict[str, Any] | None:
    op = dict(c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"])
    return op if op["status"] in ("committed", "failed", "abandoned", "unknown") else None


def held_tutti(home: Path) -> str:
    """The `[providers.tutti-agent]` table of a `tutti-agent` (the real one beside this
    Python) whose every start waits while `home`'s `hold` file exists (`HOLD`)."""
    real = Path(sys.executable).parent / "tutti-agent"
    front = home / "held-tutti-agent"
    hold = home / HOLD
    front.write_text(
        f"#!/bin/sh\nwhile [ -e '{hold}' ]; do sleep 0.05; done\nexec '{real}' \"$@\"\n"
    )
    front.chmod(0o755)
    return f'[providers."tutti-agent"]\ncommand = ["{front}"]\n'


def request_after_waiting_delete(d: DaemonProcess, rng: random.Random, ran: Counter[str]) -> None:
    """The second cell (see the module)."""
    c = d.client(timeout=60)
    source = create_session(c, title="slot held start")["agentSessionId"]
    boundary = run_turn(c, source, "hello")
    # Another Session's Turn takes the only slot: the source's next Turn starts its runtime.
    run_turn(c, create_session(c)["agentSessionId"], "evicts the source's runtime")
    hold = d.home / HOLD
    hold.touch()
    try:
        cold = submit(c, source, "its runtime start is held")["turnId"]
        wait_for(lambda: _tutti(d).get("starting", 0) == 1, 30)
        c.call("turn.interrupt", {"workspaceId": WS, "agentSessionId": source, "turnId": cold})
        assert settle(c, source, cold)["outcome"] == "interrupted"
        answers: dict[str, tuple[int, dict[str, Any]]] = {}

        def call(name: str, method: str, params: dict[str, Any]) -> None:
            answers[name] = _call(d, method, params)

        delete = threading.Thread(
            target=call,
            args=("delete", "session.delete", {"workspaceId": WS, "agentSessionId": source}),
            daemon=True,
        )
        delete.start()
        wait_for(lambda: "delete" in answers or _in_flight(d) >= 2, 30)
        if rng.random() < 0.5:
            later: tuple[str, dict[str, Any]] = (
                "turn.submit",
                {
                    "workspaceId": WS,
                    "agentSessionId": source,
                    "requestId": str(uuid.uuid4()),
                    "input": [{"type": "text", "text": "after the delete"}],
                },
            )
        else:
            later = ("fork.create", fork_params(WS, source, boundary["turnId"]))
        after = threading.Thread(target=call, args=("later", *later), daemon=True)
        after.start()
        wait_for(lambda: "later" in answers or _in_flight(d) >= 3, 30)
    finally:
        hold.unlink()  # the start goes on
    delete.join(90)
    after.join(90)
    assert answers["delete"][0] == 200, answers
    status, body = answers["later"]
    assert (status, body.get("reason")) == (404, "workspace_agent_session_not_found"), answers
    wait_for(lambda: not home_of(d, source).exists(), 30)
    ran[f"{later[0]}_after_waiting_delete"] += 1


def _in_flight(d: DaemonProcess) -> int:
    return int(d.client().call("host.status")["requestsInFlight"])


def controls_past_idle(c: Client, rng: random.Random, ran: Counter[str]) -> None:
    """The third cell (see the module): an answer and an interrupt, in a random order, each
    with its worker's reply held past the idle limit; judged by the controls' laws."""
    answers: list[Answered] = []
    interrupts: list[Answered] = []
    sids: list[str] = []
    kinds = ["answer", "interrupt"]
    rng.shuffle(kinds)
    for kind in kinds:
        sid = create_session(c, title=f"slot {kind}")["agentSessionId"]
        sids.append(sid)
        asked = rng.choice(["/ask go on?", "/approve ls"])
        turn_id = submit(c, sid, asked)["turnId"]
        request_id = pending_request(c, sid, turn_id)
        held_ms = rng.randrange(int(IDLE_S * 4000), int(IDLE_S * 10000))
        point = ANSWER_POINT if kind == "answer" else INTERRUPT_POINT
        c.call("debug.failpoints", {"points": {point: f"sleep:{held_ms}"}})
        try:
            if kind == "answer":
                response: dict[str, Any] = (
                    {"text": "yes"} if asked.startswith("/ask") else {"decision": "approve"}
                )
                params = {
                    "workspaceId": WS,
                    "agentSessionId": sid,
                    "turnId": turn_id,
                    "requestId": request_id,
                    "response": response,
                }
                status, body = c.call_raw("interaction.respond", params, timeout=60)
                answers.append(Answered(sid, turn_id, request_id, response, status, dict(body)))
                assert status == 200, (kind, status, body)
                assert body["interaction"]["status"] == "resolved", body
            else:
                seen = turn_of(c, sid, turn_id)
                params = {"workspaceId": WS, "agentSessionId": sid, "turnId": turn_id}
                status, body = c.call_raw("turn.interrupt", params, timeout=60)
                interrupts.append(Answered(sid, turn_id, "", {}, status, dict(body), seen))
                assert status == 200, (kind, status, body)
                assert body["turn"]["outcome"] == "interrupted", body
        finally:
            c.call("debug.failpoints", {"points": {point: "off"}})
        settle(c, sid, turn_id)
        ran[f"{kind}_past_idle_reap"] += 1
    turns = {str(t["turnId"]): t for sid in sids for t in timeline(c, sid)}
    wrong = check_interaction_answers(answers, turns, took) + check_interrupts(interrupts, turns)
    assert not wrong, wrong
    for sid in sids:
        assert run_turn(c, sid, "after the held reply")["outcome"] == "completed"
