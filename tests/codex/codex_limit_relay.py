"""A stdio relay in front of the REAL `codex app-server` that lowers one of its resource limits
as the `thread/fork` request passes, so the fork's own file writes fail as on a full disk.

`python codex_limit_relay.py fsize:N|nofile:K -- <real argv...>`: `fsize:N` — every write
past byte N of a file fails (`EFBIG`; the server is started with `SIGXFSZ` ignored, as a
full file system kills no one); `nofile:K` — K more file descriptors than it has open (then
`EMFILE`). The provider stays real: only its limits change."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading


def main() -> int:
    kind, _, value = sys.argv[1].partition(":")
    argv = sys.argv[sys.argv.index("--") + 1 :]
    # Python ignores SIGXFSZ; not restoring the default keeps it ignored in the server.
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, restore_signals=False
    )
    assert child.stdin is not None and child.stdout is not None
    out = child.stdout

    def pump_out() -> None:
        for line in out:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    threading.Thread(target=pump_out, daemon=True).start()
    for line in sys.stdin.buffer:
        if b'"thread/fork"' in line:
            if kind == "fsize":
                limit = (int(value), resource.RLIM_INFINITY)
                resource.prlimit(child.pid, resource.RLIMIT_FSIZE, limit)
            elif kind == "nofile":
                _, hard = resource.prlimit(child.pid, resource.RLIMIT_NOFILE)
                fds = len(os.listdir(f"/proc/{child.pid}/fd"))
                resource.prlimit(child.pid, resource.RLIMIT_NOFILE, (fds + int(value), hard))
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
