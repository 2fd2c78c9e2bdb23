"""What the client pays to decode one event (`protocol.envelope.decode_event`, on its SUB
thread): CPU µs per event for a `turn.updated` of three 200-character messages and a
`message.delta`, alternating. `--tree` decodes with another checkout's `protocol/` (A/B of two
trees, alternating order); it prints the CPU probe and the load beside its figure.

    build/venv/bin/python -m bench.event_decode [--tree PATH] [--events N]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable

import msgpack

from bench.common import REPO, cpu_probe_ms

_MESSAGE = {"turnId": "t", "kind": "assistant", "text": "x" * 200, "payload": {}, "version": 1}
_TURN = {
    "turnId": "t",
    "sequence": 3,
    "phase": "active",
    "outcome": None,
    "error": None,
    "errorReason": None,
    "rootProviderTurnId": None,
    "providerForkBindingState": "bound",
    "finalAssistantMessageId": None,
    "interactions": [],
    "createdAtUnixMs": 1,
    "settledAtUnixMs": None,
    "messages": [{**_MESSAGE, "messageId": f"m{i}"} for i in range(3)],
}
FRAMES = [
    msgpack.packb({"type": "turn.updated", "agentSessionId": "s", "turn": _TURN}),
    msgpack.packb(
        {
            "type": "message.delta",
            "agentSessionId": "s",
            "turnId": "t",
            "itemId": "i",
            "kind": "assistant",
            "delta": "hello",
        }
    ),
]


def cpu_us_per_event(decode_event: Callable[[bytes], object], events: int) -> float:
    t0 = time.process_time()
    for _ in range(events // len(FRAMES)):
        for frame in FRAMES:
            decode_event(frame)
    return (time.process_time() - t0) / events * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(REPO), help="the checkout whose protocol/ to use")
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args(argv)
    sys.path.insert(0, args.tree)
    envelope = importlib.import_module("protocol.envelope")
    probe = cpu_probe_ms()
    figure = cpu_us_per_event(envelope.decode_event, args.events)
    print(
        f"decode_event of {envelope.__file__}: {figure:.2f} CPU µs per event over "
        f"{args.events} events (CPU probe {probe} ms, load {os.getloadavg()[0]:.1f})"
    )
    print(
        "command: build/venv/bin/python -m bench.event_decode "
        f"--tree {args.tree} --events {args.events}"
    )


if __name__ == "__main__":
    main()
