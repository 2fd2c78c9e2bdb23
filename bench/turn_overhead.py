"""Benchmark: what the host adds to a streaming Turn (issue 36 target 2). The same Turn — the
same fake model, the same reply of 20 text deltas streamed a couple of milliseconds apart —
runs through the daemon and against the bare provider, interleaved turn by turn:

- host: `turn.submit` on the API socket → its settled `turn.updated` on the events socket,
  every `message.delta` of it timed on arrival at this client;
- bare: the provider driven as the driver drives it, by this process — app-servers
  (tutti-agent, Codex) over their stdio JSON-RPC, `turn/start` → `turn/completed`, each
  `item/agentMessage/delta` timed on arrival; Claude Code through the SDK's `query()` with
  partial messages, each `content_block_delta` stream event timed on arrival.

The fake model server runs in this process and stamps each delta when it has written it (the
same clock as the clients), so each delta's lag is its arrival minus the model's emission:

- turn overhead = host turn p50 - bare turn p50 (limit +3 ms);
- first delta = host p50 lag of the first delta - bare p50 lag of the first delta: how long
  after the provider emitted it the delta reached the host's client (limit 2 ms);
- batching = the longest any host delta lagged beyond the bare provider's p50 lag: how long the
  host ever held a delta back (limit 10 ms);
- the turn floor (`bench.turn_floor`, timed right after each provider's Turns): what the laws
  make any host Turn wait for beyond the bare one (two durable COMMITs and the cheapest
  `before` and `after` captures), beside turn overhead with their ratio; and the hop floor
  (`bench.hop_floor`, once a run): what the process view's path costs a no-work request, so the
  profile says what the host adds beyond both floors;
- beside them, INFO rows: the hop floor at a Turn's cadence (its out half measured after the
  idle a host Turn's submit came after, its back half answered a delta's spacing after the
  request: a Turn's start wakes processes idle since the previous Turn, its end follows its
  last delta) and host - bare over the turn floor plus that.

Where a Turn's time goes, on each side (the model stamps when it has the timed reply's request):
before the model (submit or `turn/start`/`query()` → the model has the request: runtime,
workspace checkpoint, provider start-up) and after it (its last delta → the settled Turn or the
bare end: provider shutdown, checkpoint, settlement).

`AGENTHOST_BENCH_PROVIDERS=claude-code,codex` measures only those providers;
`AGENTHOST_BENCH_FIRST_TOKEN_MS=150` makes the model wait that long before its first byte.

    build/venv/bin/python -m bench.turn_overhead [--quick|--smoke] [--json FILE]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import hop_floor, turn_floor
from bench.common import BenchResult, Latency, Mode, Table, bench_main, cpu_probe_ms, log, pick
from bench.harness import WS, BenchDaemon, create_session, run_turn, submit
from bench.profile import TreeProfile, cpu_line
from bench.providers import BareAppServer, BareClaude, provider
from model_fakes.http import FakeModelServer
from model_fakes.messages import MessagesServer
from model_fakes.responses import ResponsesServer
from transport.client import EventSubscriber
from workspace.shadow import RACY_MARGIN_NS

MODULE = "bench.turn_overhead"
DELTAS = 20
REPLY = "".join(f"d{i:02d} " for i in range(DELTAS))
"""80 characters: the fakes stream text in 4-character deltas, so 20 of them."""
DRIP_S = 0.002
"""Between two SSE events of a reply: a model streaming, not one write of the whole reply."""
FIRST_TOKEN_S = float(os.environ.get("AGENTHOST_BENCH_FIRST_TOKEN_MS") or 0) / 1000
"""How long the model takes to its first byte (default 0: it answers at once). With 0, Claude
Code's write of the prompt to its transcript, which is when the host records the Turn's start,
falls on the reply's first bytes, and the host's writes compete with the CLI's relay of them."""
PROVIDER_NAMES = ("tutti-agent", "codex", "claude-code")
HOP_GAP_CAP_S = 0.06
"""The longest idle the hop floor at a Turn's cadence waits before each sample: on this VM a
chain's cost after 30 ms of idle and after 60 were the same within noise (every idle vCPU
halts at once, `haltpoll.guest_halt_poll_ns=0`; docs/performance.md), and Claude Code's
half-second Turns would make the measurement minutes long."""


def now_ms() -> float:
    return time.perf_counter() * 1000.0


def timed_model(base: type[FakeModelServer[Any]], delta_event: str) -> Any:
    """A fake model server of `base`'s API that answers every request with `REPLY`, streams
    its events `DRIP_S` apart and stamps each delta event once written (`emitted`: one list of
    ms per streamed reply, in arrival order of the requests)."""

    class Timed(base):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__(lambda body: REPLY)
            self.emitted: list[list[float]] = []
            self.begun: list[float] = []
            """When the model had the request of each streamed reply of `emitted`."""
            self._stamps_lock = threading.Lock()

        def handler_class(self) -> Any:
            handler = super().handler_class()
            server = self

            class Handler(handler):  # type: ignore[valid-type,misc]
                # Each event leaves when written, as a streaming API sends it. With Nagle's
                # algorithm on (`StreamRequestHandler`'s default) a small write waits in the
                # kernel while the previous one is unacknowledged, and the provider's delayed
                # ACK goes out only once it has read: a provider slow to be scheduled held
                # the model's next deltas back and got them in one segment, a "batch" made
                # by the fake model's socket, not by the host.
                disable_nagle_algorithm = True

                def send_sse(self, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
                    stamps: list[float] = []
                    with server._stamps_lock:
                        server.emitted.append(stamps)
                        server.begun.append(now_ms())
                    if FIRST_TOKEN_S:
                        time.sleep(FIRST_TOKEN_S)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        for index, (name, data) in enumerate(events):
                            if index:
                                time.sleep(DRIP_S)
                            self.wfile.write(
                                f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                            )
                            self.wfile.flush()
                            if name == delta_event:
                                stamps.append(now_ms())

            return Handler

        def emission_for(self, arrivals: Sequence[float], since: float) -> list[float]:
            """The streamed reply these arrivals are of: the latest one that began after
            `since` and no later than the first arrival. A provider may make other model
            requests in a Turn (Claude Code does); those are not the timed reply."""
            return self.reply_for(arrivals, since)[1]

        def reply_for(self, arrivals: Sequence[float], since: float) -> tuple[float, list[float]]:
            """As `emission_for`, with the time that reply began (nan when none matched)."""
            if not arrivals:
                return float("nan"), []
            with self._stamps_lock:
                streamed = [
                    (b, list(s))
                    for b, s in zip(self.begun, self.emitted, strict=True)
                    if s and since <= s[0] <= arrivals[0]
                ]
            return streamed[-1] if streamed else (float("nan"), [])

    return Timed()


class Sample:
    """One Turn on one side: its duration and each delta's arrival and emission; with `t0` (when
    the Turn was asked for) and `begun` (when the model began the timed reply), where its time
    went: before the model answered, and from the model's last delta to the Turn's end."""

    def __init__(
        self,
        turn_ms: float,
        arrivals: list[float],
        emitted: list[float],
        *,
        t0: float | None = None,
        begun: float = float("nan"),
    ) -> None:
        self.turn_ms = turn_ms
        self.lags = [a - e for a, e in zip(arrivals, emitted, strict=False)]
        self.deltas = len(arrivals)
        nan = float("nan")
        self.before_model_ms = begun - t0 if t0 is not None else nan
        self.after_model_ms = t0 + turn_ms - emitted[-1] if t0 is not None and emitted else nan


# -- the bare sides -----------------------------------------------------------------------------


class BareStreamingAppServer(BareAppServer):
    """`BareAppServer` whose notifications also time each streamed agent-message delta."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arrivals: list[float] = []
        super().__init__(*args, **kwargs)

    def _on_notification(self, method: str, params: Mapping[str, Any]) -> None:
        if method == "item/agentMessage/delta":
            self.arrivals.append(now_ms())
        super()._on_notification(method, params)

    def turn(self, text: str) -> tuple[float, list[float]]:
        self.arrivals = []
        t0 = now_ms()
        self.run_turns(1, lambda _: text)
        return now_ms() - t0, list(self.arrivals)


class BareStreamingClaude(BareClaude):
    """`BareClaude` whose turns stream partial messages (as the driver asks) and time each
    text delta on arrival."""

    async def _streamed(self, text: str) -> tuple[float, list[float]]:
        from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query
        from claude_agent_sdk.types import StreamEvent

        exists = self.transcript.exists()
        options = ClaudeAgentOptions(
            cwd=str(self.cwd),
            env=dict(self._env),
            resume=self.session_id if exists else None,
            session_id=None if exists else self.session_id,
            setting_sources=[],
            model=self._model,
            cli_path=self._cli_path,
            include_partial_messages=True,
        )
        arrivals: list[float] = []
        result: ResultMessage | None = None
        t0 = now_ms()
        async for message in query(prompt=text, options=options):
            if isinstance(message, StreamEvent):
                if message.event.get("type") == "content_block_delta":
                    arrivals.append(now_ms())
            elif isinstance(message, ResultMessage):
                result = message
        elapsed = now_ms() - t0
        if result is None or result.is_error:
            raise RuntimeError(f"bare Claude turn {text!r} failed: {result}")
        return elapsed, arrivals

    def turn(self, text: str) -> tuple[float, list[float]]:
        return asyncio.run(self._streamed(text))


def bare_cwd(tmp: Path) -> Path:
    """The bare app-server thread's folder: an empty one, as the host's Sessions work in
    (`BenchDaemon.workdir`). Not the repository the bench runs from: Codex reads a git work
    tree's state for each Turn, which the host's Sessions never pay, and what that costs
    depends on the tree (a checkout in one place against another gave Codex's bare side
    20–40 ms more or less), so trees A/B'd against each other measured their folders."""
    folder = tmp / "bare-work"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def side_by_side(name: str, tmp: Path) -> Iterator[tuple[Any, dict[str, str], Any]]:
    """The timed model, the daemon's `[providers.NAME]` config and the bare provider."""
    if name == "claude-code":
        server = timed_model(MessagesServer, "content_block_delta")
        config = {"model_base_url": server.base_url}
        bare: Any = BareStreamingClaude(tmp / "bare", config)
    else:
        server = timed_model(ResponsesServer, "response.output_text.delta")
        if name == "codex":
            from drivers.codex.command import default_command
            from drivers.codex.config import ApprovalPolicy, SandboxMode, render_config_toml

            config = {"model": "mock-model", "model_base_url": server.base_url}
            home = tmp / "bare"
            home.mkdir(parents=True)
            (home / "config.toml").write_text(
                render_config_toml(
                    model="mock-model",
                    model_base_url=server.base_url,
                    approval_policy=ApprovalPolicy.NEVER,
                    sandbox_mode=SandboxMode.READ_ONLY,
                )
            )
            bare = BareStreamingAppServer(
                [*default_command(), "app-server"], "CODEX_HOME", home, {}, cwd=bare_cwd(tmp)
            )
        else:
            config = {"model_base_url": server.base_url, "wire_api": "responses"}
            argv = [
                str(Path(sys.executable).parent / "tutti-agent"),
                "app-server",
                "--model-base-url",
                server.base_url,
                "--wire-api",
                "responses",
            ]
            bare = BareStreamingAppServer(
                argv, "TUTTI_AGENT_HOME", tmp / "bare", {}, cwd=bare_cwd(tmp)
            )
    try:
        yield server, config, bare
    finally:
        with contextlib.suppress(Exception):
            bare.close()
        server.close()


# -- the host side ------------------------------------------------------------------------------


def host_turn(c: Any, sub: EventSubscriber, sid: str, text: str) -> tuple[float, list[float]]:
    """`turn.submit` → the Turn's settled `turn.updated`, each `message.delta` timed."""
    while sub.next_message(0) is not None:
        pass  # what earlier Turns left queued is not this Turn's
    arrivals: list[float] = []
    t0 = now_ms()
    turn_id = str(submit(c, sid, text)["turnId"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        message = sub.next_message(1.0)
        if message is None or message[0] != WS:
            continue
        event = message[1]
        if event.get("agentSessionId") != sid:
            continue
        if (
            event.get("type") == "message.delta"
            and event.get("kind") == "assistant"
            and event.get("turnId") == turn_id
        ):
            arrivals.append(now_ms())
        elif (
            event.get("type") == "turn.updated"
            and event["turn"]["turnId"] == turn_id
            and event["turn"]["phase"] == "settled"
        ):
            return now_ms() - t0, arrivals
    raise TimeoutError(f"host turn {turn_id} did not settle")


def measure(name: str, tmp: Path, samples: int, warmup: int) -> dict[str, Any]:
    log(f"turn overhead: {name}, {samples} turns each side, interleaved")
    host: list[Sample] = []
    bare_samples: list[Sample] = []
    idle: list[float] = []
    """Before each timed host Turn but the first: since the previous host Turn settled."""
    spacing: list[float] = []
    """Between two consecutive deltas of a host Turn, at the client."""
    with side_by_side(name, tmp) as (server, config, bare):
        daemon = BenchDaemon(tmp / "home", providers={name: config}).start()
        profile = TreeProfile(daemon.pid, tmp / "turn-overhead.pyspy.txt", use_py_spy=False)
        sub = EventSubscriber(daemon.events, [WS])
        try:
            c = daemon.client()
            sid = create_session(c, "turn overhead", provider=name)
            for i in range(warmup):  # both warm: a live provider, a loaded thread, a subscriber
                run_turn(c, sid, f"warm {i}")
                bare.turn(f"warm {i}")
            # The Sessions' folder (made with the daemon) as old as a person's project is: past
            # the captures' racy margin, within which a folder is asked of git every Turn.
            settle = RACY_MARGIN_NS / 1e9 - (time.time() - daemon.workdir.stat().st_ctime)
            if settle > 0:
                time.sleep(settle + 0.05)
            profile.start()
            settled = float("nan")
            for i in range(samples):
                for turn, out in (
                    (lambda text: host_turn(c, sub, sid, text), host),
                    (bare.turn, bare_samples),
                ):
                    t0 = now_ms()
                    ms, arrivals = turn(f"turn {i}")
                    begun, emitted = server.reply_for(arrivals, t0)
                    out.append(Sample(ms, arrivals, emitted, t0=t0, begun=begun))
                    if out is host:
                        if not math.isnan(settled):
                            idle.append(t0 - settled)
                        settled = t0 + ms
                        spacing += [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
            profile.stop()
        finally:
            sub.close()
            daemon.stop()
    return {
        "host": host,
        "bare": bare_samples,
        "cpu": profile.cpu,
        "hostIdleBefore": Latency.of(idle),
        "hostDeltaSpacing": Latency.of(spacing),
    }


def _stage(values: Iterable[float]) -> Latency:
    return Latency.of(v for v in values if not math.isnan(v))


def per_thousand(values: Sequence[float], over_ms: float) -> float:
    """How many of `values` exceed `over_ms`, per 1,000 (nan when there are none)."""
    if not values:
        return float("nan")
    return round(1000 * sum(1 for v in values if v > over_ms) / len(values), 1)


def _figures(host: list[Sample], bare: list[Sample]) -> dict[str, Any]:
    host_turn_ms = Latency.of(s.turn_ms for s in host)
    bare_turn_ms = Latency.of(s.turn_ms for s in bare)
    host_first = Latency.of(s.lags[0] for s in host if s.lags)
    bare_first = Latency.of(s.lags[0] for s in bare if s.lags)
    bare_lag = Latency.of(lag for s in bare for lag in s.lags)
    host_held = [lag - bare_lag.p50 for s in host for lag in s.lags]
    bare_held = [lag - bare_lag.p50 for s in bare for lag in s.lags]
    held = Latency.of(host_held)
    return {
        "hostTurn": host_turn_ms,
        "bareTurn": bare_turn_ms,
        "hostFirstDeltaLag": host_first,
        "bareFirstDeltaLag": bare_first,
        "hostDeltaLag": Latency.of(lag for s in host for lag in s.lags),
        "bareDeltaLag": bare_lag,
        "hostHeldBeyondBare": held,
        "turnOverheadMs": host_turn_ms.p50 - bare_turn_ms.p50,
        "firstDeltaMs": host_first.p50 - bare_first.p50,
        "batchingMs": held.max,
        # The row is one maximum: how many deltas waited past 5 and 10 ms, per 1,000, on each
        # side (the bare provider's own holds counted the same way, beyond its own p50).
        "heldOverPerK": {
            side: {f"{ms}ms": per_thousand(values, ms) for ms in (5, 10)}
            for side, values in (("host", host_held), ("bare", bare_held))
        },
        "hostBeforeModel": _stage(s.before_model_ms for s in host),
        "bareBeforeModel": _stage(s.before_model_ms for s in bare),
        "hostAfterModel": _stage(s.after_model_ms for s in host),
        "bareAfterModel": _stage(s.after_model_ms for s in bare),
        "deltasPerTurn": {
            "host": sorted({s.deltas for s in host}),
            "bare": sorted({s.deltas for s in bare}),
        },
    }


def run(mode: Mode) -> BenchResult:
    samples = pick(mode, 60, 15, 2)
    warmup = pick(mode, 3, 2, 1)
    result = BenchResult("turn overhead vs the bare provider", "", mode.value)
    rows: list[tuple[Any, ...]] = []
    lag_rows: list[tuple[Any, ...]] = []
    stage_rows: list[tuple[Any, ...]] = []
    floor_rows: list[tuple[Any, ...]] = []
    floors: list[tuple[str, turn_floor.TurnFloor]] = []
    hops: hop_floor.HopFloor | None = None
    cadence_rows: list[tuple[Any, ...]] = []
    at_cadence: dict[tuple[float, float], hop_floor.HopFloor] = {}
    wanted = os.environ.get("AGENTHOST_BENCH_PROVIDERS")
    names = [n for n in PROVIDER_NAMES if not wanted or n in wanted.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-turns-") as tmp_text:
        for name in names:
            why = provider(name).unavailable()
            if why is not None:
                result.notes.append(f"{name}: not measured: {why}")
                for key in (
                    "turn-overhead",
                    "first-delta",
                    "delta-batching",
                    "turn-over-floor",
                    "hop-floor-at-turn-cadence",
                    "turn-over-floors",
                ):
                    result.issue_target(
                        f"36:{key}:{name}",
                        float("nan"),
                        measured=f"not measured: {why}",
                        profile={"lines": [f"{name} was not measured: {why}"]},
                    )
                continue
            probe, load = cpu_probe_ms(), os.getloadavg()[0]
            result.notes.append(f"{name}: CPU probe at start {probe:.0f} ms; load {load:.2f}")
            m = measure(name, Path(tmp_text) / name, samples, warmup)
            f = _figures(m["host"], m["bare"])
            # In the same minute as the Turns it is compared with: the load moves it.
            floor = turn_floor.measure(samples=pick(mode, 100, 50, 5))
            floors.append((name, floor))
            if hops is None:
                hops = hop_floor.measure(pick(mode, 400, 200, 20), pick(mode, 50, 20, 3))
                result.figures["hopFloor"] = hops.to_json()
            idle, spacing = m["hostIdleBefore"], m["hostDeltaSpacing"]
            cadence = _cadence_hops(mode, idle, spacing, at_cadence)
            turns = max(1, len(m["host"]))
            cpu = {k: round(1000 * v / turns, 2) for k, v in m["cpu"].items()}
            result.figures[name] = {
                **f,
                "cpuMsPerHostTurn": cpu,
                "turnFloor": floor.to_json(),
                "hostIdleBeforeTurn": idle.brief(),
                "hostDeltaSpacing": spacing.brief(),
                "hopFloorAtTurnCadence": cadence.to_json(),
            }
            ht, bt = f["hostTurn"], f["bareTurn"]
            rows.append((name, ht.n, ht.p50, ht.p99, bt.p50, bt.p99, f["turnOverheadMs"]))
            for side, key in (("host", "host"), ("bare", "bare")):
                first, lag = f[f"{key}FirstDeltaLag"], f[f"{key}DeltaLag"]
                lag_rows.append((name, side, first.p50, first.p99, lag.p50, lag.p99, lag.max))
            for side in ("host", "bare"):
                before, after = f[f"{side}BeforeModel"], f[f"{side}AfterModel"]
                stage_rows.append((name, side, before.p50, before.p99, after.p50, after.p99))
            held = f["hostHeldBeyondBare"]
            lines = [
                f"host turn p50 {ht.p50:.1f} ms vs bare {bt.p50:.1f} ms (same model, same"
                f" {DELTAS}-delta reply, interleaved)",
                f"first delta lag p50 (arrival - model emission): host"
                f" {f['hostFirstDeltaLag'].p50:.2f} ms, bare {f['bareFirstDeltaLag'].p50:.2f} ms",
                f"host delta held beyond the bare p50 lag: p50 {held.p50:.2f}, p99"
                f" {held.p99:.2f}, max {held.max:.2f} ms",
                "deltas held past 5 / 10 ms per 1,000: host {host[5ms]} / {host[10ms]}, bare"
                " {bare[5ms]} / {bare[10ms]} (each beyond the bare p50 lag)".format(
                    **f["heldOverPerK"]
                ),
                cpu_line(cpu, "ms per host Turn"),
                floor.line(),
                f"host - bare - turn floor - hop floor ="
                f" {f['turnOverheadMs'] - floor.floor_ms - hops.hops_ms:.1f} ms: the host's own"
                " work beyond what the process view and the Turn's laws make any host wait for"
                f" ({hops.line()})",
                _cadence_line(cadence, idle, spacing),
            ]
            measured = (
                f"bench.turn_overhead: {ht.n} turns each side, {DELTAS} deltas"
                f" {DRIP_S * 1000:g} ms apart; host {ht.p50:.1f} / bare {bt.p50:.1f} ms"
            )
            for key, value in (
                ("turn-overhead", f["turnOverheadMs"]),
                ("first-delta", f["firstDeltaMs"]),
                ("delta-batching", f["batchingMs"]),
            ):
                result.issue_target(
                    f"36:{key}:{name}", value, measured=measured, profile={"lines": lines}
                )
            over = f["turnOverheadMs"]
            result.issue_target(
                f"36:turn-over-floor:{name}",
                floor.ratio(over),
                measured=f"bench.turn_overhead: host - bare {over:.1f} ms, turn floor"
                f" {floor.floor_ms:.1f} ms (bench.turn_floor, right after the Turns)",
                profile={"lines": lines, "floorMs": floor.floor_ms},
            )
            floor_rows.append(
                (
                    name,
                    over,
                    floor.floor_ms,
                    floor.ratio(over),
                    floor.commit.p50,
                    floor.capture.p50,
                    floor.host_capture.p50,
                )
            )
            _cadence_targets(result, name, over, floor, cadence, idle, spacing, lines)
            cadence_hop = cadence.out_ms + cadence.back_ms
            cadence_rows.append(
                (
                    name,
                    idle.p50,
                    spacing.p50,
                    cadence.gap_ms,
                    cadence.out_ms,
                    cadence.back_ms,
                    cadence_hop,
                    hops.hops_ms,
                    over,
                    floor.floor_ms,
                    over / (floor.floor_ms + cadence_hop),
                )
            )
            result.notes.append(f"{name} CPU ms per host Turn by process kind: {cpu}")
    result.tables.append(
        Table(
            "turn.submit → settled (host) vs turn/start → turn/completed or query() → result"
            " (bare), ms",
            ("provider", "n", "host p50", "host p99", "bare p50", "bare p99", "p50 host - bare"),
            tuple(rows),
        )
    )
    result.tables.append(
        Table(
            "delta lag at the client (arrival - the model's emission), ms",
            ("provider", "side", "first p50", "first p99", "all p50", "all p99", "all max"),
            tuple(lag_rows),
        )
    )
    result.tables.append(
        Table(
            "where a Turn's time goes: ask → the model has the request; its last delta → the"
            " Turn's end (host: settled at the client; bare: turn/completed or query() ended), ms",
            ("provider", "side", "before p50", "before p99", "after p50", "after p99"),
            tuple(stage_rows),
        )
    )
    result.tables.append(
        Table(
            "host turn p50 - bare turn p50 beside the turn floor of the same run (the claim's"
            " and the settlement's COMMITs, the cheapest `before` and `after` captures), ms",
            (
                "provider",
                "host - bare",
                "floor",
                "ratio",
                "COMMIT p50",
                "cheapest capture p50",
                "host capture p50",
            ),
            tuple(floor_rows),
        )
    )
    result.tables.append(
        Table(
            "the process view at a Turn's cadence (bench.hop_floor's out half after the idle a"
            " host Turn's submit came after, capped; its back half answered a delta's spacing"
            " after the request, as a Turn's end follows its last delta), ms",
            (
                "provider",
                "idle before submit p50",
                "delta spacing p50",
                "hop gap",
                "out half",
                "back half",
                "hop floor at cadence",
                "hop floor back to back",
                "host - bare",
                "turn floor",
                "(host - bare) / (turn floor + hop floor at cadence)",
            ),
            tuple(cadence_rows),
        )
    )
    _floor_row(result, floors)
    if FIRST_TOKEN_S:
        result.notes.append(
            f"the model's first byte came {FIRST_TOKEN_S * 1000:g} ms after each request"
        )
    result.notes.append(
        "cwd of the bare app-server threads: an empty folder (bare_cwd); of the host's"
        " Sessions (what each Turn checkpoints): an empty folder beside the daemon's home"
        " (BenchDaemon.workdir)"
    )
    return result


def _cadence_hops(
    mode: Mode,
    idle: Latency,
    spacing: Latency,
    measured: dict[tuple[float, float], hop_floor.HopFloor],
) -> hop_floor.HopFloor:
    """The hop floor with each sample after the idle a host Turn's submit came after (its p50,
    at most `HOP_GAP_CAP_S`) and each answer a delta's spacing (p50) after its request: a Turn's
    start finds the processes idle since the previous Turn, its end follows the Turn's last
    delta. One measurement per (gap, answer gap), rounded to the millisecond."""
    gap = min(idle.p50, HOP_GAP_CAP_S * 1000) if not math.isnan(idle.p50) else 0.0
    answer = spacing.p50 if not math.isnan(spacing.p50) else DRIP_S * 1000
    key = (float(round(gap)), round(answer, 1))
    if key not in measured:
        measured[key] = hop_floor.measure(
            pick(mode, 200, 100, 10), pick(mode, 20, 10, 2), key[0] / 1000, key[1] / 1000
        )
    return measured[key]


def _cadence_line(cadence: hop_floor.HopFloor, idle: Latency, spacing: Latency) -> str:
    return (
        f"hop floor at a Turn's cadence {cadence.out_ms + cadence.back_ms:.2f} ms: out half"
        f" {cadence.out_ms:.2f} ms after {cadence.gap_ms:g} ms idle (a host Turn's submit came"
        f" {idle.p50:.1f} ms p50 after the previous one settled) + back half"
        f" {cadence.back_ms:.2f} ms answered {cadence.answer_gap_ms:g} ms after the request"
        f" (host deltas {spacing.p50:.2f} ms apart p50); {cadence.line()}"
    )


def _cadence_targets(
    result: BenchResult,
    name: str,
    over: float,
    floor: turn_floor.TurnFloor,
    cadence: hop_floor.HopFloor,
    idle: Latency,
    spacing: Latency,
    lines: Sequence[str],
) -> None:
    """The INFO rows beside target 2: the process view's floor at a Turn's own cadence, and
    host - bare over both floors (the turn floor and that)."""
    hop = cadence.out_ms + cadence.back_ms
    words = (
        f"bench.hop_floor --gap {cadence.gap_ms:g} --answer-gap {cadence.answer_gap_ms:g}"
        f" ({cadence.chain.n} samples, after {name}'s Turns: idle before a host submit p50"
        f" {idle.p50:.1f} ms, host deltas {spacing.p50:.2f} ms apart)"
    )
    result.issue_target(
        f"36:hop-floor-at-turn-cadence:{name}",
        hop,
        measured=f"{words}: out {cadence.out_ms:.2f} + back {cadence.back_ms:.2f} ms",
        profile={"lines": [_cadence_line(cadence, idle, spacing)]},
    )
    result.issue_target(
        f"36:turn-over-floors:{name}",
        over / (floor.floor_ms + hop),
        measured=f"bench.turn_overhead: host - bare {over:.1f} ms over turn floor"
        f" {floor.floor_ms:.2f} + hop floor at a Turn's cadence {hop:.2f} ms ({words})",
        profile={"lines": list(lines), "floorMs": floor.floor_ms, "hopMs": hop},
    )


def _floor_row(result: BenchResult, floors: Sequence[tuple[str, turn_floor.TurnFloor]]) -> None:
    """The floor as one row of the issue's table: tutti-agent's run's (the host's own model:
    the least provider noise around it), else the first provider measured."""
    if not floors:
        why = "no provider measured in this run"
        result.issue_target("36:turn-floor", float("nan"), measured=why, profile={"lines": [why]})
        return
    name, floor = next((f for f in floors if f[0] == "tutti-agent"), floors[0])
    result.issue_target(
        "36:turn-floor",
        floor.floor_ms,
        measured=f"bench.turn_floor after {name}'s Turns: {floor.commits} COMMITs ×"
        f" {floor.commit.p50:.2f} ms, the cheapest capture ({floor.capture_kind})"
        f" {floor.capture.p50:.2f} ms (the"
        " claim's COMMIT and the `before` capture overlap)",
        profile={"lines": [floor.line()]},
    )


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(MODULE, __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
