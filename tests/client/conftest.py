"""Fixtures for the client tests: one real daemon per module (each test in its own workspace),
a fault-injecting relay in front of it, a fake clock, and Engines closed after each test."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from client.engine.lifecycle import Engine
from tests.client.fakeclock import FakeClock
from tests.client.relay import Relay
from tests.support.daemon import DaemonProcess, create_session, run_turn
from transport.client import Client

FAILPOINTS = (
    "worker.fork.before_provider_call",
    "worker.fork.after_provider_call",
    "worker.bind.before_copy",
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("d") / "home").start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def ws() -> str:
    return f"ws-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    c = Client(daemon.api, timeout=30)
    try:
        yield c
    finally:
        # Failpoints are daemon-wide: no test leaves one armed for the next.
        c.call("debug.failpoints", {"points": dict.fromkeys(FAILPOINTS, "off")})
        c.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # ipc paths are limited to ~107 bytes.
    path = Path(tempfile.mkdtemp(prefix="ah-c-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def relay(daemon: DaemonProcess, short_dir: Path) -> Iterator[Relay]:
    r = Relay(f"ipc://{short_dir}/relay.sock", daemon.api)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_engine(
    daemon: DaemonProcess, relay: Relay, clock: FakeClock, ws: str
) -> Iterator[Callable[..., Engine]]:
    made: list[tuple[Engine, Client]] = []

    def make(*, events: bool = False, **kwargs: Any) -> Engine:
        c = Client(relay.frontend, timeout=30)
        engine = Engine(c, ws, scheduler=clock, **kwargs)
        made.append((engine, c))
        if events:
            engine.attach_events(daemon.events)
        return engine

    try:
        yield make
    finally:
        for engine, c in made:
            engine.close()
            c.close()


def source(c: Client, ws: str, turns: int = 2, title: str = "Trip") -> tuple[str, list[str]]:
    """A root tutti-agent session with `turns` settled turns: `(session id, turn ids)`."""
    sid = create_session(c, ws, title=title)["agentSessionId"]
    ids = [run_turn(c, sid, f"turn {i + 1}", ws)["turnId"] for i in range(turns)]
    return sid, ids


def events_live(engine: Engine, c: Client, ws: str) -> None:
    """Beat ZeroMQ's slow joiner: wait until the Engine has seen an event of this workspace.

    An event published before the subscription reached the daemon is lost for good, so one
    probe is not enough on a loaded machine: publish probes until one arrives."""
    for _ in range(20):
        probe = create_session(c, ws, title="probe")["agentSessionId"]
        if engine.wait_for(lambda probe=probe: engine.session(probe) is not None, 1):
            return
    raise AssertionError("the Engine saw none of 20 probe events in 20 s")
