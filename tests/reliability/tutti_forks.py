"""Tutti Agent cells the crash soak runs once its rounds are over (the clients parked, the
provider chaos joined), each on a Session of its own:

- an `unknown` fork (its worker SIGKILLed once the provider answered) whose child in the source
  home is cut at a line before its boundary Turn's `task_complete` (a write a crash cut short):
  inspected `ambiguous` (`turnsEqualPrefix` false: its last Turn in progress), its adopt
  refused 409 and the operation still `unknown`, then abandoned (the child quarantined, not
  deleted) and the same Turn forked again, committed (its child proven readable), its child
  running a Turn;
- a lean resume over a rollout briefly unreadable: the Session's worker killed (its runtime
  gone), a line in the middle of its rollout made unreadable, the Turn that starts a runtime
  again fails naming the corrupt line; the rollout repaired, the next Turn completes (the
  failure of the deferred load is not kept for the app-server's life).

What they leave (an abandoned operation and its quarantined child, a committed child, the
Sessions' Turns) is judged by the soak's final `assert_invariants` with the rest."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import apsw

from tests.reliability.reliability_harness import worker_of
from tests.support.daemon import WS, create_session, run_turn, wait_for
from tests.support.homes import child_rollouts, rollouts, runtime_home
from transport.client import ApiError, Client

TUTTI = "tutti-agent"


def tutti_fork_cells(w: Any) -> Counter[str]:
    """Both cells on `w`'s daemon (a crash soak `World`: `home`, `daemon`, `seed`, `cwd`),
    its clients parked. Returns what ran, for the chaos tally."""
    ran: Counter[str] = Counter()
    c = w.daemon.client(timeout=60)
    ran["tutti_unknown_cut_abandoned"] += cut_boundary_unknown(w, c)
    ran["tutti_lean_resume_repaired"] += lean_resume_repaired(w, c)
    return ran


def _resolve(c: Client, op_id: str, action: str) -> dict[str, Any]:
    params = {"workspaceId": WS, "operationId": op_id, "action": action}
    return dict(c.call("fork.resolve", params | {"requestId": str(uuid.uuid4())}))


def _fork(c: Client, sid: str, turn_id: str, target: str | None = None) -> dict[str, Any]:
    op = c.call(
        "fork.create",
        {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "targetAgentSessionId": target or str(uuid.uuid4()),
            "point": {"type": "throughTurn", "turnId": turn_id},
        },
    )["operation"]
    op_id = op["operationId"]

    def ended() -> dict[str, Any] | None:
        got = c.call("fork.get", {"workspaceId": WS, "operationId": op_id})["operation"]
        return dict(got) if got["status"] != "accepted" else None

    return dict(wait_for(ended, timeout=60))


def _proof_of(home: Path, op_id: str) -> str | None:
    """How the fork's child was proven readable, as its binding receipt records it."""
    db = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = list(
            db.execute(
                "SELECT binding_receipt FROM fork_operations WHERE operation_id = ?", (op_id,)
            )
        )
    finally:
        db.close()
    receipt = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    proof = receipt.get("readabilityProof")
    return str(proof) if proof is not None else None


def cut_boundary_unknown(w: Any, c: Client) -> int:
    """The first cell (see the module's words). Returns 1."""
    seed = w.seed
    sid = create_session(c, cwd=w.cwd)["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("first", "second", "third")]
    assert [t["outcome"] for t in turns] == ["completed"] * 3, (seed, turns)
    c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "once:kill"}})
    op = _fork(c, sid, turns[1]["turnId"])
    assert op["status"] == "unknown", (seed, op)
    (child_file,) = child_rollouts(runtime_home(w.home, WS, sid))
    lines = child_file.read_bytes().split(b"\n")
    ends = [i for i, raw in enumerate(lines) if b'"task_complete"' in raw]
    child_file.write_bytes(b"\n".join(lines[: ends[-1]]) + b"\n")
    evidence = _resolve(c, op["operationId"], "inspect")["evidence"]
    (child,) = evidence["children"]
    assert child["turnsEqualPrefix"] is False, (seed, evidence)
    assert evidence["verdict"] == "ambiguous", (seed, evidence)
    try:
        _resolve(c, op["operationId"], "adopt")
        raise AssertionError((seed, "a child cut before its boundary Turn's end was adopted"))
    except ApiError as err:
        assert err.status == 409, (seed, err)
    got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})["operation"]
    assert got["status"] == "unknown", (seed, got)
    abandoned = _resolve(c, op["operationId"], "abandon")
    assert abandoned["operation"]["status"] == "abandoned", (seed, abandoned)
    moved = [Path(p).name for p in abandoned["evidence"]["quarantinedNow"]]
    assert moved == [child_file.name], (seed, moved)
    again = _fork(c, sid, turns[1]["turnId"], target=op["targetAgentSessionId"])
    assert again["status"] == "committed", (seed, again)
    assert _proof_of(w.home, again["operationId"]) == "in_worker", seed
    spoke = run_turn(c, again["targetAgentSessionId"], "the child speaks")
    assert spoke["outcome"] == "completed", (seed, spoke)
    return 1


def _runtime_gone(private_home: Path) -> bool:
    """No process runs with `private_home` as its `HOME` (its app-server ended)."""
    want = b"HOME=" + str(private_home).encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry.name}/environ", "rb") as fh:
            if want in fh.read().split(b"\0"):
                return False
    return True


def lean_resume_repaired(w: Any, c: Client) -> int:
    """The second cell (see the module's words). Returns 1."""
    seed = w.seed
    sid = create_session(c, cwd=w.cwd)["agentSessionId"]
    for text in ("one", "two"):
        turn = run_turn(c, sid, text)
        assert turn["outcome"] == "completed", (seed, turn)
    worker = worker_of(w.daemon, TUTTI)
    assert worker and worker.get("pid"), (seed, worker)
    os.kill(int(worker["pid"]), signal.SIGKILL)
    provider_home = runtime_home(w.home, WS, sid)
    wait_for(lambda: _runtime_gone(provider_home / ".home"), timeout=30)
    (path,) = (p for p in rollouts(provider_home) if p not in child_rollouts(provider_home))
    whole = path.read_bytes()
    lines = whole.split(b"\n")
    lines[-3] = b"{not json"  # a line in the middle no reader takes
    path.write_bytes(b"\n".join(lines))
    broken = run_turn(c, sid, "three")
    assert broken["outcome"] == "failed", (seed, broken)
    assert "corrupt rollout line" in (broken["error"] or ""), (seed, broken)
    path.write_bytes(whole)  # the rollout reads again
    again = run_turn(c, sid, "four")
    assert again["outcome"] == "completed", (seed, again)
    return 1
