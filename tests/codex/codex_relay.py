"""A stdio relay in front of the REAL `codex app-server`, for fault-injection tests only.

`python codex_relay.py MODE LOG -- <real argv...>` relays every line both ways and appends each
client request (`{"method", "params"}`) to LOG as one JSON line. MODE:

- `none` — relay only (the log proves which calls were made, with which params);
- `ua=<text>` — the `initialize` answer's `userAgent` becomes `<text>` (version-gate tests);
- `bogus_last_turn` — the `thread/fork` request's `lastTurnId` is replaced by an id the source
  does not hold, so the real provider answers with its own JSON-RPC error;
- `die_on_fork` — the `thread/fork` request reaches Codex, then the relay dies before any answer;
- `hang_on_fork` — the `thread/fork` answer is swallowed (the driver times out);
- `bad_error_code` — the `thread/start` answer becomes an error whose `code` is a string;
- `bool_id` — the `initialize` answer comes after one for the id `true` (no request's);
- `hold_child_list:<dir>` — the answer to a child's `thread/turns/list` is held until a bind's
  temp file appears under `<dir>` (at most `HOLD_S`), and LOG gets a `relay/held` line saying
  whether one had (`staged`) and whether a rollout was named there yet (`named`);
- anything else rewrites the `thread/fork` answer (see `tamper`), and for the turn modes
  (`drop_first_turn`, `extra_turn`, `reorder`) also the `thread/turns/list` answer of a thread
  that a `thread/fork` answer named as its child (the driver lists a child's turns there when
  it forks with `excludeTurns`).

The provider stays real: only what the driver sees is changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

UNKNOWN_TURN = "01a228cc-ffff-7000-8000-00000000dead"


TURN_MODES = ("drop_first_turn", "extra_turn", "reorder")
HOLD = "hold_child_list:"
HOLD_S = 5.0


def hold_for_staged(target: Path, log_path: str) -> None:
    """Wait (at most `HOLD_S`) for a bind's temp file under `target`; log what was there."""
    deadline = time.monotonic() + HOLD_S
    staged = False
    while not staged and time.monotonic() < deadline:
        staged = any(p.name.endswith(".tmp") for p in target.rglob("*"))
        if not staged:
            time.sleep(0.005)
    named = any(target.rglob("rollout-*.jsonl"))
    with open(log_path, "a") as log:
        held = {"staged": staged, "named": named}
        log.write(json.dumps({"method": "relay/held", "params": held}) + "\n")


def tamper_turns(mode: str, turns: list[Any]) -> list[Any]:
    if mode == "drop_first_turn":
        return turns[1:]
    if mode == "extra_turn":
        return [*turns, dict(turns[-1], id=UNKNOWN_TURN)] if turns else turns
    if mode == "reorder":
        return list(reversed(turns))
    return turns


def tamper(mode: str, result: dict[str, Any], source_id: str) -> dict[str, Any]:
    thread = dict(result.get("thread") or {})
    turns = list(thread.get("turns") or [])
    if mode in TURN_MODES:
        thread["turns"] = tamper_turns(mode, turns)
    elif mode == "child_is_source":
        thread["id"] = source_id
    elif mode == "wrong_parent":
        thread["forkedFromId"] = "01a228cc-ffff-7000-8000-00000000beef"
    elif mode == "no_lineage":
        thread["forkedFromId"] = None
    elif mode == "empty_id":
        thread["id"] = ""
    result["thread"] = thread
    return result


def main() -> int:
    mode, log_path = sys.argv[1], sys.argv[2]
    argv = sys.argv[sys.argv.index("--") + 1 :]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    pending: dict[object, tuple[str, str]] = {}  # request id → (method, source thread)
    lock = threading.Lock()
    dying = threading.Event()
    children: set[str] = set()  # thread ids named as children by thread/fork answers

    def pump_in() -> None:
        assert child.stdin is not None
        for line in sys.stdin.buffer:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {}
            if isinstance(msg, dict) and "method" in msg and "id" in msg:
                method = str(msg["method"])
                params = msg.get("params") or {}
                with open(log_path, "a") as log:
                    log.write(json.dumps({"method": method, "params": params}) + "\n")
                with lock:
                    pending[msg["id"]] = (method, str(params.get("threadId")))
                if method == "thread/fork" and mode == "bogus_last_turn":
                    msg["params"] = dict(params, lastTurnId=UNKNOWN_TURN)
                    line = (json.dumps(msg) + "\n").encode()
                if method == "thread/fork" and mode == "die_on_fork":
                    # The request reaches the provider; its answer never reaches the driver.
                    dying.set()
                    child.stdin.write(line)
                    child.stdin.flush()
                    dying.wait(0.3)
                    child.kill()
                    os._exit(9)
            child.stdin.write(line)
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=pump_in, daemon=True).start()
    out = sys.stdout.buffer
    for line in child.stdout:
        if dying.is_set():
            continue
        msg = json.loads(line)
        entry = None
        if "method" not in msg:
            with lock:
                entry = pending.pop(msg.get("id"), None)
        if entry is not None and "result" in msg:
            method, source = entry
            if method == "initialize" and mode == "bool_id":
                # First an answer for an id no request has (`true`), naming another program.
                fake = {"id": True, "result": dict(msg["result"], userAgent="bogus/0.0.1")}
                out.write((json.dumps(fake) + "\n").encode())
            if method == "thread/start" and mode == "bad_error_code":
                # An error answer whose code is no integer (JSON-RPC says it is one).
                msg = {"id": msg["id"], "error": {"code": "oops", "message": "relay refused"}}
                line = (json.dumps(msg) + "\n").encode()
            elif method == "initialize" and mode.startswith("ua="):
                msg["result"]["userAgent"] = mode[3:]
                line = (json.dumps(msg) + "\n").encode()
            elif method == "thread/fork" and mode == "hang_on_fork":
                continue
            elif method == "thread/fork" and mode not in ("none", "bogus_last_turn"):
                children.add(str((msg["result"].get("thread") or {}).get("id")))
                msg["result"] = tamper(mode, msg["result"], source)
                line = (json.dumps(msg) + "\n").encode()
            elif method == "thread/turns/list" and mode.startswith(HOLD) and source in children:
                hold_for_staged(Path(mode[len(HOLD) :]), log_path)
            elif method == "thread/turns/list" and mode in TURN_MODES and source in children:
                # `source` is the listed thread here: a child the fork answer named.
                msg["result"]["data"] = tamper_turns(mode, list(msg["result"].get("data") or []))
                line = (json.dumps(msg) + "\n").encode()
        out.write(line)
        out.flush()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
