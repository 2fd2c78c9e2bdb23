"""A slow provider fork in the soaks: a Tutti Agent Session of the soak's own whose app-server
starts behind the relay (`tests/daemon/misbehaving_app_server.py`, its arm directory made before
its first Turn) is forked with the relay's fork arm set (`slow N`): the relay holds the
`thread/fork` request N ms, about the worker's limit for a provider's fork call
(`LIMIT_S`, the soak's `[daemon] fork_provider_call_seconds`), before it passes it on. So the
worker's limit fires before the provider answers, the request not yet passed on or the real
provider mid-fork, and the worker kills the app-server's process tree before it answers
`unknown` (docs/reliability.md: a fork unknown by the worker's limit, then abandoned); or the
provider's answer comes just in time and the fork commits. A person then abandons an `unknown`
fork at once (`fork.resolve abandon`), and the Session's next Turn runs on a new app-server:
the invariants checked after see no provider child owned by no operation (`child_owned`), the
abandon's quarantine (`quarantine`), and no process of the killed app-server left
(`process_owned`). The soak's kills meet the fork while it is held (a restart makes it
`unknown` too)."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import apsw

from tests.reliability.reliability_harness import fork_latest_params
from tests.support.daemon import WS, run_turn, wait_for
from transport.client import ApiError, Client, ClientClosed, ClientTimeout

LIMIT_S = 12.0
"""`[daemon] fork_provider_call_seconds` of a soak with slow forks: the worker's limit for a
provider's fork call (60 s by default: too long for a soak's round)."""
WORKER_LIMIT = "no answer in"
"""How an operation the worker's limit made `unknown` says it (its `error`)."""


def daemon_table() -> str:
    """The `[daemon]` table of a soak with slow forks."""
    return f"[daemon]\nfork_provider_call_seconds = {LIMIT_S}\n"


class SlowFork:
    """The slow forks of one soak, and how each ended."""

    def __init__(self, home: Path, arm_dir: Path, seed: int) -> None:
        self.home = home
        self.arm_dir = arm_dir
        self.rng = random.Random(f"slow-fork-{seed}")  # the soak's draws unchanged
        self.sid: str | None = None
        self.op_id: str | None = None
        self.reply: Future[Any] | None = None
        self.request_id = ""
        self.client: Client | None = None
        self.outcomes: Counter[str] = Counter()

    def setup(self, c: Client, cwd: str) -> None:
        """The Session, its arm directory made before its first Turn starts its app-server."""
        params = {"workspaceId": WS, "provider": "tutti-agent", "cwd": cwd, "title": "slow fork"}
        self.sid = str(c.call("session.create", params)["session"]["agentSessionId"])
        (self.arm_dir / self.sid).mkdir()
        assert run_turn(c, self.sid, "warm")["outcome"] == "completed"

    def start(self, c: Client, *, past_the_limit: bool = False) -> None:
        """Arms the relay's slow `thread/fork` and sends the fork (its answer awaited by
        `settle`): held about `LIMIT_S`, a little less or a little more (`past_the_limit`:
        more, so the worker's limit fires first)."""
        assert self.sid is not None
        extra = self.rng.uniform(0.5, 1.0) if past_the_limit else self.rng.uniform(-1.0, 0.5)
        hold_ms = int(1000 * (LIMIT_S + extra))
        (self.arm_dir / self.sid / "armed-fork").write_text(f"slow {hold_ms}\n")
        params = fork_latest_params(self.sid)
        self.op_id = None
        self.client = c  # (kept while its answer is awaited)
        self.reply = c.submit("fork.create", params)
        self.request_id = params["requestId"]

    def settle(self, c: Client) -> str:
        """The clients parked: the fork's end (the daemon may have been restarted since: its
        operation is found by its request id), an `unknown` one abandoned at once, then the
        Session's next Turn. Returns how it ended."""
        assert self.sid is not None and self.reply is not None
        arm = self.arm_dir / self.sid / "armed-fork"
        op = self._operation(c)
        if op is None:
            arm.unlink(missing_ok=True)  # never taken: off
            self.outcomes["refused or lost before an operation"] += 1
            return "none"

        def ended() -> dict[str, Any] | None:
            got = dict(c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]}))
            return got["operation"] if got["operation"]["status"] != "accepted" else None

        final = wait_for(ended, LIMIT_S * 4, interval=0.2)
        arm.unlink(missing_ok=True)  # never taken (the fork ended before its provider call): off
        status = str(final["status"])
        how = status
        if status == "unknown":
            by = "by the worker limit" if WORKER_LIMIT in str(final.get("error")) else "other"
            how = f"unknown ({by})" if by != "other" else f"unknown ({final.get('error')})"[:90]
            answer = c.call(
                "fork.resolve",
                {
                    "workspaceId": WS,
                    "operationId": final["operationId"],
                    "requestId": str(uuid.uuid4()),
                    "action": "abandon",
                },
                timeout=90,
            )
            status = str(answer["operation"]["status"])
            assert status == "abandoned", answer
            how += ", abandoned"
        self.outcomes[how] += 1
        wait_for(lambda: self._idle(c), 60)
        turn = run_turn(c, self.sid, "after the slow fork")
        assert turn["outcome"] == "completed", turn  # on a new app-server
        return how

    def met_the_limit(self) -> int:
        """How many slow forks the worker's limit made `unknown`."""
        return sum(n for how, n in self.outcomes.items() if "by the worker limit" in how)

    def _operation(self, c: Client) -> dict[str, Any] | None:
        assert self.reply is not None
        try:
            status, body = self.reply.result(LIMIT_S * 4)
        except (ClientTimeout, ClientClosed, TimeoutError):
            status, body = 0, {}
        if 0 < status < 400:
            return dict(body["operation"])
        if status >= 400:
            return None
        # The answer was lost with a killed daemon: its operation, if it made one, read in
        # the store beside the daemon.
        conn = apsw.Connection(str(self.home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            conn.set_busy_timeout(10_000)
            row = conn.execute(
                "SELECT operation_id FROM fork_operations WHERE request_id = ?",
                (self.request_id,),
            ).fetchone()
        finally:
            conn.close()
        if row is None:
            return None
        got = c.call("fork.get", {"workspaceId": WS, "operationId": str(row[0])})
        return dict(got["operation"])

    def _idle(self, c: Client) -> bool:
        assert self.sid is not None
        try:
            got = c.call("session.get", {"workspaceId": WS, "agentSessionId": self.sid})
        except ApiError:
            return False
        return got["session"]["activeTurnId"] is None
