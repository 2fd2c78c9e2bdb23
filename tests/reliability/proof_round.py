"""The crash soak's first daemon proves its app-server forks' children readable by a fresh
app-server (`readability_proof = "app_server"` in the Tutti Agent's and Codex's tables of
`agenthost.toml`), the fallback proof the in-worker readers stand in front of; the rounds'
first restart goes back to the default (`in_worker`) for the rest of the soak. Before the
clients start, a fork of a Tutti Agent Session and one of a Codex Session of the cell's own
commit, each proven `app_server` (its binding receipt), and the clients' and the first round's
forks on that daemon are judged by the round's checks like every other."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tests.reliability.tutti_forks import _fork, _proof_of
from tests.support.daemon import create_session, run_turn

PROOF_LINE = 'readability_proof = "app_server"'
TABLES = ('[providers."tutti-agent"]', "[providers.tutti-agent]", "[providers.codex]")
"""The app-server providers' table headers as the soak's `agenthost.toml` spells them."""


def set_app_server_proof(home: Path, on: bool) -> None:
    """Adds (`on`) or removes the key in every app-server provider table of `home`'s
    `agenthost.toml` (a table missing is added with only the key: the Tutti Agent's)."""
    path = home / "agenthost.toml"
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() != PROOF_LINE]
    if on:
        headers = [n for n, ln in enumerate(lines) if ln.strip() in TABLES]
        tutti = any(lines[n].strip() in TABLES[:2] for n in headers)
        for n in reversed(headers):
            lines.insert(n + 1, PROOF_LINE)
        if not tutti:
            lines += ['[providers."tutti-agent"]', PROOF_LINE]
    path.write_text("\n".join(lines) + "\n")


def forks_proven_by_app_server(w: Any, providers: tuple[str, ...]) -> Counter[str]:
    """A fork of a fresh Session of each provider on `w`'s daemon (a crash soak `World`: `home`,
    `daemon`, `seed`, `cwd`), committed and proven `app_server`; its child runs a Turn."""
    ran: Counter[str] = Counter()
    c = w.daemon.client(timeout=60)
    for provider in providers:
        sid = create_session(c, provider=provider, cwd=w.cwd)["agentSessionId"]
        turn = run_turn(c, sid, "proven by a fresh app-server")
        assert turn["outcome"] == "completed", (w.seed, turn)
        op = _fork(c, sid, turn["turnId"])
        assert op["status"] == "committed", (w.seed, provider, op)
        assert _proof_of(w.home, op["operationId"]) == "app_server", (w.seed, provider)
        spoke = run_turn(c, op["targetAgentSessionId"], "the child speaks")
        assert spoke["outcome"] == "completed", (w.seed, provider, spoke)
        ran[f"app_server_proof {provider}"] += 1
    return ran
