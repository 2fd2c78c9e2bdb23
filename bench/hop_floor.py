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

A Turn's start comes after the processes sat idle (the previous Turn ended, the client
waited), and a thread woken from idle costs far more here than one woken back to back: `--gap
MS` sleeps that long before each sample, both ways (still interleaved), and the line says the
gap. The echo stamps when it read each request and when it answered (`time.perf_counter`, one
clock for every process), so each way splits into its out half (the request reaching the
app-server) and its back half (the answer reaching the client), and the daemon tree's context
switches per chain request count the wake-ups a chain takes (the echo's, per pipe request).
`--answer-gap MS` makes the app-server wait that long before each answer, so the back half too
starts from idle: a Turn's end comes a model's delta cadence after its previous delta woke the
same path, and its start after the whole Turn's idle (`bench.turn_overhead` measures each half
at its own gap).

    build/venv/bin/python -m bench.hop_floor [--samples 400] [--gap MS]
"""

from __future__ import annotations

import argparse
import json
import math
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
        read = time.perf_counter()
        msg = json.loads(line)
        if msg.get("delay"):
            time.sleep(msg["delay"])  # the provider's own time before it answers
        stamps = {"pid": os.getpid(), "in": read, "out": time.perf_counter()}
        answer = {"id": msg["id"], "result": stamps}
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
    `*_server` fields are the pids of the app-servers that answered each way. `gap_ms`: the
    idle before each sample; `*_out` / `*_back`: each way's halves (the request reaching the
    app-server, its answer reaching the client); `*_switches`: context switches per request
    of the processes each way crosses (the daemon, its worker and the worker's app-server for
    the chain; the echo for the pipe), nan when not counted."""

    chain: Latency
    pipe: Latency
    probe_ms: float
    chain_server: int = 0
    pipe_server: int = 0
    gap_ms: float = 0.0
    answer_gap_ms: float = 0.0
    chain_out: Latency = Latency.of(())
    chain_back: Latency = Latency.of(())
    pipe_out: Latency = Latency.of(())
    pipe_back: Latency = Latency.of(())
    chain_switches: float = math.nan
    pipe_switches: float = math.nan

    @property
    def hops_ms(self) -> float:
        return self.chain.p50 - self.pipe.p50

    @property
    def out_ms(self) -> float:
        """The out half's share of the hop floor: client → ... → the app-server has it."""
        return self.chain_out.p50 - self.pipe_out.p50

    @property
    def back_ms(self) -> float:
        """The back half's share: the app-server answered → ... → the client has it."""
        return self.chain_back.p50 - self.pipe_back.p50

    def gap_words(self) -> str:
        words = f"{self.gap_ms:g} ms idle before each" if self.gap_ms else "back to back"
        if self.answer_gap_ms:
            words += f", answered {self.answer_gap_ms:g} ms after read"
        return words

    def line(self) -> str:
        return (
            f"hop floor on this machine: {self.hops_ms:.2f} ms (a no-work request through client"
            f" → daemon loop → actor → loop → worker → app-server's pipes and back, p50"
            f" {self.chain.p50:.2f} ms, against the pipes alone {self.pipe.p50:.2f} ms;"
            f" out {self.out_ms:.2f} + back {self.back_ms:.2f} ms; {self.gap_words()};"
            f" {self.chain_switches:.1f} context switches a chain, {self.pipe_switches:.1f} a"
            f" pipe request; bench.hop_floor, {self.chain.n} samples, CPU probe"
            f" {self.probe_ms:.0f} ms)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "hopsMs": round(self.hops_ms, 3),
            "chain": self.chain.brief(),
            "pipe": self.pipe.brief(),
            "cpuProbeMs": round(self.probe_ms, 1),
            "gapMs": self.gap_ms,
            "answerGapMs": self.answer_gap_ms,
            "outMs": _rounded(self.out_ms),
            "backMs": _rounded(self.back_ms),
            "halves": {
                "chainOut": self.chain_out.brief(),
                "chainBack": self.chain_back.brief(),
                "pipeOut": self.pipe_out.brief(),
                "pipeBack": self.pipe_back.brief(),
            },
            "switchesPerRequest": {
                "chain": _rounded(self.chain_switches),
                "pipe": _rounded(self.pipe_switches),
            },
        }


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def _tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    found = [pid]
    for tid in _listdir(f"/proc/{pid}/task"):
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in children:
            found += _tree(int(child))
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def context_switches(pids: Sequence[int]) -> int:
    """Voluntary and involuntary context switches of every thread of `pids` so far: each
    voluntary one is a thread that blocked (and so had to be woken)."""
    total = 0
    for pid in pids:
        for tid in _listdir(f"/proc/{pid}/task"):
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except OSError:
                continue
            for row in status.splitlines():
                if "ctxt_switches:" in row:
                    total += int(row.split()[-1])
    return total


def measure(
    samples: int = SAMPLES, warmup: int = WARMUP, gap_s: float = 0.0, answer_gap_s: float = 0.0
) -> HopFloor:
    """Start the three processes (and the direct echo), then time `samples` requests each way,
    alternating, after `warmup` of each; with `gap_s`, each sample (either way) after that
    long idle; with `answer_gap_s`, each answered that long after the app-server read it."""
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

            def request(i: int) -> dict[str, Any]:
                return {"id": i, "method": "noop", "delay": answer_gap_s}

            def checked(way: str, i: int, answer: dict[str, Any]) -> tuple[float, float]:
                if answer["id"] != i:
                    raise RuntimeError(f"answer {answer['id']} to request {i}")
                servers[way].add(int(answer["result"]["pid"]))
                return float(answer["result"]["in"]), float(answer["result"]["out"])

            def through_chain(i: int) -> tuple[float, float, float]:
                t0 = time.perf_counter()
                client.send_multipart([msgpack.packb(request(i))])
                answer = msgpack.unpackb(client.recv_multipart()[-1])
                t1 = time.perf_counter()
                read, answered = checked("chain", i, answer)
                return 1000 * (t1 - t0), 1000 * (read - t0), 1000 * (t1 - answered)

            def through_pipe(i: int) -> tuple[float, float, float]:
                t0 = time.perf_counter()
                answer = pipe.call(request(i))
                t1 = time.perf_counter()
                read, answered = checked("pipe", i, answer)
                return 1000 * (t1 - t0), 1000 * (read - t0), 1000 * (t1 - answered)

            chain: list[tuple[float, float, float]] = []
            direct: list[tuple[float, float, float]] = []
            tree: list[int] = []
            switched = {"chain": 0, "pipe": 0}
            for i in range(warmup + samples):
                if i == warmup:
                    tree = _tree(daemon.pid)
                    switched = {
                        "chain": -context_switches(tree),
                        "pipe": -context_switches([pipe.proc.pid]),
                    }
                if gap_s:
                    time.sleep(gap_s)
                c = through_chain(i)
                if gap_s:
                    time.sleep(gap_s)
                p = through_pipe(i)
                if i >= warmup:
                    chain.append(c)
                    direct.append(p)
            switched["chain"] += context_switches(tree)
            switched["pipe"] += context_switches([pipe.proc.pid])
            client.send_multipart([msgpack.packb({"stop": True})])
            daemon.wait(10)
        finally:
            pipe.close()
            ctx.destroy(0)
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
    (chain_server,), (pipe_server,) = servers["chain"], servers["pipe"]
    n = max(1, samples)
    counted = len(tree) == 3  # the daemon, its worker, the worker's app-server
    return HopFloor(
        Latency.of(c[0] for c in chain),
        Latency.of(p[0] for p in direct),
        probe,
        chain_server,
        pipe_server,
        gap_ms=round(gap_s * 1000, 3),
        answer_gap_ms=round(answer_gap_s * 1000, 3),
        chain_out=Latency.of(c[1] for c in chain),
        chain_back=Latency.of(c[2] for c in chain),
        pipe_out=Latency.of(p[1] for p in direct),
        pipe_back=Latency.of(p[2] for p in direct),
        chain_switches=switched["chain"] / n if counted else math.nan,
        pipe_switches=switched["pipe"] / n,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("daemon", "worker", "echo"))
    parser.add_argument("--api")
    parser.add_argument("--link")
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument(
        "--gap", type=float, default=0.0, metavar="MS", help="idle before each sample, ms"
    )
    parser.add_argument(
        "--answer-gap", type=float, default=0.0, metavar="MS", help="app-server's wait, ms"
    )
    args = parser.parse_args(argv)
    if args.role == "echo":
        return echo_main()
    if args.role == "worker":
        return worker_main(args.link)
    if args.role == "daemon":
        return daemon_main(args.api, args.link)
    floor = measure(args.samples, args.warmup, args.gap / 1000, args.answer_gap / 1000)
    print(floor.line())
    print(json.dumps(floor.to_json()))
    gap = f" --gap {args.gap:g}" if args.gap else ""
    gap += f" --answer-gap {args.answer_gap:g}" if args.answer_gap else ""
    print(f"command: build/venv/bin/python -m bench.hop_floor --samples {args.samples}{gap}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
