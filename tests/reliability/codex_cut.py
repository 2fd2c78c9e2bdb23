"""The soaks' rollout-cut cell, run once on Codex and once on the Tutti Agent: a Session's
rollout cut back by hand to before its last bound, completed Turn (every line left whole, so
nothing reads it as torn) while its app-server runs. Its next Turn fails
`provider_history_missing` naming that Turn, nothing appended to the rollout; a fork through
that Turn is refused the same (before any operation, or a `failed` one); the rollout put back,
the next Turn completes on the same Session. What it leaves (the Session's Turns, a failed
operation) is judged by the soak's final `assert_invariants` with the rest —
`codex_turn_in_rollout` and `tutti_turn_in_rollout` among them, which a rollout left cut would
break. The crash soak runs it with its clients parked (`codex_cut_cells`), the contention soak
under its chaos (`rollout_cut_cells`)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.daemon import WS, create_session, run_turn, wait_for
from tests.support.homes import child_rollouts, rollouts, runtime_home
from transport.client import ApiError, Client

PROVIDERS = {"codex": "codex-home", "tutti-agent": "tutti-agent-home"}
"""The providers the cell runs on, and their provider home's folder name."""
ENDED = ("committed", "failed", "unknown", "abandoned")


def codex_cut_cells(w: Any) -> Counter[str]:
    """The cells on `w`'s daemon (a crash soak `World`: `home`, `daemon`, `seed`, `cwd`), its
    clients parked. Returns what ran, for the chaos tally."""
    return rollout_cut_cells(w.home, w.daemon.client(timeout=60), w.seed, w.cwd)


def rollout_cut_cells(home: Path, c: Client, seed: int, cwd: str) -> Counter[str]:
    """The cell once per app-server provider, each on a Session of its own made in `cwd`
    through `c`, on the daemon of `home`. Returns what ran, for the chaos tally."""
    ran: Counter[str] = Counter()
    for provider, home_dir in PROVIDERS.items():
        cut_cell(home, c, seed, cwd, provider, home_dir)
        ran[f"{provider}_cut_refused_then_repaired"] += 1
    return ran


def cut_cell(home: Path, c: Client, seed: int, cwd: str, provider: str, home_dir: str) -> None:
    """One Session of `provider` cut, refused, put back (see the module)."""
    sid = create_session(c, provider=provider, title="cut", cwd=cwd)["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("first", "second")]
    assert [t["outcome"] for t in turns] == ["completed"] * 2, (seed, provider, turns)
    provider_home = runtime_home(home, WS, sid, home_dir)
    (rollout,) = [p for p in rollouts(provider_home) if p not in child_rollouts(provider_home)]
    whole = rollout.read_bytes()
    lines = whole.split(b"\n")
    at = max(i for i, line in enumerate(lines) if b'"task_started"' in line)
    last = str(json.loads(lines[at])["payload"]["turn_id"])
    cut = b"\n".join(lines[:at]) + b"\n"
    rollout.write_bytes(cut)
    refused = run_turn(c, sid, "third")
    assert refused["outcome"] == "failed", (seed, provider, refused)
    assert refused["errorReason"] == "provider_history_missing", (seed, provider, refused)
    assert last in (refused["error"] or ""), (seed, provider, refused)
    assert rollout.read_bytes() == cut, (seed, provider)
    params = {
        "workspaceId": WS,
        "agentSessionId": sid,
        "requestId": str(uuid.uuid4()),
        "targetAgentSessionId": str(uuid.uuid4()),
        "point": {"type": "throughTurn", "turnId": turns[1]["turnId"]},
    }
    try:
        op = c.call("fork.create", params)["operation"]
    except ApiError as exc:
        assert "provider_history_missing" in str(exc), (seed, provider, exc)
    else:
        get = {"workspaceId": WS, "operationId": op["operationId"]}

        def ended() -> dict[str, Any] | None:
            got = c.call("fork.get", get)["operation"]
            return dict(got) if got["status"] in ENDED else None

        op = wait_for(ended, timeout=60)
        assert op["status"] == "failed", (seed, provider, op)
        assert "provider_history_missing" in (op["error"] or ""), (seed, provider, op)
    assert child_rollouts(provider_home) == [], (seed, provider)
    rollout.write_bytes(whole)  # put back
    again = run_turn(c, sid, "fourth")
    assert again["outcome"] == "completed", (seed, provider, again)
