"""The crash soak's Codex cell run once its rounds are over (the clients parked): a Codex
Session's rollout cut back by hand to before its last bound, completed Turn (every line left
whole, so nothing reads it as torn) while its app-server runs. Its next Turn fails
`provider_history_missing` naming that Turn, nothing appended to the rollout; a fork through
that Turn is refused the same (before any operation, or a `failed` one); the rollout put back,
the next Turn completes on the same Session. What it leaves (the Session's Turns, a failed
operation) is judged by the soak's final `assert_invariants` with the rest —
`codex_turn_in_rollout` among them, which a rollout left cut would break."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

from tests.support.daemon import WS, create_session, run_turn, wait_for
from tests.support.homes import child_rollouts, rollouts, runtime_home
from transport.client import ApiError

CODEX = "codex"
ENDED = ("committed", "failed", "unknown", "abandoned")


def codex_cut_cells(w: Any) -> Counter[str]:
    """The cell on `w`'s daemon (a crash soak `World`: `home`, `daemon`, `seed`, `cwd`), its
    clients parked. Returns what ran, for the chaos tally."""
    seed = w.seed
    c = w.daemon.client(timeout=60)
    sid = create_session(c, provider=CODEX, title="cut", cwd=w.cwd)["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("first", "second")]
    assert [t["outcome"] for t in turns] == ["completed"] * 2, (seed, turns)
    home = runtime_home(w.home, WS, sid, "codex-home")
    (rollout,) = [p for p in rollouts(home) if p not in child_rollouts(home)]
    whole = rollout.read_bytes()
    lines = whole.split(b"\n")
    at = max(i for i, line in enumerate(lines) if b'"task_started"' in line)
    last = str(json.loads(lines[at])["payload"]["turn_attribution"]["turn_id"])
    cut = b"\n".join(lines[:at]) + b"\n"
    rollout.write_bytes(cut)
    refused = run_turn(c, sid, "third")
    assert refused["outcome"] == "failed", (seed, refused)
    assert refused["errorReason"] == "provider_history_missing", (seed, refused)
    assert last in (refused["error"] or ""), (seed, refused)
    assert rollout.read_bytes() == cut, seed
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
        assert "provider_history_missing" in str(exc), (seed, exc)
    else:
        get = {"workspaceId": WS, "operationId": op["operationId"]}

        def ended() -> dict[str, Any] | None:
            got = c.call("fork.get", get)["operation"]
            return dict(got) if got["status"] in ENDED else None

        op = wait_for(ended, timeout=60)
        assert op["status"] == "failed", (seed, op)
        assert "provider_history_missing" in (op["error"] or ""), (seed, op)
    assert child_rollouts(home) == [], seed
    rollout.write_bytes(whole)  # put back
    again = run_turn(c, sid, "fourth")
    assert again["outcome"] == "completed", (seed, again)
    return Counter({"codex_cut_refused_then_repaired": 1})
