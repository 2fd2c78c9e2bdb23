"""A stdio relay in front of the REAL `tutti-agent app-server`, for fault-injection tests only.

`python tamper_proxy.py MODE LOG -- <real argv...>` relays every line both ways, logs each client
request method to LOG, and when MODE is not `none` rewrites the answer to `thread/fork` (the
provider stays real; only the answer the driver sees is tampered with, to pin that the driver
refuses anything but an exactly verified child).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading


def tamper(mode: str, result: dict, source_id: str) -> dict:  # type: ignore[type-arg]
    thread = result.get("thread") or {}
    turns = list(thread.get("turns") or [])
    # The turns as columns (`turnColumns`, what the driver asks tutti-agent): tampered alike.
    ids, statuses = list(thread.get("turnIds") or []), list(thread.get("turnStatuses") or [])
    extra = "01a228cc-ffff-7000-8000-00000000dead"
    if mode == "drop_first_turn":
        thread["turns"] = turns[1:]
        if "turnIds" in thread:
            thread["turnIds"], thread["turnStatuses"] = ids[1:], statuses[1:]
    elif mode == "extra_turn":
        if turns:
            thread["turns"] = turns + [dict(turns[-1], id=extra)]
        if "turnIds" in thread:
            thread["turnIds"], thread["turnStatuses"] = ids + [extra], statuses + statuses[-1:]
    elif mode == "reorder":
        thread["turns"] = list(reversed(turns))
        if "turnIds" in thread:
            thread["turnIds"] = list(reversed(ids))
            thread["turnStatuses"] = list(reversed(statuses))
    elif mode == "child_is_source":
        thread["id"] = source_id
    elif mode == "wrong_parent":
        thread["forkedFromId"] = "01a228cc-ffff-7000-8000-00000000beef"
    elif mode == "empty_id":
        thread["id"] = ""
    result["thread"] = thread
    return result


def main() -> int:
    mode, log_path = sys.argv[1], sys.argv[2]
    argv = sys.argv[sys.argv.index("--") + 1 :]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    forks: dict[object, str] = {}
    lock = threading.Lock()
    dying = threading.Event()

    def pump_in() -> None:
        assert child.stdin is not None
        for line in sys.stdin.buffer:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {}
            if isinstance(msg, dict) and "method" in msg and "id" in msg:
                with open(log_path, "a") as log:
                    log.write(msg["method"] + "\n")
                if msg["method"] == "thread/fork":
                    with lock:
                        forks[msg["id"]] = str(msg["params"].get("threadId"))
                    if mode == "die_on_fork":
                        # The request reaches the provider; its answer never reaches the driver.
                        dying.set()
                        child.stdin.write(line)
                        child.stdin.flush()
                        dying.wait(0.2)
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
        with lock:
            source = forks.pop(msg.get("id"), None) if "method" not in msg else None
        if source is not None and "result" in msg and mode != "none":
            msg["result"] = tamper(mode, msg["result"], source)
            line = (json.dumps(msg) + "\n").encode()
        out.write(line)
        out.flush()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
