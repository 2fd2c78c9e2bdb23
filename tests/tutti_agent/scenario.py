"""The differential scenario: one script run against any Codex-shaped app-server, returning
normalised observations (turn labels instead of ids, error classes, model-visible inputs)."""

from __future__ import annotations

import re
import threading
from typing import Any

from model_fakes.responses import ResponsesServer, last_user_text, model_input_texts
from tests.tutti_agent.appserver import AppServerProcess, RpcError

HOLD_TEXT = "hold"
GHOST = "019a0000-0000-7000-8000-000000000000"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class HeldModel:
    """Reply function for ResponsesServer: echoes, but holds a `hold` turn until released."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()

    def __call__(self, body: dict[str, Any]) -> str:
        text = last_user_text(body)
        if text == HOLD_TEXT:
            self.arrived.set()
            self.release.wait(60)
        return f"echo: {text}"


def normalized_input(body: dict[str, Any]) -> list[str]:
    """The model-visible conversation without harness context (developer messages and
    contextual user wrappers), with the interrupt marker reduced to a token."""
    out = []
    for role, text in model_input_texts(body):
        if role not in ("user", "assistant"):
            continue
        if role == "user" and text.startswith("<"):
            if text.startswith("<turn_aborted>"):
                out.append("user: <turn_aborted>")
            continue
        out.append(f"{role}: {text}")
    return out


class Labels:
    """Stable names for provider turn ids: the same scenario step gets the same label."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def name(self, turn_id: str, label: str) -> None:
        self._names[turn_id] = label

    def of(self, turn_id: str) -> str:
        return self._names.get(turn_id, "?new")

    def turns(self, turns: list[dict[str, Any]]) -> list[str]:
        return [f"{self.of(t['id'])}:{t['status']}" for t in turns]


def error_class(exc: RpcError) -> str:
    message = _UUID.sub("<id>", exc.message)
    if message.startswith("invalid session id:"):
        return "invalid session id"  # the detail is the uuid parser's wording
    return f"{exc.code} {message}"


def run_scenario(server: AppServerProcess, model: ResponsesServer, held: HeldModel, cwd: str):
    labels = Labels()
    obs: dict[str, Any] = {}
    src = server.start_thread(cwd)

    def turns_of(thread_id: str) -> list[dict[str, Any]]:
        page = server.call("thread/turns/list", {"threadId": thread_id, "sortDirection": "asc"})
        return list(page["data"])

    def fork(params: dict[str, Any]) -> dict[str, Any]:
        thread = server.call("thread/fork", params)["thread"]
        turns = thread["turns"] or turns_of(thread["id"])
        return {
            "forkedFromSource": thread["forkedFromId"] == params["threadId"],
            "newId": thread["id"] != params["threadId"],
            "turns": labels.turns(turns),
            "id": thread["id"],
        }

    def public(f: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in f.items() if k != "id"}

    def run(thread_id: str, text: str, label: str) -> str:
        before = len(model.requests)
        turn = server.run_turn(thread_id, text)
        labels.name(turn["id"], label)
        obs[f"status {label}"] = turn["status"]
        inputs = [b for b in model.requests[before:] if last_user_text(b) == text]
        obs[f"model input {label}"] = normalized_input(inputs[-1]) if inputs else None
        return str(turn["id"])

    t1 = run(src, "one", "t1")
    t2 = run(src, "two", "t2")
    run(src, "three", "t3")
    obs["source turns"] = labels.turns(turns_of(src))

    child = fork({"threadId": src, "lastTurnId": t2})
    obs["fork through t2"] = public(child)
    run(child["id"], "four", "c4")
    c4_id = next(t["id"] for t in turns_of(child["id"]) if labels.of(t["id"]) == "c4")
    obs["fork of fork at inherited t1"] = public(fork({"threadId": child["id"], "lastTurnId": t1}))
    obs["fork of fork at own c4"] = public(fork({"threadId": child["id"], "lastTurnId": c4_id}))

    # A turn held in progress at the model server.
    held_id = server.start_turn(src, HOLD_TEXT)
    labels.name(held_id, "held")
    assert held.arrived.wait(30), "the held turn never reached the model server"
    try:
        server.call("thread/fork", {"threadId": src, "lastTurnId": held_id})
        obs["fork at in-progress turn"] = "accepted"
    except RpcError as exc:
        obs["fork at in-progress turn"] = error_class(exc)
    obs["fork at earlier turn while in progress"] = public(
        fork({"threadId": src, "lastTurnId": t2})
    )
    mid = fork({"threadId": src})
    obs["fork latest mid-turn"] = public(mid)
    held.release.set()
    obs["held turn"] = server.wait_turn_completed(held_id)["status"]
    run(mid["id"], "after", "m1")

    errors = {}
    for name, params in {
        "unknown lastTurnId": {"threadId": src, "lastTurnId": GHOST},
        "unknown thread": {"threadId": GHOST},
        "malformed thread id": {"threadId": "not-a-uuid"},
    }.items():
        try:
            server.call("thread/fork", params)
            errors[name] = "accepted"
        except RpcError as exc:
            errors[name] = error_class(exc)
    obs["errors"] = errors
    return obs
