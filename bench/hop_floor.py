"""The process structure's floor (issue 36 targets 1 and 2): what a request pays to cross the
processes and threads ARCHITECTURE.md's process view puts between a client and a provider, when
none of them does any work.

The process view fixes the path of every fork and every Turn: a client speaks ZeroMQ (msgpack)
to the daemon; the daemon's transport loop owns its sockets and never works, so a request is
handed to an actor (pykka) and the actor's outgoing message back to the loop; the loop speaks
ZeroMQ (ipc) to one isolated worker process per provider kind; the worker speaks to its
provider's app-server over the app-server's pipes (JSON lines); and the answer comes back the
same way. The bare provider call a host fork or Turn is compared with pays only the last leg.
This module builds that path with nothing in it — four processes, the same libraries, each
stage only decoding, handing over and encoding:

    client DEALER ─▶ daemon: loop (ROUTER) ─▶ actor (pykka tell) ─▶ loop ─▶ (ROUTER, ipc)
      ─▶ worker: link thread (DEALER) ─▶ app-server's stdin │ its stdout ─▶ reader thread
      ─▶ link thread ─▶ daemon: loop ─▶ actor ─▶ loop ─▶ client

and times a no-work request through it (`chain`) against the same request sent by this
process straight down an echo app-server's pipes (`pipe`, the bare side's transport),
interleaved sample by sample:

    hop floor = chain p50 - pipe p50

No host built to the process view can answer a fork or a Turn faster than its bare provider
call plus this, plus its durability floor (`bench.sync_floor`, `bench.turn_floor`): four thread
hand-offs in the daemon, two in the worker, two ZeroMQ hops each way, each process's wake-ups.

    build/venv/bin/python -m bench.hop_floor [--samples 400]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pykka
import zmq

from bench.common import Latency, cpu_probe_ms

SAMPLES = 400
WARMUP = 50
READY_TIMEOUT_S = 30.0


def _role_command(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "bench.hop_floor", "--role", role, *args]


def _spawn(role: str, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(_role_command(role, *args), env=env, **popen)


# -- the app-server: answers each JSON line with one ------------------------------------------


def echo_main() -> int:
    """An app-server that does nothing: one JSON-RPC answer per request line."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        answer = {"id": msg["id"], "result": {"pid": os.getpid()}}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()
    return 0


class Pipe:
    """An app-server child and its two pipes, spoken to as a driver speaks to one."""

    def __init__(self) -> None:
        self.proc = _spawn("echo", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout

    def send(self, msg: dict[str, Any]) -> None:
        self.stdin.write(json.dumps(msg).encode() + b"\n")
        self.stdin.flush()

    def receive(self) -> dict[str, Any]:
        line = self.stdout.readline()
        if not line:
            raise RuntimeError("the echo app-server closed its stdout")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.send(msg)
        return self.receive()

    def close(self) -> None:
        self.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the worker: a link thread and the app-server's reader -------------------------------------


def worker_main(link: str) -> int:
    """The link thread owns the socket to the daemon; the reader thread hands each answer of the
    app-server to it (a ZeroMQ socket is one thread's), as a driver worker must."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(link)
    wake_addr = f"inproc://worker-wake-{os.getpid()}"
    wake_in = ctx.socket(zmq.PULL)
    wake_in.bind(wake_addr)
    pipe = Pipe()
    answers: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()

    def read() -> None:
        wake_out = ctx.socket(zmq.PUSH)
        wake_out.connect(wake_addr)
        while True:
            try:
                answers.put(pipe.receive())
            except (RuntimeError, ValueError, OSError):
                return
            wake_out.send(b"")

    threading.Thread(target=read, name="reader", daemon=True).start()
    sock.send(msgpack.packb({"hello": os.getpid()}))
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(wake_in, zmq.POLLIN)
    while True:
        for socket, _ in poller.poll():
            if socket is sock:
                msg = msgpack.unpackb(sock.recv())
                if msg.get("stop"):
                    pipe.close()
                    ctx.destroy(0)
                    return 0
                pipe.send(msg)
            else:
                wake_in.recv()
                sock.send(msgpack.packb(answers.get()))


# -- the daemon: a transport loop that only routes, and an actor -------------------------------


class _Router(pykka.ThreadingActor):
    """The actor a request is handed to: it sends the worker its request, and the client its
    answer, through the loop (which owns the sockets)."""

    def __init__(self, outbox: queue.SimpleQueue[tuple[str, Any]], wake_addr: str) -> None:
        super().__init__()
        self._outbox = outbox
        self._wake_addr = wake_addr
        self._waiting: dict[int, bytes] = {}
        self._wake: zmq.Socket[bytes] | None = None

    def on_start(self) -> None:
        self._wake = zmq.Context.instance().socket(zmq.PUSH)
        self._wake.connect(self._wake_addr)

    def on_stop(self) -> None:
        if self._wake is not None:
            self._wake.close(0)

    def on_receive(self, message: Any) -> None:
        kind, ident, body = message
        assert self._wake is not None
        if kind == "request":
            self._waiting[body["id"]] = ident
            self._outbox.put(("worker", msgpack.packb(body)))
        else:
            self._outbox.put(("client", (self._waiting.pop(body["id"]), msgpack.packb(body))))
        self._wake.send(b"")


def daemon_main(api: str, link: str) -> int:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(api)
    workers = ctx.socket(zmq.ROUTER)
    workers.setsockopt(zmq.LINGER, 0)
    workers.bind(link)
    wake_addr = f"inproc://daemon-wake-{os.getpid()}"
    wake = ctx.socket(zmq.PULL)
    wake.bind(wake_addr)
    outbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    actor = _Router.start(outbox, wake_addr)
    worker = _spawn("worker", "--link", link)
    worker_id, hello = workers.recv_multipart()
    msgpack.unpackb(hello)
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    poller = zmq.Poller()
    for socket in (router, workers, wake):
        poller.register(socket, zmq.POLLIN)
    try:
        while True:
            for socket, _ in poller.poll():
                if socket is router:
                    ident, payload = router.recv_multipart()
                    body = msgpack.unpackb(payload)
                    if body.get("stop"):
                        workers.send_multipart([worker_id, msgpack.packb({"stop": True})])
                        worker.wait(10)
                        return 0
                    actor.tell(("request", ident, body))
                elif socket is workers:
                    _, payload = workers.recv_multipart()
                    actor.tell(("answer", b"", msgpack.unpackb(payload)))
                else:
                    wake.recv()
                    where, what = outbox.get()
                    if where == "worker":
                        workers.send_multipart([worker_id, what])
                    else:
                        router.send_multipart(list(what))
    finally:
        actor.stop()
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        ctx.destroy(0)


# -- the measurement ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HopFloor:
    """`chain`: a no-work request through the process view's path; `pipe`: the same request
    straight down an app-server's pipes; `hops_ms`: the difference of their p50s. The two
    `*_server` fields are the pids of the app-servers that answered each way."""

    chain: Latency
    pipe: Latency
    probe_ms: float
    chain_server: int = 0
    pipe_server: int = 0

    @property
    def hops_ms(self) -> float:
        return self.chain.p50 - self.pipe.p50

    def line(self) -> str:
        return (
            f"hop floor on this machine: {self.hops_ms:.2f} ms (a no-work request through client"
            f" → daemon loop → actor → loop → worker → app-server's pipes and back, p50"
            f" {self.chain.p50:.2f} ms, against the pipes alone {self.pipe.p50:.2f} ms;"
            f" bench.hop_floor, {self.chain.n} samples, CPU probe {self.probe_ms:.0f} ms)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "hopsMs": round(self.hops_ms, 3),
            "chain": self.chain.brief(),
            "pipe": self.pipe.brief(),
            "cpuProbeMs": round(self.probe_ms, 1),
        }


def measure(samples: int = SAMPLES, warmup: int = WARMUP) -> HopFloor:
    """Start the three processes (and the direct echo), then time `samples` requests each way,
    alternating, after `warmup` of each."""
    probe = cpu_probe_ms()
    with tempfile.TemporaryDirectory(prefix="hop-floor-") as tmp:
        api, link = f"ipc://{tmp}/api.sock", f"ipc://{tmp}/link.sock"
        daemon = _spawn("daemon", "--api", api, "--link", link, stdout=subprocess.PIPE)
        pipe = Pipe()
        ctx = zmq.Context()
        client = ctx.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.setsockopt(zmq.RCVTIMEO, int(READY_TIMEOUT_S * 1000))
        try:
            assert daemon.stdout is not None
            line = daemon.stdout.readline()
            if not line:
                raise RuntimeError("the hop floor's daemon exited before it was ready")
            client.connect(api)

            servers: dict[str, set[int]] = {"chain": set(), "pipe": set()}

            def checked(way: str, i: int, answer: dict[str, Any]) -> None:
                if answer["id"] != i:
                    raise RuntimeError(f"answer {answer['id']} to request {i}")
                servers[way].add(int(answer["result"]["pid"]))

            def through_chain(i: int) -> float:
                t0 = time.perf_counter()
                client.send_multipart([msgpack.packb({"id": i, "method": "noop"})])
                answer = msgpack.unpackb(client.recv_multipart()[-1])
                elapsed = 1000 * (time.perf_counter() - t0)
                checked("chain", i, answer)
                return elapsed

            def through_pipe(i: int) -> float:
                t0 = time.perf_counter()
                answer = pipe.call({"id": i, "method": "noop"})
                elapsed = 1000 * (time.perf_counter() - t0)
                checked("pipe", i, answer)
                return elapsed

            chain: list[float] = []
            direct: list[float] = []
            for i in range(warmup + samples):
                c, p = through_chain(i), through_pipe(i)
                if i >= warmup:
                    chain.append(c)
                    direct.append(p)
            client.send_multipart([msgpack.packb({"stop": True})])
            daemon.wait(10)
        finally:
            pipe.close()
            ctx.destroy(0)
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
    (chain_server,), (pipe_server,) = servers["chain"], servers["pipe"]
    return HopFloor(Latency.of(chain), Latency.of(direct), probe, chain_server, pipe_server)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("daemon", "worker", "echo"))
    parser.add_argument("--api")
    parser.add_argument("--link")
    parser.add_argument("--samples", type=int, default=SAMPLES)
    args = parser.parse_args(argv)
    if args.role == "echo":
        return echo_main()
    if args.role == "worker":
        return worker_main(args.link)
    if args.role == "daemon":
        return daemon_main(args.api, args.link)
    floor = measure(args.samples)
    print(floor.line())
    print(json.dumps(floor.to_json()))
    print("command: build/venv/bin/python -m bench.hop_floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
