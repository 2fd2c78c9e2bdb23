"""A misbehaving provider in the soaks' chaos (docs/reliability.md, "A misbehaving provider in
the soaks"): every Tutti Agent and Codex app-server of the soak's home starts through a `sh`
front that runs the relay `tests/daemon/misbehaving_app_server.py` for the few Sessions this
module makes (`FAULT_SESSIONS` Tutti Agent ones, `CODEX_FAULT_SESSIONS` Codex ones, each with
its arm directory) and execs the real program for every other. A round picks one of them and a
fault — one endless line, garbage between the provider's lines, its stdout closed
at a `turn/start` or once the Turn runs, notifications whose params are no object, a
`turn/start` answered without a turn id (the Turn never named after), a reply streamed as one
delta past the event cap (`bigdelta`, heard by the contention soak's reading subscriber for
`events_bounded`); in the contention soak also a runtime stopped at its `turn/start` (`STOP`)
or as it starts, its Turn interrupted then (`STOP_START`) — arms it,
submits a Turn, waits for it to settle, then runs the Session's next Turn, and keeps what it
saw (`ProviderFault`) for `check_provider_faults` (`provider_fault_settles`): the Turn settled
within its bound (`failed` with a typed reason where the pipe broke, `completed` where the
reader skips the lines), the broken runtime killed, the next Turn on a new one, the worker's
peak RSS within `FAULT_RSS_BOUND_KIB`. A round a kill, a restart, a SIGSTOP or the contention
soak's one-shot start failpoint of the soak's own met is kept as disturbed: only its settlement
is judged."""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from drivers.codex.command import native_behind_npm_shim
from tests.reliability.reliability_harness import codex_binary, provider_env
from tests.support.daemon import WS, DaemonProcess
from tests.support.freezer import running
from tests.support.invariants import (
    ProviderFault,
    Violation,
    breaking_faults,
    check_provider_faults,
)
from transport.client import Client, ClientClosed, ClientTimeout

RELAY = Path(__file__).parents[1] / "daemon" / "misbehaving_app_server.py"
FAULTS = ("endless", "garbage", "close", "close_mid", "notobject", "noid", "stderr", "bigdelta")
STOP = "stop"
"""The relay stops itself (SIGSTOP) at the `turn/start` (a Claude Turn's prompt) it takes: a
runtime stopped before it answers, whose Turn fails `provider_stopped` at the daemon's
`provider_stopped_seconds` and whose Session's next Turn runs on a new one (it holds no Session
beyond its stop). Only where that limit is short (the contention soak's 2 s): not in `FAULTS`."""
STOP_START = "stop_start"
"""The Session's app-server killed first, so its next Turn starts it (`session.start`), and the
relay in `stop_open` mode stops itself (SIGSTOP) at that start's `thread/resume`; once it is
seen stopped the round interrupts the Turn: it settles `interrupted` at once, the start given
up is ended in the worker (`session.stop` with `startOnly`: design/drivers.md "The starting
case"), the stopped relay killed, and the Session's next Turn runs on a new one. An app-server
provider's only (a Claude Code Session's round skips it); in the contention soak, whose
`provider_stopped_seconds` (2 s) would end the start too, the interrupt comes as soon as the
relay is seen stopped, and a Turn the liveness check failed first is a disturbed round."""
RELAY_MODE = {STOP_START: "stop_open"}
"""The relay's arm for a fault the relay knows by another name."""
STOPPED_SEEN_S = 10.0
"""How long a `stop_start` round waits to see its relay stopped once it took the arm."""
FAULT_SESSIONS = 2
"""The Tutti Agent Sessions whose app-server misbehaves on demand (the chaos's own: no other
client of the soak works on them, so each fault lands on the Turn the round submitted)."""
CODEX_FAULT_SESSIONS = 1
"""The Codex Sessions whose app-server misbehaves on demand (the same relay: Codex's app-server
speaks the same JSON lines), when the soak's home fronts Codex (`codex_front`)."""
CLAUDE_FAULT_SESSIONS = 1
"""The Claude Code Sessions whose CLI misbehaves on demand (the relay's `--claude` dialect:
stream-json lines), when the soak's home fronts Claude Code (`claude_front`)."""
TUTTI = "tutti-agent"
CODEX = "codex"
CLAUDE = "claude-code"
FAULT_BOUND_S = 20.0
"""A faulted Turn settles within this of its fault (the relay's take at its `turn/start`):
reading 64 MiB or the 0.5 s grace of a closed stdout (`EOF_EXIT_GRACE_S`), then the kill, under
the soak's load — before the 30 s `turn/start` timeout and the 39 s liveness failure a broken
pipe used to wait for."""
LOAD_ALLOWANCE = 2.0
"""A faulted Turn settled past `FAULT_BOUND_S` is still in its bound when it settled within
`FAULT_BOUND_S` + this × the time the Session's next, plain Turn took: a machine so loaded that
a plain Turn takes tens of seconds (a Claude Code CLI's start, ~1 s quiet, took 10–27 s at a
load of 12 on 2 cores) stretches the fault's handling alike, and the bound is the daemon's, not
the machine's. A quiet machine's plain Turn adds a few seconds at most."""
TAKEN_S = 60.0
"""How long a Turn may take to reach its `turn/start` (a runtime started under the soak's load)."""
SETTLE_S = 120.0
"""How long any other Turn of the chaos is waited for."""
KILLED_S = 10.0
"""The broken runtime's relay is gone this soon after its Turn settled."""
BIG_DELTA_CHARS = 300 << 10
"""`bigdelta`'s streamed reply: one delta past the 256 KiB event cap (`events_bounded`)."""
TEXT = {"close_mid": "/slow 600000 never", "bigdelta": "/stream " + "b" * BIG_DELTA_CHARS}
"""The faulted Tutti Agent Turn's text (else `hello`): `close_mid`'s a Turn the model keeps
running for 10 minutes; `bigdelta`'s a reply streamed (joined by the relay into one delta).
A Codex Turn's is `hello` (its fake Responses API answers at once: `close_mid` closes the
relay's stdout at the Turn's `turn/started`, so the driver never reads its end)."""


def _front(
    arm_dir: Path, name: str, real: str, home_var: str, dialect: tuple[str, ...] = ()
) -> Path:
    """`arm_dir/name`: a shell script that runs the relay (this Python's) in front of `real`
    for a Session with an arm directory (its provider home, `$home_var`, under
    `runtimes/<ws>/<session>/`), and execs `real` for any other (no Python started for it:
    the soaks' other Sessions pay one `sh`)."""
    arm_dir.mkdir(parents=True, exist_ok=True)
    program = shlex.quote(real)
    relay = " ".join(shlex.quote(str(a)) for a in (sys.executable, RELAY, *dialect, arm_dir))
    script = arm_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'session="${{{home_var}%/*}}"\n'
        'session="${session##*/}"\n'
        f'if [ -n "${home_var}" ] && [ -d {shlex.quote(str(arm_dir))}/"$session" ]; then\n'
        f'  exec {relay} -- {program} "$@"\n'
        "fi\n"
        f'exec {program} "$@"\n'
    )
    script.chmod(0o755)
    return script


def relay_table(arm_dir: Path) -> str:
    """The `agenthost.toml` table that starts every Tutti Agent program through `arm_dir`'s
    `tutti-agent` front (the real `tutti-agent` beside this Python behind it)."""
    tutti = str(Path(sys.executable).parent / "tutti-agent")
    script = _front(arm_dir, TUTTI, tutti, "TUTTI_AGENT_HOME")
    return f'[providers."tutti-agent"]\ncommand = ["{script}"]\n'


def codex_front(arm_dir: Path) -> str:
    """The `[providers.codex] command` that starts every Codex app-server through `arm_dir`'s
    `codex` front: the native binary the pinned npm shim would run (the driver resolves a
    configured shim the same way; no Node.js start for any Session)."""
    real = codex_binary()
    assert real is not None, "no codex binary (AGENTHOST_CODEX_BIN)"
    native = native_behind_npm_shim(real)
    return str(_front(arm_dir, CODEX, str(native or real), "CODEX_HOME"))


def claude_front(arm_dir: Path) -> str:
    """The `[providers.claude-code] cli_path` that starts every Claude Code CLI through
    `arm_dir`'s `claude-code` front (the SDK's bundled CLI behind it, the driver's default)."""
    import claude_agent_sdk

    real = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    return str(_front(arm_dir, CLAUDE, str(real), "CLAUDE_CONFIG_DIR", ("--claude",)))


class ProviderChaos:
    """The fault rounds of one soak and what they saw."""

    def __init__(self, arm_dir: Path, seed: int, kinds: tuple[str, ...] = FAULTS) -> None:
        self.arm_dir = arm_dir
        self.kinds = kinds
        """The faults the rounds take in turn."""
        self.rng = random.Random(seed)
        self.sids: list[str] = []
        self.providers: dict[str, str] = {}
        """Each of `sids`' provider."""
        self.faults: list[ProviderFault] = []
        self.calls: Counter[str] = Counter()
        self.failures: list[str] = []
        """What went wrong in a round's thread beyond the soak's faults (a bug, or an answer
        no law allows)."""
        self.violations: list[Violation] = []
        """What `every_fault`'s check found."""
        self.lock = threading.Lock()
        self.refused: str | None = None
        """The last submit `_submit` saw refused (`<status> <reason>`; the rounds run one at a
        time)."""
        self.next_fault = self.rng.randrange(len(kinds))
        self.next_provider = self.rng.randrange(3)

    def setup(self, c: Client, cwd: str | None = None) -> list[str]:
        """Makes the chaos's Sessions (each with its arm directory: the Codex ones only where
        the home fronts Codex, `codex_front` made in the arm directory) and runs a Turn on
        each."""
        codex = CODEX_FAULT_SESSIONS if (self.arm_dir / CODEX).exists() else 0
        claude = CLAUDE_FAULT_SESSIONS if (self.arm_dir / CLAUDE).exists() else 0
        providers = [TUTTI] * FAULT_SESSIONS + [CODEX] * codex + [CLAUDE] * claude
        for provider in providers:
            params: dict[str, Any] = {"workspaceId": WS, "provider": provider}
            sid = str(
                c.call("session.create", params | ({"cwd": cwd} if cwd else {}))["session"][
                    "agentSessionId"
                ]
            )
            (self.arm_dir / sid).mkdir()
            self.sids.append(sid)
            self.providers[sid] = provider
            turn = self._turn(c, sid, "warm", "pass")
            assert turn is not None and turn[0].get("outcome") == "completed", turn
            assert turn[1] is not None, "the relay served no Turn of the chaos's Session"
        return self.sids

    def round(
        self, c: Client, generation: Callable[[], int], stop: threading.Event | None = None
    ) -> ProviderFault | None:
        """One fault on one of the chaos's Sessions, and its next Turn (none once `stop` is
        set). `generation`: the soak's daemon generation (a restart meanwhile disturbs it)."""
        # The providers in turn (each meets the faults however few rounds a short soak runs),
        # one of its Sessions at random.
        kinds = sorted(set(self.providers.values()))
        provider = kinds[self.next_provider % len(kinds)]
        self.next_provider += 1
        sid = self.rng.choice([s for s in self.sids if self.providers[s] == provider])
        fault = self.kinds[self.next_fault % len(self.kinds)]
        name = fault if provider == TUTTI else f"{provider} {fault}"
        text = TEXT.get(fault, "hello") if provider == TUTTI else "hello"
        self.next_fault += 1
        began = generation()
        turn_id: str | None = None
        try:
            if not self._idle(c, sid, SETTLE_S):
                self._count(f"{name} skipped: the Session busy")
                return None
            if fault == STOP_START and provider == CLAUDE:
                self._count(f"{name} skipped: no app-server to stop as it starts")
                return None
            if fault == STOP_START:
                _end_relays(sid)  # its next Turn starts a new app-server: the start to stop
            worker = _worker_pid(c, provider)
            hwm = _peak_rss_kib(worker)
            turn_id = self._submit(c, sid, text, fault)
            if turn_id is None:
                return None
            pid = self._taken(c, sid, turn_id, TAKEN_S)
            # The bound runs from the fault (a Turn that never reached its `turn/start` met
            # none: it is given the settle wait of any Turn).
            taken = time.monotonic()
            if fault == STOP_START and pid is not None:
                self._interrupt_stopped(c, sid, turn_id, pid)
            turn = self._settled(c, sid, turn_id, FAULT_BOUND_S if pid else SETTLE_S)
            in_bound = turn is not None
            if turn is None and pid is not None:
                # Past the bound: waited for as any Turn, the bound then judged against the
                # machine's pace (`LOAD_ALLOWANCE`, once the next Turn has run).
                turn = self._settled(c, sid, turn_id, SETTLE_S - FAULT_BOUND_S)
            settle_s = time.monotonic() - taken
            # A worker the soak SIGSTOPped (the crash soak's stop rounds) holds the Turn.
            held = _stopped(worker)
            alive = False
            if pid is not None and fault in breaking_faults(provider) and turn is not None:
                deadline = time.monotonic() + KILLED_S
                while running(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                alive = running(pid)
            after = _worker_pid(c, provider)
            growth = None
            if after == worker and worker is not None:
                now = _peak_rss_kib(worker)
                growth = None if now is None or hwm is None else now - hwm
            # `stop`'s own failure is the fault's, judged; any other round's, the soak's SIGSTOP.
            stopped = (
                turn is not None and turn.get("errorReason") == "provider_stopped" and fault != STOP
            )
            by = [
                what
                for what, met in (
                    ("a SIGSTOP", stopped),
                    ("a start failpoint", _start_failed(turn)),
                    ("a stopped worker", held),
                    ("a new worker", after != worker),
                    ("a restart", generation() != began),
                )
                if met
            ]
            disturbed = bool(by)
            nxt = None
            next_s: float | None = None
            next_refused: str | None = None
            if turn is not None and not disturbed and not (stop and stop.is_set()):
                began_next = time.monotonic()
                self.refused = None
                nxt = self._turn(c, sid, "after", "pass")
                next_refused = self.refused if nxt is None else None
                next_s = time.monotonic() - began_next
                if nxt is None:
                    self._count(f"{name} next Turn refused")
                elif nxt[0].get("outcome") != "completed":
                    # What the law reports only as "failed": its words, for the summary.
                    said = f"{nxt[0].get('errorReason')} {str(nxt[0].get('error'))[:100]}"
                    self._count(f"{name} next Turn {nxt[0].get('outcome')}: {said}")
                if generation() != began or _worker_pid(c, provider) != worker:
                    disturbed, by = True, ["a kill after it"]
                elif nxt is not None and nxt[0].get("errorReason") == "provider_stopped":
                    disturbed, by = True, ["a SIGSTOP of the next Turn's runtime"]
                elif nxt is not None and _start_failed(nxt[0]):
                    disturbed, by = True, ["a start failpoint of the next Turn"]
            if not in_bound and turn is not None and next_s is not None:
                in_bound = settle_s <= FAULT_BOUND_S + LOAD_ALLOWANCE * next_s
                if in_bound:
                    self._count(f"{name} settled in {settle_s:.0f} s, a plain Turn {next_s:.0f} s")
        except (ClientTimeout, ClientClosed):
            self._count(f"{name} lost")
            if turn_id is None:
                return None
            record = ProviderFault(
                sid, fault, turn_id, in_bound=False, disturbed=True, provider=provider
            )
        else:
            record = ProviderFault(
                sid,
                fault,
                turn_id,
                in_bound=in_bound,
                disturbed=disturbed,
                relay_pid=pid,
                relay_alive=alive,
                next_outcome=None if nxt is None else str(nxt[0].get("outcome")),
                next_refused=None if disturbed else next_refused,
                next_pid=None if nxt is None else nxt[1],
                rss_growth_kib=growth,
                provider=provider,
            )
            outcome = "active" if turn is None else turn.get("outcome")
            why = "" if turn is None else f" {turn.get('errorReason')}"
            if turn is not None and outcome == "failed" and not turn.get("errorReason"):
                why = f" ({str(turn.get('error'))[:60]})"
            met = f" disturbed by {' and '.join(by)}" if disturbed else ""
            self._count(f"{name} {outcome}{why}{met}")
        with self.lock:
            self.faults.append(record)
        return record

    def guarded(
        self, c: Client, generation: Callable[[], int], stop: threading.Event | None = None
    ) -> None:
        """`round` in a thread of its own: what it raises is kept in `failures`."""
        try:
            self.round(c, generation, stop)
        except Exception as exc:  # noqa: BLE001 - a bug in the test or an untyped failure
            with self.lock:
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def run(self, connect: Callable[[], Client], stop: threading.Event) -> None:
        """Rounds one after another until `stop` (the contention soak's: no restart)."""
        c = connect()
        while not stop.is_set():
            self.guarded(c, lambda: 0, stop)

    def check(self, c: Client) -> list[Violation]:
        """The law over every round, against each faulted Turn as its Session answers now."""
        turns: dict[str, dict[str, Any]] = {}
        for sid in self.sids:
            status, body = c.call_raw(
                "session.timeline", {"workspaceId": WS, "agentSessionId": sid, "limit": 1000}
            )
            if status == 200:
                turns.update({str(t["turnId"]): t for t in body["turns"]})
        with self.lock:
            faults = list(self.faults)
        return check_provider_faults(faults, turns)

    def summary(self) -> str:
        growth = [f.rss_growth_kib for f in self.faults if f.rss_growth_kib is not None]
        peak = max(growth, default=0) // 1024
        made = Counter(self.providers.values())
        return (
            f"provider faults: {len(self.faults)} rounds on "
            + ", ".join(f"{n} {p}" for p, n in sorted(made.items()))
            + f" Sessions, worker peak RSS growth max {peak} MiB; "
            + " ".join(f"{k}={v}" for k, v in sorted(self.calls.items()))
        )

    def _count(self, key: str) -> None:
        with self.lock:
            self.calls[key] += 1

    def _arm(self, sid: str, mode: str) -> None:
        (self.arm_dir / sid / "armed.taken").unlink(missing_ok=True)
        (self.arm_dir / sid / "armed").write_text(RELAY_MODE.get(mode, mode))

    def _interrupt_stopped(self, c: Client, sid: str, turn_id: str, pid: int) -> None:
        """`stop_start`: the Turn interrupted once its relay is seen stopped in the start (an
        interrupt answered with a Turn settled otherwise is the round's to judge)."""
        deadline = time.monotonic() + STOPPED_SEEN_S
        while not _stopped(pid) and running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        status, body = c.call_raw(
            "turn.interrupt", {"workspaceId": WS, "agentSessionId": sid, "turnId": turn_id}
        )
        if status != 200:
            self._count(f"{STOP_START} interrupt {status} {body.get('reason')}")

    def _taken(self, c: Client, sid: str, turn_id: str, timeout: float) -> int | None:
        """The pid of the relay that took the Session's arm, once it did (None: none did, and
        the Turn settled or `timeout` passed; a daemon killed meanwhile raises `ClientTimeout`)."""
        taken = self.arm_dir / sid / "armed.taken"
        deadline = time.monotonic() + timeout
        looks = 0
        while time.monotonic() < deadline:
            lines = taken.read_text().split("\n") if taken.exists() else []
            if len(lines) > 1 and lines[1].strip():
                return int(lines[1])
            looks += 1
            if looks % 10 == 0 and self._settled(c, sid, turn_id, 0.0) is not None:
                break  # settled before its `turn/start`: no fault met it
            time.sleep(0.05)
        (self.arm_dir / sid / "armed").unlink(missing_ok=True)  # never taken: disarmed
        return None

    def _submit(self, c: Client, sid: str, text: str, mode: str) -> str | None:
        """Arms the Session's relay with `mode` and submits a Turn (a busy store is asked
        again); its id, or None when it was refused."""
        self._arm(sid, mode)
        params = {
            "workspaceId": WS,
            "agentSessionId": sid,
            "requestId": str(uuid.uuid4()),
            "input": [{"type": "text", "text": text}],
        }
        deadline = time.monotonic() + 30
        while True:
            status, body = c.call_raw("turn.submit", params)
            if status == 503 and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            if status >= 400:
                self._count(f"turn.submit {status} {body.get('reason')}")
                self.refused = f"{status} {body.get('reason')}"
                (self.arm_dir / sid / "armed").unlink(missing_ok=True)
                return None
            return str(body["turn"]["turnId"])

    def _turn(
        self, c: Client, sid: str, text: str, mode: str
    ) -> tuple[dict[str, Any], int | None] | None:
        """A Turn run to its end behind an arm of `mode`, and the relay that served it (None:
        the submit was refused)."""
        turn_id = self._submit(c, sid, text, mode)
        if turn_id is None:
            return None
        pid = self._taken(c, sid, turn_id, TAKEN_S)
        turn = self._settled(c, sid, turn_id, SETTLE_S)
        return (turn or {"outcome": "active"}), pid

    def _settled(self, c: Client, sid: str, turn_id: str, timeout: float) -> dict[str, Any] | None:
        """The Turn once settled, or None if it is still active after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            turn = next((t for t in _timeline(c, sid) or () if t["turnId"] == turn_id), None)
            if turn is not None and turn["phase"] == "settled":
                return dict(turn)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def _idle(self, c: Client, sid: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            turns = _timeline(c, sid)
            if turns is not None and all(t["phase"] == "settled" for t in turns):
                return True
            time.sleep(0.2)
        return False


def _timeline(c: Client, sid: str) -> list[dict[str, Any]] | None:
    """Every Turn of the Session (its timeline paged to the end: a page ends at ~1 MiB, and a
    `bigdelta` Turn holds ~600 KiB), or None when a page was not answered."""
    turns: list[dict[str, Any]] = []
    after = 0
    while True:
        status, body = c.call_raw(
            "session.timeline",
            {"workspaceId": WS, "agentSessionId": sid, "limit": 1000, "afterSequence": after},
        )
        if status != 200:
            return None
        turns += body["turns"]
        if body.get("nextSequence") is None:
            return turns
        after = int(body["nextSequence"])


def every_fault(
    home: Path, provider: str, front: str, stopped_limit: int | None = None
) -> ProviderChaos:
    """One round of each fault, in `FAULTS`' order, on one Session of `provider` (its command
    `front`, made by `codex_front` / `claude_front`) of a daemon on `home`; with
    `stopped_limit`, the daemon's `provider_stopped_seconds`. The chaos after its `check`
    (`chaos.violations`) — for a test of one provider's faults."""
    arms = home.parent / "arms"
    config = (
        "" if stopped_limit is None else f"[daemon]\nprovider_stopped_seconds = {stopped_limit}\n"
    )
    with provider_env(
        provider, home, config=config + relay_table(arms), commands={provider: front}
    ) as cwd:
        chaos = ProviderChaos(arms, 0)
        d = DaemonProcess(home).start()
        try:
            c = d.client(timeout=60)
            chaos.setup(c, str(cwd))
            own = [sid for sid in chaos.sids if chaos.providers[sid] == provider]
            assert len(own) == 1, chaos.providers
            chaos.sids, chaos.providers = own, {own[0]: provider}  # its rounds only
            for fault in FAULTS:
                chaos.next_fault = FAULTS.index(fault)
                assert chaos.round(c, lambda: 0) is not None, chaos.summary()
            chaos.violations = chaos.check(c)
        finally:
            d.stop()
    return chaos


def _end_relays(sid: str) -> None:
    """SIGKILL the relays serving the Session (their app-server dies with them: the relay's
    `PR_SET_PDEATHSIG`): its runtime is gone, and its next Turn's start spawns a new one."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes() if RELAY.name.encode() in cmdline else b""
        except OSError:
            continue
        if f"/{sid}/".encode() in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _worker_pid(c: Client, provider: str) -> int | None:
    for w in c.call("host.status")["workers"]:
        if w["provider"] == provider and w.get("pid"):
            return int(w["pid"])
    return None


def _stopped(pid: int | None) -> bool:
    """Whether the process is stopped (SIGSTOP: state `T`, or `t` traced)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text() if pid else ""
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] in (["T"], ["t"])


def _peak_rss_kib(pid: int | None) -> int | None:
    """The process's peak resident set (`VmHWM`), None when it is gone."""
    if pid is None:
        return None
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return next((int(x.split()[1]) for x in lines if x.startswith("VmHWM:")), None)


START_FAILPOINT = "failpoint host.turn.before_warm_start fired"
"""What a Turn whose start the contention soak's own one-shot failpoint failed says (its
`error`): such a round, or its next Turn, met a fault of the soak's, not the provider's."""


def _start_failed(turn: Mapping[str, Any] | None) -> bool:
    return turn is not None and START_FAILPOINT in str(turn.get("error") or "")
