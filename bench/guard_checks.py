"""What the connection guard's descriptor checks cost per accepted connection and per shutdown:
recording (`accepted_inode`: fstat, SO_ACCEPTCONN, getsockname) against a bare fstat, and the
shutdown through a duplicate descriptor against one by number (docs/design/connections.md).

Best of 5 rounds of 20,000 calls each, on one real accepted Unix socket, in-process.
`build/venv/bin/python -m bench.guard_checks`.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable

from transport.connections import _shutdown_socket, accepted_inode

ROUNDS = 5
CALLS = 20_000


def _best_us(call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        best = min(best, (time.perf_counter() - start) / CALLS)
    return best * 1e6


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ah-guard-") as folder:
        path = os.path.join(folder, "l.sock")
        with (
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener,
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client,
        ):
            listener.bind(path)
            listener.listen()
            client.connect(path)
            accepted, _ = listener.accept()
            with accepted:
                fd = accepted.fileno()
                inode = os.fstat(fd).st_ino
                endpoint = f"ipc://{path}"

                def through_a_dup() -> None:
                    dup = os.dup(fd)
                    try:
                        _shutdown_socket(dup, inode)
                    finally:
                        os.close(dup)

                cases: list[tuple[str, Callable[[], object]]] = [
                    ("record: fstat only", lambda: os.fstat(fd).st_ino),
                    ("record: accepted_inode", lambda: accepted_inode(fd, endpoint)),
                    ("shutdown: by number", lambda: _shutdown_socket(fd, inode)),
                    ("shutdown: through a dup", through_a_dup),
                ]
                for name, call in cases:
                    print(f"{name:26} {_best_us(call):6.2f} µs")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
