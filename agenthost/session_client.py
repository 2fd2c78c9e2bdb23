"""Client-side helpers shared by the CLI and the demo: run a turn to settlement, fork and wait
for a terminal operation (then ACK it), and format a transcript for people.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from transport.client import Client

POLL_S = 0.05


def get_turn(client: Client, ws: str, sid: str, turn_id: str) -> dict[str, Any]:
    turns = client.call(
        "session.timeline", {"workspaceId": ws, "agentSessionId": sid, "limit": 1000}
    )
    for turn in turns["turns"]:
        if turn["turnId"] == turn_id:
            return dict(turn)
    raise LookupError(f"turn {turn_id} not in session {sid}")


def run_turn(
    client: Client, ws: str, sid: str, text: str, *, echo: bool = False, timeout: float = 120.0
) -> dict[str, Any]:
    """Submit a turn and poll until it settles; with `echo`, print messages as they arrive."""
    result = client.call(
        "turn.submit",
        {
            "workspaceId": ws,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "input": [{"type": "text", "text": text}],
        },
    )
    turn_id = result["turn"]["turnId"]
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while True:
        turn = get_turn(client, ws, sid, turn_id)
        if echo:
            for message in turn["messages"]:
                if message["messageId"] not in seen:
                    seen.add(message["messageId"])
                    print(f"  {message['kind']:>9}: {message['text'] or ''}")
        if turn["phase"] == "settled":
            return turn
        if time.monotonic() > deadline:
            raise TimeoutError(f"turn {turn_id} still active after {timeout} s")
        time.sleep(POLL_S)


def fork_and_wait(
    client: Client,
    ws: str,
    sid: str,
    turn_id: str,
    *,
    progress: Callable[[str], None] | None = None,
    timeout: float = 120.0,
    acknowledge: bool = True,
) -> dict[str, Any]:
    """fork.create, then fork.get while accepted; a committed result is ACKed (seed 000 §8.3)."""
    op = client.call(
        "fork.create",
        {
            "workspaceId": ws,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "targetAgentSessionId": str(uuid.uuid4()),
            "point": {"type": "throughTurn", "turnId": turn_id},
        },
    )["operation"]
    deadline = time.monotonic() + timeout
    while op["status"] == "accepted":
        if progress is not None:
            progress(op["phase"])
        if time.monotonic() > deadline:
            raise TimeoutError(f"fork {op['operationId']} still accepted after {timeout} s")
        time.sleep(POLL_S * 2)
        op = client.call("fork.get", {"workspaceId": ws, "operationId": op["operationId"]})[
            "operation"
        ]
    if op["status"] == "committed" and acknowledge:
        op = client.call("fork.acknowledge", {"workspaceId": ws, "operationId": op["operationId"]})[
            "operation"
        ]
    return dict(op)


def format_transcript(session: dict[str, Any], turns: list[dict[str, Any]]) -> str:
    lines = [
        f"Session {session['agentSessionId']} — {session['title']} [{session['provider']}]"
        f" fork: {'yes' if session['lifecycleCapabilities']['forkThroughTurn'] else 'no'}"
    ]
    lineage = session.get("forkedFrom")
    if lineage:
        lines.append(
            f"  forked from {lineage['sourceAgentSessionId']} through turn "
            f"{lineage['sourceTurnId']} (operation {lineage['operationId']})"
        )
    for turn in turns:
        lines.append(
            f"  Turn {turn['sequence']} {turn['turnId']} [{turn['phase']}"
            f"{'/' + turn['outcome'] if turn['outcome'] else ''}, binding "
            f"{turn['providerForkBindingState']}]"
        )
        for message in turn["messages"]:
            lines.append(f"    {message['kind']:>9}: {message['text'] or ''}")
        for interaction in turn["interactions"]:
            lines.append(
                f"    {interaction['kind']:>9}? {interaction['status']} {interaction['input']}"
            )
        if lineage and turn["turnId"] == lineage["targetTurnId"]:
            lines.append("    ──── continued from the source session above this line ────")
    return "\n".join(lines)
