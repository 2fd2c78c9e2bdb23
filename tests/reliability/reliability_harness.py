"""Shared plumbing of the reliability suite: the short/soak profile switch, which providers are
wired into the worker, a per-provider environment (config + local model server), and the
ledger every suite writes its tallies to (printed as one summary table at the end of the run).

Nothing here is faked except the model servers; daemons, workers and providers are real.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from drivers.worker import DRIVER_MODULES
from tests.support.daemon import WS, DaemonProcess
from tests.support.invariants import provider_children
from transport.client import ApiError, Client

SOAK = os.environ.get("AGENTHOST_SOAK") == "1"
"""`make soak` (AGENTHOST_SOAK=1): the long profile; otherwise the short one of `make test`."""

PROVIDERS = ("tutti-agent", "codex", "claude-code")
REPO = Path(__file__).resolve().parents[2]


def trials(short: int, soak: int) -> int:
    return soak if SOAK else short


REPLAY: pytest.StashKey[Callable[[], str]] = pytest.StashKey()
"""A soak's words for its failure, read when it fails (`conftest.py` adds them to the
report as its "soak replay" section): the seed, where it was, how to replay the draws."""


def replay_hint(name: str, seed: int, where: str) -> str:
    """`name`'s failure at `where` and the command that replays its seed's draws (the
    threads' timing is the machine's: a replay draws the same, it need not meet the same)."""
    profile = "AGENTHOST_SOAK=1 " if SOAK else ""
    return (
        f"{name} failed at {where}, seed {seed}; replay its draws with {profile}"
        f"AGENTHOST_SOAK_SEED={seed}"
    )


def unwired_reason(provider: str) -> str | None:
    """Why `provider` cannot run through the worker yet (checked at collection), or None."""
    module = DRIVER_MODULES.get(provider)
    if module is None:
        return f"drivers/worker.py maps no driver module for {provider!r}"
    if importlib.util.find_spec(module) is None:
        return f"{module.replace('.', '/')}.py does not exist: the {provider} driver is not wired"
    if provider == "claude-code" and importlib.util.find_spec("claude_agent_sdk") is None:
        return "claude-agent-sdk is not installed (make test installs it)"
    if provider == "codex" and codex_binary() is None:
        return "the pinned codex binary is not installed (make test installs it)"
    return None


def codex_binary() -> str | None:
    env = os.environ.get("AGENTHOST_CODEX_BIN")
    if env and Path(env).exists():
        return env
    pinned = REPO / "build/providers/codex/node_modules/.bin/codex"
    return str(pinned) if pinned.exists() else None


@contextlib.contextmanager
def provider_env(
    provider: str,
    home: Path,
    *,
    config: str = "",
    also: tuple[str, ...] = (),
    commands: Mapping[str, str] | None = None,
) -> Iterator[Path]:
    """Writes `home/agenthost.toml` for `provider` and the providers `also` (pointing each at a
    local model server that lives for the block) after `config` (more of the file, e.g. a
    `[daemon]` table) and yields a cwd for `provider`'s sessions. Every provider's Sessions may
    run in the block: the soaks mix `claude-code` and `codex` Sessions among their
    `tutti-agent` ones this way. `commands`: a provider's program instead of its own (the
    soaks' Codex behind `provider_chaos.codex_front`)."""
    home.mkdir(parents=True, exist_ok=True)
    cwd = home.parent / f"cwd-{provider}"
    cwd.mkdir(exist_ok=True)
    with contextlib.ExitStack() as servers:
        commands = commands or {}
        text = config + "".join(
            _provider_table(p, servers, commands.get(p)) for p in (provider, *also)
        )
        if text:
            (home / "agenthost.toml").write_text(text)
        yield cwd


def _provider_table(
    provider: str, servers: contextlib.ExitStack, command: str | None = None
) -> str:
    """`provider`'s table of `agenthost.toml`, its model server started on `servers` (none for
    `tutti-agent`: the built-in deterministic model)."""
    if provider == "tutti-agent":
        return ""
    if provider == "claude-code":
        from model_fakes.messages import MessagesServer
        from tests.reliability.interaction_chaos import soak_reply

        # The default echo, and a Bash call for `/bash …` (the soaks' permission asks).
        messages = servers.enter_context(MessagesServer(reply=soak_reply))
        cli = f'cli_path = "{command}"\n' if command else ""
        return f'[providers.claude-code]\nmodel_base_url = "{messages.base_url}"\n{cli}'
    if provider == "codex":
        from model_fakes.responses import ResponsesServer
        from tests.reliability.interaction_chaos import soak_responses_reply

        # The default echo, and an `exec_command` call for `/run …` (the soaks' approvals).
        responses = servers.enter_context(ResponsesServer(reply=soak_responses_reply))
        return (
            f'[providers.codex]\ncommand = "{command or codex_binary()}"\nmodel = "mock-model"\n'
            f'model_base_url = "{responses.base_url}"\n'
        )
    raise ValueError(provider)


def children_of(home: Path, source_provider_session_id: str) -> set[str]:
    """Distinct provider children of one source, counted in the provider homes."""
    return {
        c.child_id
        for c in provider_children(home)
        if c.source_provider_session_id == source_provider_session_id
    }


def fork_params(
    sid: str,
    turn_id: str,
    *,
    request_id: str | None = None,
    target: str | None = None,
    ws: str = WS,
) -> dict[str, Any]:
    return {
        "workspaceId": ws,
        "agentSessionId": sid,
        "requestId": request_id or str(uuid.uuid4()),
        "targetAgentSessionId": target or str(uuid.uuid4()),
        "point": {"type": "throughTurn", "turnId": turn_id},
    }


def fork_latest_params(sid: str, *, ws: str = WS) -> dict[str, Any]:
    """`fork.create` of the whole Session (`latestSettled`), new identities."""
    return {
        "workspaceId": ws,
        "agentSessionId": sid,
        "requestId": str(uuid.uuid4()),
        "targetAgentSessionId": str(uuid.uuid4()),
        "point": {"type": "latestSettled"},
    }


def resolve_params(op_id: str, action: str, *, ws: str = WS) -> dict[str, Any]:
    """`fork.resolve` of one operation, a new request id."""
    return {
        "workspaceId": ws,
        "operationId": op_id,
        "requestId": str(uuid.uuid4()),
        "action": action,
    }


def session_exists(c: Client, sid: str, ws: str = WS) -> bool:
    try:
        c.call("session.get", {"workspaceId": ws, "agentSessionId": sid})
    except ApiError as err:
        assert err.status == 404, err
        return False
    return True


def worker_of(d: DaemonProcess, provider: str) -> dict[str, Any] | None:
    workers = d.client().call("host.status")["workers"]
    return next((w for w in workers if w["provider"] == provider), None)


def host_fired(d: DaemonProcess, point: str) -> bool:
    """The durable `once:` marker: proof that the host failpoint really fired."""
    return (d.home / "run" / "failpoints-host" / f"fired.{point}").exists()


def worker_fired(d: DaemonProcess, point: str) -> bool:
    return (d.home / "run" / "workers" / "failpoints-state" / f"fired.{point}").exists()


class PointTally:
    """The failpoints a soak armed and the `once:` ones that fired: their markers (`host_fired`,
    `worker_fired`), looked at before anything arms the point again (an arming clears its
    marker), each marker counted once. A soak's summary says which of its points its run met:
    `arm_failpoint` counts an arming, which a later round may turn off unfired. A point armed
    for another action (`arm(..., kill=False)`: a client's `once:error`, a directed flow's
    helper) replaces the soak's arming, and its firing is counted `apart`, never as the
    point's kill."""

    def __init__(self) -> None:
        self.armed: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()
        self.apart: Counter[str] = Counter()
        self._kill: dict[str, bool] = {}
        self._seen: set[tuple[str, int]] = set()

    def arm(self, name: str, *, kill: bool = True) -> None:
        self._kill[name] = kill
        if kill:
            self.armed[name] += 1

    def look(self, home: Path) -> None:
        for folder in (
            home / "run" / "failpoints-host",
            home / "run" / "workers" / "failpoints-state",
        ):
            with contextlib.suppress(FileNotFoundError):
                for marker in sorted(folder.glob("fired.*")):
                    with contextlib.suppress(FileNotFoundError):
                        key = (marker.name[len("fired.") :], marker.stat().st_mtime_ns)
                        if key not in self._seen:
                            self._seen.add(key)
                            counts = self.fired if self._kill.get(key[0], True) else self.apart
                            counts[key[0]] += 1

    def summary(self) -> str:
        never = sorted(set(self.armed) - set(self.fired))
        return (
            "failpoints armed: "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.armed.items())) or "none")
            + "; fired (once: markers): "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.fired.items())) or "none")
            + "; fired apart (armed for another action): "
            + (" ".join(f"{k}={v}" for k, v in sorted(self.apart.items())) or "none")
            + f"; armed, never fired: {never or 'none'}"
        )


@dataclass
class Ledger:
    """Tallies every reliability suite reports; `pytest_terminal_summary` prints them."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self,
        suite: str,
        cell: str,
        *,
        trials: int = 1,
        outcomes: Counter[str] | None = None,
        invariant_checks: int = 0,
        violations: int = 0,
        note: str = "",
    ) -> None:
        with self.lock:
            row = self.rows.setdefault(
                f"{suite} {cell}",
                {
                    "suite": suite,
                    "cell": cell,
                    "trials": 0,
                    "outcomes": Counter(),
                    "checks": 0,
                    "violations": 0,
                    "note": note,
                },
            )
            row["trials"] += trials
            row["outcomes"].update(outcomes or {})
            row["checks"] += invariant_checks
            row["violations"] += violations
            if note:
                row["note"] = note

    def table(self) -> list[str]:
        with self.lock:
            rows = list(self.rows.values())
        if not rows:
            return []
        lines = [
            f"profile: {'soak (AGENTHOST_SOAK=1)' if SOAK else 'short'}",
            f"{'suite':<12} {'cell':<46} {'trials':>6} {'checks':>6} {'viol':>4}  outcomes",
        ]
        for r in sorted(rows, key=lambda r: (r["suite"], r["cell"])):
            outcomes = ", ".join(f"{k}={v}" for k, v in sorted(r["outcomes"].items()))
            note = f"  ({r['note']})" if r["note"] else ""
            lines.append(
                f"{r['suite']:<12} {r['cell']:<46} {r['trials']:>6} {r['checks']:>6} "
                f"{r['violations']:>4}  {outcomes}{note}"
            )
        total_trials = sum(r["trials"] for r in rows)
        total_checks = sum(r["checks"] for r in rows)
        total_viol = sum(r["violations"] for r in rows)
        lines.append(
            f"{'TOTAL':<12} {str(len(rows)) + ' cells':<46} {total_trials:>6} {total_checks:>6} "
            f"{total_viol:>4}"
        )
        return lines


LEDGER = Ledger()
