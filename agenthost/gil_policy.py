"""The daemon's GIL switch interval: how long a thread that wants the interpreter waits for the
one running Python before it is made to hand the GIL over.

The daemon is a dozen threads on one GIL (actors, the publisher, the transport loop, the
worker supervisor, the store's writer). At CPython's default of 5 ms a request's thread that
is ready to run waits up to 5 ms behind any thread busy in Python, and a writer holding the
store's baton re-takes the GIL after each SQLite call. Shorter intervals (1, 0.5, 0.2 ms) were
measured in four sessions and none showed a difference the shared machine resolved, while one
made a Turn slower (docs/performance.md, "Mutation tails: the GIL switch interval, and the fsync
after the baton"); a fifth, on a quiet machine (1 ms against 5 ms, three interleaved pairs of the
full `bench.mutations`, 2026-12-05), moved neither phase's p99 beyond the runs' own spread. So
the daemon keeps CPython's default; the environment may set another for a measurement."""

from __future__ import annotations

import os
import sys

SWITCH_INTERVAL_ENV = "AGENTHOST_SWITCH_INTERVAL_MS"
"""When set, the daemon's switch interval in milliseconds instead of `SWITCH_INTERVAL_S`
(for measurements)."""
SWITCH_INTERVAL_S = 0.005
"""The daemon's switch interval, seconds (CPython's default)."""


def switch_interval_s() -> float:
    """The interval the daemon runs with: `SWITCH_INTERVAL_S`, or the environment's figure."""
    text = os.environ.get(SWITCH_INTERVAL_ENV, "").strip()
    if not text:
        return SWITCH_INTERVAL_S
    try:
        ms = float(text)
    except ValueError:
        return SWITCH_INTERVAL_S
    return ms / 1000 if ms > 0 else SWITCH_INTERVAL_S


def apply() -> float:
    """Set the process's switch interval (process-wide: every thread of the daemon)."""
    interval = switch_interval_s()
    sys.setswitchinterval(interval)
    return sys.getswitchinterval()
