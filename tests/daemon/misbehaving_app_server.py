"""A stdio relay in front of the REAL `tutti-agent app-server` that, once armed, misbehaves on
its stdout at the next `turn/start` as a broken provider would (fault-injection tests only).

`python misbehaving_app_server.py ARM -- <real argv...>` relays every line both ways. ARM is a
file; when it exists at a `turn/start`, the relay takes it (renamed to `ARM.taken`, holding the
relay's pid) and does what it says:

- `endless` — the request is swallowed and the relay writes `x` to its stdout forever, never a
  newline (one line that never ends); `endless N`: N MiB of it, then it sleeps;
- `garbage` — the request goes on, and before the provider's answer the relay writes lines that
  are not JSON, JSON that is no object, a result for an id never sent, an error for one, and
  notifications whose params are no object (a Turn's `turn/completed` among them);
- `close` — the relay closes its stdout and keeps running (reading its stdin, the provider
  alive behind it) until it is killed;
- `close_mid` — as `close`, once it has relayed the provider's `turn/started` (a Turn running);
- `notobject` — the request goes on, after notifications whose params are no object (the
  Turn's `turn/started` and `turn/completed` among them);
- `hold_end` — the request goes on, and the provider's `turn/completed` (with every line after
  it) is held back until the relay has passed on the answer to a `turn/interrupt` sent after it,
  or for 10 s at most: the answer to an interrupt that reached the provider as its Turn ended
  overtakes that Turn's end, as it can when the provider writes the two from two threads;
  `hold_end N`: the end follows the answer N ms later (without, at once);
- `noid` — the request goes on, and the provider's answer to it loses its Turn's id (its
  `result.turn` without `id`), and no later line naming that id is relayed: a provider that
  answers `turn/start` without a turn id and never names the Turn it started;
- `stderr` — the request goes on, after the relay wrote 9 MiB to its stderr (the app-server's
  stderr, which the driver keeps in a bounded log: more than twice its bound); in the
  `--claude` dialect it is relayed as is;
- `bigdelta` — the request goes on, and the Turn's streamed reply
  (`item/agentMessage/delta` notifications) reaches the driver as one delta of its whole text,
  written before the next other line: a model that streams its reply at once (a Turn of
  `/stream <text>` with a long text makes one delta past the event cap); in the `--claude`
  dialect it is relayed as is;
- `internal` — taken at a `thread/fork` request instead (ARM is also read there): the request
  goes on to the provider, which forks (its child written), and its answer is replaced by a
  JSON-RPC error `-32603 internal error`, as an app-server answers a failure after its child
  was made (Codex: reading the child's rollout back; the Tutti Agent: building the answer);
- `stop` — the relay stops itself (SIGSTOP) before it passes the request on: an app-server
  stopped before it answers `turn/start` (the relay is the process the driver spawned);
- `stop_init`, `stop_open` — taken at the `initialize` request, or at a `thread/start` or
  `thread/resume`, instead: the relay stops itself before it passes that request on (an
  app-server stopped while it starts, before its Session has a runtime);
- anything else (`pass`) — taken (its pid written) and relayed as is.

A second arm file, `ARM-fork` (`ARM/<session>/armed-fork` for a directory ARM), is taken at a
`thread/fork` request instead: `slow N` holds that request N ms before it is passed on (a
provider whose fork is slow: the worker's limit for a provider's fork call may fire first, with
the request still held or the provider mid-fork; `tests/reliability/slow_fork.py`).

ARM may be a directory instead (the soaks, `tests/reliability/provider_chaos.py`): the relay
serves the Session whose provider home `$TUTTI_AGENT_HOME` or `$CODEX_HOME` is in
(`runtimes/<ws>/<session>/tutti-agent-home`, `…/codex-home`: Codex's app-server speaks the same
JSON lines); if `ARM/<session>/` exists its arm file is `ARM/<session>/armed`, else the relay
execs the real argv (the other Sessions run their provider as is). Its child dies with
it (`PR_SET_PDEATHSIG`), as the driver's own app-servers do.

`python misbehaving_app_server.py --claude ARM -- <real claude argv...>`: the same in front of
the Claude Code CLI the SDK runs over stdio (stream-json lines, `tests/reliability/
provider_chaos.py`'s `claude_front`): the arm is taken at the Turn's prompt (the SDK's
`{"type": "user", …}` line), `close_mid` closes once the CLI's echo of it is relayed (the Turn
started), a directory ARM serves the Session of `$CLAUDE_CONFIG_DIR`; `garbage` writes what the
SDK skips (not JSON, no object, messages of no known type, a control response for a request
never made), `notobject` what it cannot read on from: messages of a known type whose fields
have the wrong shape (a stream event, an assistant message, a result), bytes that are not UTF-8
(the SDK reads text); `noid` is relayed as is (a prompt has no answer that names a turn).

The provider stays real: only what the driver reads is changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

DELTA = b'"item/agentMessage/delta"'
"""What names a line of the Turn's streamed reply (`bigdelta`)."""
HOLD_END_S = 10.0
"""`hold_end`: how long a held `turn/completed` waits for an interrupt's answer at most."""

GARBAGE = (
    b"not json at all\n",
    b"\xff\xfe binary \x00 bytes\n",
    b"[1, 2, 3]\n",
    b"42\n",
    b'{"id": 987654, "result": {"turn": {"id": "never-asked"}}}\n',
    b'{"id": 987655, "error": {"code": -1, "message": "for no request"}}\n',
    b'{"id": "a-string-id", "result": 5}\n',
    b'{"method": "turn/completed", "params": "not an object"}\n',
    b'{"method": "item/agentMessage/delta", "params": [1, 2]}\n',
    b'{"method": "item/completed", "params": null}\n',
    b'{"method": 7, "params": {}}\n',
    b'{"id": 5, "method": "item/commandExecution/requestApproval", "params": "x"}\n',
    b'{"method":"item/agentMessage/delta",broken\n',
    b"\n",
)


NOT_OBJECTS = (
    b'{"method": "turn/started", "params": 5}\n',
    b'{"method": "item/agentMessage/delta", "params": "text"}\n',
    b'{"method": "turn/completed", "params": [1, 2]}\n',
    b'{"method": "thread/tokenUsage/updated", "params": null}\n',
)


CLAUDE_GARBAGE = (
    b"not json at all\n",
    b"[1, 2, 3]\n",
    b"42\n",
    b"\n",
    b'{"type": "no_such_kind", "x": 1}\n',
    b'{"type": "control_response", "response": {"subtype": "success", "request_id": "never"}}\n',
)


CLAUDE_NOT_OBJECTS = (
    b'{"type": "stream_event", "uuid": "u", "session_id": "s", "event": 5}\n',
    b"\xff\xfe binary \x00 bytes\n",
    b'{"type": "assistant", "message": "text"}\n',
    b'{"type": "result", "subtype": 7}\n',
)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


STDERR_FLOOD_MIB = 9
"""How much the `stderr` fault writes: more than twice the driver's stderr log bound."""


def main() -> None:
    claude = sys.argv[1] == "--claude"
    arm = sys.argv[2 if claude else 1]
    argv = sys.argv[sys.argv.index("--") + 1 :]
    # What starts a Turn on stdin, and what says it runs on stdout.
    start = b'{"type": "user"' if claude else b'"turn/start"'
    fork = b'"thread/fork"'
    init = b'"initialize"'
    opens = (b'"thread/start"', b'"thread/resume"')
    started = b'{"type":"user"' if claude else b'"turn/started"'
    garbage = CLAUDE_GARBAGE if claude else GARBAGE
    not_objects = CLAUDE_NOT_OBJECTS if claude else NOT_OBJECTS
    if os.path.isdir(arm):
        home_vars = ("CLAUDE_CONFIG_DIR",) if claude else ("TUTTI_AGENT_HOME", "CODEX_HOME")
        home = next((os.environ[v] for v in home_vars if os.environ.get(v)), "")
        mine = os.path.join(arm, os.path.basename(os.path.dirname(home))) if home else ""
        if not mine or not os.path.isdir(mine):
            os.execv(argv[0], argv)
        arm = os.path.join(mine, "armed")
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=_die_with_parent
    )
    assert child.stdin is not None and child.stdout is not None
    out = sys.stdout.buffer
    lock = threading.Lock()
    silenced = threading.Event()
    close_after_start = threading.Event()
    hold_end = threading.Event()
    held: list[bytes] = []
    end_after = [0.0]  # `hold_end N`: seconds between the interrupt's answer and the end
    interrupts: set[object] = set()  # the ids of the `turn/interrupt` requests passed on
    noid: list[object] = []  # `noid`: the `turn/start`'s request id, then its Turn's id (bytes)
    coalesce = threading.Event()  # `bigdelta`: the Turn's reply deltas are joined into one
    joined: list[dict[str, Any]] = []  # `bigdelta`: the first delta held, its text the joined
    internal: list[object] = []  # `internal`: the `thread/fork`'s request id

    def flush_joined() -> None:  # under the lock: the joined delta, as one line
        if joined:
            out.write(json.dumps(joined.pop(), separators=(",", ":")).encode() + b"\n")

    def joins(line: bytes) -> bool:  # under the lock: `bigdelta` took the line
        if not coalesce.is_set():
            return False
        if DELTA in line:
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                params = msg.get("params") if isinstance(msg, dict) else None
                if isinstance(params, dict) and isinstance(params.get("delta"), str):
                    if joined and joined[0]["params"].get("itemId") == params.get("itemId"):
                        joined[0]["params"]["delta"] += params["delta"]
                        return True
                    flush_joined()
                    joined.append(msg)
                    return True
        flush_joined()
        if b'"turn/completed"' in line:
            coalesce.clear()
        return False

    def release() -> None:  # under the lock
        hold_end.clear()
        out.writelines(held)
        out.flush()
        held.clear()

    def release_late() -> None:
        time.sleep(HOLD_END_S)
        with lock:
            if held:
                release()

    def answers_interrupt(line: bytes) -> bool:
        try:
            msg = json.loads(line)
        except ValueError:
            return False
        return isinstance(msg, dict) and "method" not in msg and msg.get("id") in interrupts

    def close() -> None:  # under the lock
        silenced.set()
        out.close()
        os.close(1)

    def unnamed(line: bytes) -> bytes | None:  # under the lock: `noid`'s line, or None
        if len(noid) == 2:
            assert isinstance(noid[1], bytes)
            return None if noid[1] in line else line
        with contextlib.suppress(ValueError):
            msg = json.loads(line)
            if not isinstance(msg, dict) or "method" in msg or msg.get("id") != noid[0]:
                return line
            result = msg.get("result")
            if isinstance(result, dict):
                turn = result.get("turn")
                if isinstance(turn, dict) and turn.get("id"):
                    noid.append(str(turn.pop("id")).encode())
                    return json.dumps(msg).encode() + b"\n"
        return line

    def failed(line: bytes) -> bytes:  # under the lock: `internal`'s answer, an error now
        with contextlib.suppress(ValueError):
            msg = json.loads(line)
            if isinstance(msg, dict) and "method" not in msg and msg.get("id") == internal[0]:
                internal.clear()
                error = {"code": -32603, "message": "internal error: injected by the relay"}
                return json.dumps({"id": msg["id"], "error": error}).encode() + b"\n"
        return line

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with lock:
                if silenced.is_set():
                    continue
                if internal:
                    line = failed(line)
                if joins(line):
                    continue
                if noid:
                    kept = unnamed(line)
                    if kept is None:
                        continue
                    line = kept
                if held and answers_interrupt(line):
                    out.write(line)  # the interrupt's answer first, then the Turn's end
                    out.flush()
                    if end_after[0]:
                        time.sleep(end_after[0])  # (the lock held: nothing overtakes the end)
                    release()
                    continue
                if hold_end.is_set() and (held or b'"turn/completed"' in line):
                    if not held:
                        threading.Thread(target=release_late, daemon=True).start()
                    held.append(line)
                    continue
                out.write(line)
                out.flush()
                if close_after_start.is_set() and started in line:
                    close()

    threading.Thread(target=pump, daemon=True).start()
    for line in sys.stdin.buffer:
        if not claude and b'"thread/fork"' in line:
            held_fork, _, hold_ms = (_take(arm + "-fork", "turn") or "").partition(" ")
            if held_fork == "slow":
                time.sleep(int(hold_ms or "0") / 1000)
        starts = line.startswith(start) if claude else start in line
        forks = not claude and fork in line
        at = "turn" if starts else "fork" if forks else ""
        if not claude and not at:
            at = "init" if init in line else "open" if any(o in line for o in opens) else ""
        # `internal` is for a fork only, and only it is taken at one; `stop_init` and
        # `stop_open` only at theirs: every other mode waits for its `turn/start`, as ever.
        taken = _take(arm, at) if at else None
        mode, _, count = (taken or "").partition(" ")
        if mode == "internal" and forks:
            with contextlib.suppress(ValueError), lock:
                request = json.loads(line)
                if isinstance(request, dict):
                    internal[:] = [request.get("id")]
        if mode == "endless":
            silenced.set()
            with lock:
                chunk = b"x" * (1 << 20)
                left = int(count) if count else -1
                while left != 0:
                    out.write(chunk)
                    out.flush()
                    left -= 1
                while True:
                    time.sleep(60)
        if mode == "close":
            with lock:
                close()
        if mode in ("stop", "stop_init", "stop_open"):
            os.kill(os.getpid(), signal.SIGSTOP)
        if mode == "close_mid":
            close_after_start.set()
        if mode == "noid" and not claude:
            with contextlib.suppress(ValueError), lock:
                request = json.loads(line)
                if isinstance(request, dict):
                    noid[:] = [request.get("id")]
        if mode == "bigdelta" and not claude:
            coalesce.set()
        if mode == "hold_end":
            end_after[0] = int(count) / 1000 if count else 0.0
            hold_end.set()
        if hold_end.is_set() and b'"turn/interrupt"' in line:
            with contextlib.suppress(ValueError), lock:
                request = json.loads(line)
                if isinstance(request, dict):
                    interrupts.add(request.get("id"))
        if mode == "stderr" and not claude:
            err = sys.stderr.buffer
            for _ in range(STDERR_FLOOD_MIB):
                err.write(b"stderr flood " * 80659 + b"\n")
            err.flush()
        if mode in ("garbage", "notobject"):
            with lock:
                out.writelines(garbage if mode == "garbage" else not_objects)
                out.flush()
        child.stdin.write(line)
        child.stdin.flush()
    if silenced.is_set():
        while True:  # stdout closed, stdin at EOF: still running, until killed
            time.sleep(60)
    child.stdin.close()
    child.wait()


TAKEN_AT = {"internal": "fork", "stop_init": "init", "stop_open": "open"}
"""Where a mode is taken, when not at a `turn/start`."""


def _take(arm: str, at: str) -> str | None:
    try:
        with open(arm, encoding="utf-8") as f:
            if TAKEN_AT.get(f.read().strip(), "turn") != at:
                return None
        os.rename(arm, arm + ".taken")
    except FileNotFoundError:
        return None
    with open(arm + ".taken", "r+", encoding="utf-8") as f:
        mode = f.read().strip()
        f.write(f"\n{os.getpid()}\n")
    return mode


if __name__ == "__main__":
    main()
