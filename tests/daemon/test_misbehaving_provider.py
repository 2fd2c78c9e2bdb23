"""A provider that misbehaves on its stdout, through the real daemon and a real tutti-agent
app-server behind a relay that breaks the pipe's protocol on demand (`misbehaving_app_server`):
one endless line, garbage and wrong-shaped lines, a stdout closed by a process that keeps
running. Each Turn settles (failed with the typed reason `provider_protocol_error` where the
runtime cannot go on), the worker's memory stays bounded, the broken runtime is killed, and
the Session's next Turn runs on a new one."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from drivers.app_server.process import MAX_LINE_BYTES
from tests.support.daemon import DaemonProcess, create_session, run_turn, settle, submit, wait_for
from tests.support.freezer import running
from transport.server import MAX_EVENT_BYTES

pytestmark = pytest.mark.timeout(120)

RELAY = Path(__file__).with_name("misbehaving_app_server.py")


class Relay:
    """The arm file the relay reads at each `turn/start`, and the pid of the relay that took it."""

    def __init__(self, where: Path) -> None:
        self.arm_file = where / "armed"

    def arm(self, mode: str) -> None:
        self.arm_file.write_text(mode)

    def taken_pid(self) -> int:
        taken = self.arm_file.with_name("armed.taken")
        lines = wait_for(lambda: taken.exists() and taken.read_text().split("\n")[1:2], 10)
        return int(lines[0])


def _daemon(tmp_path: Path, relay: Relay, daemon: str = "") -> DaemonProcess:
    home = tmp_path / "home"
    home.mkdir(parents=True)
    tutti = Path(sys.executable).parent / "tutti-agent"
    argv = [sys.executable, str(RELAY), str(relay.arm_file), "--", str(tutti)]
    command = ", ".join(f'"{a}"' for a in argv)
    (home / "agenthost.toml").write_text(
        f'[daemon]\n{daemon}[providers."tutti-agent"]\ncommand = [{command}]\n'
    )
    return DaemonProcess(home).start()


def _worker_pid(d: DaemonProcess) -> int:
    for w in d.client().call("host.status")["workers"]:
        if w["provider"] == "tutti-agent" and w["pid"]:
            return int(w["pid"])
    raise AssertionError("no tutti-agent worker")


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _kill(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_an_endless_line_fails_the_turn_with_memory_bounded_and_the_next_turn_runs(
    tmp_path: Path,
) -> None:
    """The relay writes one line without end: the worker reads at most `MAX_LINE_BYTES` of it
    (its peak RSS stays under its own size before + twice the bound), kills the app-server
    and fails the Turn `provider_protocol_error`; the next Turn completes on a new one."""
    relay = Relay(tmp_path)
    d = _daemon(tmp_path, relay)
    pid = None
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        worker = _worker_pid(d)
        before = _peak_rss_kib(worker)
        relay.arm("endless")
        turn = submit(c, sid, "hello")
        pid = relay.taken_pid()
        done = settle(c, sid, turn["turnId"], timeout=90)
        assert done["outcome"] == "failed", done
        assert done["errorReason"] == "provider_protocol_error", (done["error"], done)
        assert f"longer than {MAX_LINE_BYTES} bytes" in done["error"], done
        wait_for(lambda: not running(pid), 10)
        assert _peak_rss_kib(worker) - before < 2 * MAX_LINE_BYTES // 1024 + 32 * 1024
        assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        _kill(pid)
        d.stop()


def test_garbage_and_wrong_shaped_lines_between_real_ones_leave_the_turn_whole(
    tmp_path: Path,
) -> None:
    """Lines that are not JSON, JSON that is no object, answers to ids never sent, a
    notification (a `turn/completed` among them) and a server request whose params are no
    object, all before the provider's real answer: the Turn completes with its real reply, and
    the runtime serves the next Turn (the same relay process)."""
    relay = Relay(tmp_path)
    d = _daemon(tmp_path, relay)
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        relay.arm("garbage")
        turn = submit(c, sid, "hello")
        pid = relay.taken_pid()
        done = settle(c, sid, turn["turnId"], timeout=60)
        assert done["outcome"] == "completed", done
        assert run_turn(c, sid, "after")["outcome"] == "completed"
        assert running(pid)
    finally:
        d.stop()


@pytest.mark.parametrize("stopped_limit", [None, 2], ids=["default", "stopped-2s"])
@pytest.mark.parametrize(
    ("mode", "text"), [("close", "hello"), ("close_mid", "/slow 600000 never")]
)
def test_a_provider_that_closes_its_stdout_and_keeps_running_is_killed_and_replaced(
    tmp_path: Path, mode: str, text: str, stopped_limit: int | None
) -> None:
    """The relay closes its stdout and runs on — at a `turn/start`, or once the Turn runs (its
    `turn/started` relayed; the model slow for 10 minutes): the reader's end is the
    runtime's, so the worker kills it, the Turn fails `provider_protocol_error` naming the
    closed stdout, and the next Turn runs on a new app-server. With a short
    `provider_stopped_seconds` (2 s, the contention soak's) too: the reader names the closed
    stdout before the liveness check would call the runtime unresponsive."""
    relay = Relay(tmp_path)
    limit = "" if stopped_limit is None else f"provider_stopped_seconds = {stopped_limit}\n"
    d = _daemon(tmp_path, relay, limit)
    pid = None
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        relay.arm(mode)
        turn = submit(c, sid, text)
        pid = relay.taken_pid()
        done = settle(c, sid, turn["turnId"], timeout=60)
        assert done["outcome"] == "failed", done
        assert done["errorReason"] == "provider_protocol_error", (done["error"], done)
        assert "closed its stdout" in done["error"], done
        wait_for(lambda: not running(pid), 10)
        assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        _kill(pid)
        d.stop()


def test_a_turn_start_answered_without_a_turn_id_fails_the_turn_and_the_next_turn_runs(
    tmp_path: Path,
) -> None:
    """The relay strips the Turn's id from the provider's answer to `turn/start` and relays no
    line naming it after: the driver cannot follow that Turn, so the answer is a protocol
    break — the Turn fails `provider_protocol_error` naming the missing id, the app-server is
    killed, and the Session's next Turn is taken and runs on a new one (it was refused as long
    as the driver waited for an id)."""
    relay = Relay(tmp_path)
    d = _daemon(tmp_path, relay)
    pid = None
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        relay.arm("noid")
        turn = submit(c, sid, "hello")
        pid = relay.taken_pid()
        done = settle(c, sid, turn["turnId"], timeout=60)
        assert done["outcome"] == "failed", done
        assert done["errorReason"] == "provider_protocol_error", (done["error"], done)
        assert "without a turn id" in done["error"], done
        wait_for(lambda: not running(pid), 10)
        assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        _kill(pid)
        d.stop()


def test_a_reply_streamed_as_one_delta_past_the_cap_reaches_subscribers_in_pieces(
    tmp_path: Path,
) -> None:
    """The relay's `bigdelta` (the soaks' fault): the Turn's reply deltas reach the driver as
    one delta of 300 KiB, as a model streaming its reply at once would send it; subscribers
    hear it as several `message.delta` events, each within the event cap, joined the reply."""
    relay = Relay(tmp_path)
    d = _daemon(tmp_path, relay)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(d.events)
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "warm")
        time.sleep(0.5)  # ZeroMQ's slow joiner: the subscription reaches the PUB side
        relay.arm("bigdelta")
        text = "b" * (300 << 10)
        turn = submit(c, sid, "/stream " + text)
        relay.taken_pid()
        done = settle(c, sid, turn["turnId"], timeout=60)
        assert done["outcome"] == "completed", done
        sizes: list[int] = []
        joined = ""
        while sub.poll(1000):
            body = sub.recv_multipart()[-1]
            event = msgpack.unpackb(body, raw=False)
            if event["type"] == "message.delta" and event["turnId"] == turn["turnId"]:
                sizes.append(len(body))
                joined += event["delta"]
        assert joined == "echo: " + text == done["messages"][-1]["text"]
        assert len(sizes) > 1 and max(sizes) <= MAX_EVENT_BYTES, sizes
    finally:
        sub.close()
        ctx.term()
        d.stop()


def test_a_fork_the_relay_holds_past_the_workers_limit_is_unknown_its_app_server_killed(
    tmp_path: Path,
) -> None:
    """The relay's fork arm (`slow N`) holds the `thread/fork` request past the worker's limit
    for a provider's fork call: the fork ends `unknown` with the worker's reason, the relay
    that held it (the app-server's tree) is killed, an abandon at once ends it `abandoned`, the
    Session's next Turn runs on a new app-server, and every law holds."""
    from tests.reliability.reliability_harness import fork_latest_params
    from tests.support.daemon import WS
    from tests.support.invariants import assert_invariants

    relay = Relay(tmp_path)
    d = _daemon(tmp_path, relay, "fork_provider_call_seconds = 2\n")
    try:
        c = d.client()
        sid = create_session(c)["agentSessionId"]
        run_turn(c, sid, "fork me")
        fork_arm = tmp_path / "armed-fork"
        fork_arm.write_text("slow 4000\n")
        op = c.call("fork.create", fork_latest_params(sid))["operation"]

        def ended() -> dict | None:
            got = c.call("fork.get", {"workspaceId": WS, "operationId": op["operationId"]})
            return got["operation"] if got["operation"]["status"] != "accepted" else None

        op = wait_for(ended, 30, interval=0.2)
        assert op["status"] == "unknown" and "no answer in 2.0 s" in op["error"], op
        taken = [x for x in (tmp_path / "armed-fork.taken").read_text().splitlines() if x]
        assert taken[0] == "slow 4000", taken
        wait_for(lambda: not running(int(taken[1])), 10)  # the relay holding it, killed
        answer = c.call(
            "fork.resolve",
            {
                "workspaceId": WS,
                "operationId": op["operationId"],
                "requestId": "abandon-at-once",
                "action": "abandon",
            },
            timeout=60,
        )
        assert answer["operation"]["status"] == "abandoned", answer
        assert run_turn(c, sid, "after")["outcome"] == "completed"
    finally:
        d.stop()
    assert_invariants(d.home)
