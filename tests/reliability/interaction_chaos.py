"""Interactions and interrupts in the soaks' chaos (docs/design/internals.md, "Interactions and
interrupts: their laws"): Tutti Agent Turns whose fake model asks (`/approve …` for an
approval, `/ask …` for a question), answered by `interaction.respond` at a random moment —
approve or decline, a text, sometimes twice at once, sometimes never (left to an interrupt, a
kill or the round's release) — and `turn.interrupt` of a random Session's active Turn (or of
one it had settled), racing the other clients' forks, deletes and turns of the same Session.
What the clients were answered is kept for `check_interaction_answers` and `check_interrupts`;
answers a law allows (409 for a second answer or a fenced Session, 404 for a deleted one) are
counted, not failures. Claude Code's Sessions ask too: `/bash echo … > asked-….txt` makes the
fake Messages API (`soak_reply`, what the soaks' `provider_env` serves) call Bash with a
command that writes, which the CLI asks permission for (`can_use_tool`: an approval). Codex's
ask too: `/run echo … > asked-….txt` makes the fake Responses API (`soak_responses_reply`) call
`exec_command` asking to run outside the sandbox, which a Session created with
`approvalPolicy: on-request` (`CODEX_ASKS`) asks the user to approve (an approval); a Codex
Session that never asks runs it, or is refused by its sandbox, and completes unasked. Every
other Codex ask's command first detaches a `sleep` (`DETACH`): a process of the Session's
running runtime outside its app-server's tree and group, which the live process laws
(`process_owned`, `runtime_processes_ended`, `stopped_runtime_left`) meet and its runtime's
stop ends."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import apsw

from domain.procfs import processes_in
from drivers.runtime_marker import RUNTIME_VAR
from model_fakes import responses
from model_fakes.messages import Reply, ToolUse, default_reply, last_user_text, tool_result
from tests.support.daemon import WS
from tests.support.invariants import (
    Answered,
    Violation,
    check_interaction_answers,
    check_interrupts,
)
from transport.client import Client, ClientClosed, ClientTimeout

ASKS = ("/approve rm -rf build", "/approve ls", "/ask what colour?")
"""What a Tutti Agent Turn asks with (its built-in model's directives)."""
BASH = "/bash "
RUN = "/run "
CODEX_ASKS = {"approvalPolicy": "on-request"}
"""The settings of a Codex Session that asks before it runs a command outside its sandbox."""
TOOK = {"tool ok: ran": "approve", "tool error: declined": "decline"}
"""What a Claude Code or Codex Turn's fake model replies after its tool ran or was refused."""
DETACH = (
    'python3 -c \'import subprocess as s; s.Popen(["sleep", "300"], start_new_session=True,'
    " stdout=s.DEVNULL, stderr=s.DEVNULL)'; "
)
"""What a Codex ask's command starts first, now and then: a `sleep` in a session of its own
(Codex ends its command's process group when the command ends; this leaves it), carrying its
runtime's marker (docs/design/drivers.md, "What a stop ends"). Not `setsid sleep … &`: its
child may not have left the group yet when the command ends and Codex kills the group (a
contention soak's detach Turn left nothing so); `Popen` returns once its child has execed,
its session already its own."""
DETACH_WAIT_S = 30.0
"""How long `Asker.detach` waits for its Turn to settle."""
RELEASE_S = 30.0
"""How long `release` asks again an interrupt a fork's fence or a busy store refused."""


def soak_reply(body: dict[str, Any]) -> Reply:
    """The soaks' fake Messages API: `/bash <cmd>` → a Bash call; the follow-up carrying its
    result → `tool ok|error: <result>` (a declined call's result is an error); else the
    default echo."""
    result = tool_result(body)
    if result is not None:
        return "tool error: declined" if result.get("is_error") else "tool ok: ran"
    text = last_user_text(body)
    if text.startswith(BASH):
        return ToolUse("Bash", {"command": text[len(BASH) :], "description": "soak command"})
    return default_reply(body)


def soak_responses_reply(body: dict[str, Any]) -> responses.Reply:
    """The soaks' fake Responses API: `/run <cmd>` → an `exec_command` call asking to run
    outside the sandbox (`require_escalated`: an `on-request` Session asks first); the
    follow-up carrying its output → `tool ok|error: …` (a refused call's output says it was
    "rejected by user"); else the default echo."""
    output = responses.function_call_output(body)
    if output is not None:
        return "tool error: declined" if "rejected by user" in output else "tool ok: ran"
    text = responses.last_user_text(body)
    if text.startswith(RUN):
        arguments = {
            "cmd": text[len(RUN) :],
            "sandbox_permissions": "require_escalated",
            "justification": "the soak asks to run this",
        }
        return responses.FunctionCall("exec_command", json.dumps(arguments), text="running it")
    return responses.default_reply(body)


def took(turn: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer Tutti Agent's fake model says it took, from a completed Turn's reply:
    `approved: …` / `declined: …` for an approval, the answer's text for a question."""
    asked = turn.get("interactions") or []
    replies = [m for m in turn.get("messages") or [] if m.get("kind") == "assistant"]
    if turn.get("outcome") != "completed" or len(asked) != 1 or not replies:
        return None
    text = str(replies[-1].get("text") or "")
    asked_input = asked[0].get("input") or {}
    if text in TOOK:
        # Claude Code's (`soak_reply`) or Codex's (`soak_responses_reply`). Tutti Agent's
        # approvals carry a `method` too: telling them apart by it, none of its was judged.
        return {"decision": TOOK[text]}
    if asked_input.get("tool") == "Bash":
        return None  # Claude Code's, its reply not one `soak_reply` gives after its tool
    if asked[0].get("kind") == "question":
        return {"text": text}
    for said, decision in (("approved: ", "approve"), ("declined: ", "decline")):
        if text.startswith(said):
            return {"decision": decision}
    return None


class Asker:
    """The interaction and interrupt actions of one soak's clients, and what they heard."""

    def __init__(self, provider_of: Callable[[str], str | None]) -> None:
        self.provider_of = provider_of
        """A Session's provider (each one's fake model asks: Tutti Agent's, Claude Code's and
        Codex's; a Codex Session asks if it was made with `CODEX_ASKS`)."""
        self.lock = threading.Lock()
        self.asking: dict[str, str] = {}  # turn id → its Session: asked, maybe still pending
        self.codex_asks: set[str] = set()
        """The Codex Sessions made with `CODEX_ASKS` (`settings` keeps it theirs)."""
        self.answers: list[Answered] = []
        self.interrupts: list[Answered] = []
        self.calls: Counter[str] = Counter()
        self.failures: list[str] = []

    def step(self, c: Client, rng: random.Random, sids: Iterable[str], tag: str) -> None:
        """One action: ask, answer or interrupt, on a Session of `sids` (or a Turn asked)."""
        mine = [s for s in sids if self.provider_of(s) in ("tutti-agent", "claude-code", "codex")]
        with self.lock:
            asked = sorted(self.asking.items())
        action = rng.choices(["ask", "answer", "interrupt"], weights=[3, 4, 3])[0]
        if action == "answer" and asked:
            self._answer(c, rng, *rng.choice(asked), tag)
        elif action == "interrupt" and mine:
            self._interrupt(c, rng, rng.choice(mine), tag)
        elif mine:
            # Each provider present asks as often as another (a soak has few Codex Sessions).
            provider = rng.choice(sorted({str(self.provider_of(s)) for s in mine}))
            sid = rng.choice([s for s in mine if self.provider_of(s) == provider])
            params = {
                "workspaceId": WS,
                "agentSessionId": sid,
                "requestId": f"ask-{rng.getrandbits(64):x}",
                "input": [{"type": "text", "text": self._ask_text(rng, sid)}],
            }
            status, body = self._call(c, "turn.submit", params, tag)
            if status is not None and status < 400:
                with self.lock:
                    self.asking[str(body["turn"]["turnId"])] = sid
                    self.calls[f"asked {self.provider_of(sid)}"] += 1

    def _ask_text(self, rng: random.Random, sid: str) -> str:
        n = rng.randrange(1000)
        if self.provider_of(sid) == "claude-code":
            return f"{BASH}echo {n} > asked-{n}.txt"  # a write: the CLI asks
        if self.provider_of(sid) == "codex":
            # Outside the sandbox: on-request asks. Every other one leaves a process of its
            # runtime behind, detached (`DETACH`): the live process checks meet it beside its
            # running runtime, and its runtime's stop ends it.
            detach = DETACH if n % 2 else ""
            return f"{RUN}{detach}echo {n} > asked-{n}.txt"
        return rng.choice(ASKS)

    def settings(self, sid: str, settings: dict[str, Any]) -> dict[str, Any]:
        """`settings` for a `session.updateSettings` of `sid` (which replaces them all): with
        `CODEX_ASKS` kept if the Session was made with it."""
        with self.lock:
            asks = sid in self.codex_asks
        return settings | CODEX_ASKS if asks else settings

    def met(self, home: Path) -> None:
        """Tallies the pending Interactions a kill landing now meets, by provider (read-only,
        as `work_in_flight` reads the store)."""
        conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            conn.set_busy_timeout(10_000)
            rows = conn.execute(
                "SELECT s.provider, COUNT(*) FROM interactions i JOIN sessions s"
                " USING (workspace_id, session_id) WHERE i.status = 'pending'"
                " GROUP BY s.provider"
            ).fetchall()
        finally:
            conn.close()
        with self.lock:
            for provider, n in rows:
                self.calls[f"kill met a pending {provider} interaction"] += int(n)

    def release(self, c: Client, tag: str) -> None:
        """Every asked Turn still active is interrupted (so the soak's waits for settled work
        end): an Interaction left unanswered to the end is superseded by its Turn's
        settlement. The interrupts are kept as any other."""
        with self.lock:
            asked = sorted(self.asking.items())
            self.asking.clear()
        deadline = time.monotonic() + RELEASE_S
        while asked:
            # One a fork's fence or a busy store refused (or whose reply was lost) is asked
            # again, until `RELEASE_S`.
            asked = [
                (turn_id, sid)
                for turn_id, sid in asked
                if self._send_interrupt(c, sid, turn_id, None, tag) in (None, 409, 503)
                and time.monotonic() < deadline
            ]
            if asked:
                time.sleep(0.5)

    def check(self, c: Client) -> list[Violation]:
        """Both laws over what was answered, against each Turn as its Session's timeline
        answers now (the clients quiet; a deleted Session's Turns are left alone)."""
        with self.lock:
            sent = self.answers + self.interrupts
        turns: dict[str, dict[str, Any]] = {}
        for sid in sorted({a.sid for a in sent}):
            status, body = c.call_raw(
                "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}
            )
            if status != 200:
                continue
            turns.update({str(t["turnId"]): t for t in body["turns"]})
            for t in body["turns"]:
                for i in t.get("interactions") or []:
                    kind = f"{self.provider_of(sid)} {i.get('kind')} {i.get('status')}"
                    self.calls[f"interaction recorded {kind}"] += 1
        return check_interaction_answers(self.answers, turns, took) + check_interrupts(
            self.interrupts, turns
        )

    def detach(self, c: Client, home: Path, sids: Iterable[str], tag: str) -> bool:
        """A Turn of a Codex Session of `sids` that asks first (`CODEX_ASKS`: approved, its
        command runs outside the sandbox; one that never asks may be refused by it) whose
        command leaves a process detached (`DETACH`), its ask approved (kept as any answer),
        waited for until it settles: the checks that follow meet that process beside its
        running runtime. Whether one completed (none when every such Session was busy or
        deleted, nor when one left before still runs under `home`: the checks meet it)."""
        if _detached(home):
            return False
        with self.lock:
            codex = [s for s in sids if s in self.codex_asks]
        for sid in codex:
            params = {
                "workspaceId": WS,
                "agentSessionId": sid,
                "requestId": f"detach-{time.monotonic_ns():x}",
                "input": [{"type": "text", "text": f"{RUN}{DETACH}echo detached > detached.txt"}],
            }
            status, body = self._call(c, "turn.submit", params, tag)
            if status is None or status >= 400:
                continue
            outcome = self._approved(c, sid, str(body["turn"]["turnId"]), tag)
            with self.lock:
                self.calls[f"detach turn {outcome}"] += 1
            if outcome == "completed":
                return True
        return False

    def _approved(self, c: Client, sid: str, turn_id: str, tag: str) -> str | None:
        """Approves each ask of the Turn until it settles (`DETACH_WAIT_S`): its outcome."""
        deadline = time.monotonic() + DETACH_WAIT_S
        answered: set[str] = set()
        while time.monotonic() < deadline:
            turn = self._turn(c, sid, turn_id, tag)
            if turn is None or turn["phase"] == "settled":
                return None if turn is None else str(turn.get("outcome"))
            for i in turn.get("interactions") or []:
                request_id = str(i["requestId"])
                if i.get("status") != "pending" or request_id in answered:
                    continue
                answered.add(request_id)
                response = {"decision": "approve"}
                params = {
                    "workspaceId": WS,
                    "agentSessionId": sid,
                    "turnId": turn_id,
                    "requestId": request_id,
                    "response": response,
                }
                status, body = self._call(c, "interaction.respond", params, tag)
                with self.lock:
                    self.answers.append(Answered(sid, turn_id, request_id, response, status, body))
            time.sleep(0.05)
        return None

    def count_detached(self, home: Path) -> int:
        """Tallies the processes Codex asks' commands left detached (`DETACH`) that run now,
        working under `home`'s runtimes with a runtime's marker (a live check meets them)."""
        n = _detached(home)
        with self.lock:
            self.calls["live check met a detached tool process"] += n
        return n

    def summary(self) -> str:
        return "interactions and interrupts: " + " ".join(
            f"{k}={v}" for k, v in sorted(self.calls.items())
        )

    def _answer(self, c: Client, rng: random.Random, turn_id: str, sid: str, tag: str) -> None:
        """An answer (or two at once) to one of the Turn's Interactions, as it reads now."""
        turn = self._turn(c, sid, turn_id, tag)
        if turn is None:
            return
        if turn["phase"] == "settled":
            with self.lock:
                self.asking.pop(turn_id, None)
        interactions = turn.get("interactions") or []
        if not interactions:
            self.calls["interaction.respond none opened yet"] += 1
            return
        interaction = rng.choice(interactions)
        twice = rng.random() < 0.3
        futures = []
        for _ in range(2 if twice else 1):
            if interaction.get("kind") == "question":
                response: dict[str, Any] = {"text": rng.choice(["blue", "green"])}
            else:
                response = {"decision": rng.choice(["approve", "decline"])}
            params = {
                "workspaceId": WS,
                "agentSessionId": sid,
                "turnId": turn_id,
                "requestId": interaction["requestId"],
                "response": response,
            }
            futures.append((response, c.submit("interaction.respond", params)))
        if twice:
            with self.lock:
                self.calls[f"interaction.respond sent twice at once {self.provider_of(sid)}"] += 1
        for response, future in futures:
            try:
                status, body = future.result(timeout=30)
            except (ClientTimeout, ClientClosed, TimeoutError):
                status, body = None, {}
            self._tally("interaction.respond", status, body, tag)
            with self.lock:
                self.answers.append(
                    Answered(sid, turn_id, interaction["requestId"], response, status, body)
                )

    def _interrupt(self, c: Client, rng: random.Random, sid: str, tag: str) -> None:
        """`turn.interrupt` of the Session's active Turn, or (when it has none, or now and
        then) of a Turn it had settled, as the client last read it."""
        status, body = self._call(
            c, "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}, tag
        )
        if status != 200 or not body["turns"]:
            return
        active = [t for t in body["turns"] if t["phase"] == "active"]
        if active and rng.random() < 0.8:
            self._send_interrupt(c, sid, str(active[0]["turnId"]), None, tag)
        else:
            seen = rng.choice(body["turns"])
            self._send_interrupt(c, sid, str(seen["turnId"]), seen, tag)

    def _send_interrupt(
        self, c: Client, sid: str, turn_id: str, seen: dict[str, Any] | None, tag: str
    ) -> int | None:
        params = {"workspaceId": WS, "agentSessionId": sid, "turnId": turn_id}
        status, body = self._call(c, "turn.interrupt", params, tag)
        with self.lock:
            self.interrupts.append(
                Answered(
                    sid,
                    turn_id,
                    "",
                    {},
                    status,
                    body,
                    seen if seen is not None and seen["phase"] == "settled" else None,
                )
            )
        return status

    def _turn(self, c: Client, sid: str, turn_id: str, tag: str) -> dict[str, Any] | None:
        status, body = self._call(
            c, "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}, tag
        )
        if status != 200:
            if status == 404:
                with self.lock:
                    self.asking.pop(turn_id, None)
            return None
        return next((dict(t) for t in body["turns"] if t["turnId"] == turn_id), None)

    def _call(
        self, c: Client, method: str, params: dict[str, Any], tag: str
    ) -> tuple[int | None, dict[str, Any]]:
        try:
            status, body = c.call_raw(method, params)
        except (ClientTimeout, ClientClosed):
            status, body = None, {}
        self._tally(method, status, body, tag)
        return status, dict(body)

    def _tally(self, method: str, status: int | None, body: Any, tag: str) -> None:
        if status is None:
            key = f"{method} lost"
        else:
            key = f"{method} {status}" + ("" if status < 400 else f" {body.get('reason')}")
        with self.lock:
            self.calls[key] += 1
            if status == 500:
                self.failures.append(f"{tag}: {method} → 500 {body}")


def _detached(home: Path) -> int:
    """The `sleep`s (`DETACH`) working under `home`'s runtimes with a runtime's marker."""
    pids = processes_in(str(home / "runtimes"), marked=RUNTIME_VAR)
    return sum(1 for pid in pids if _command(pid) == "sleep")


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
