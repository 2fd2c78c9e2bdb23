"""A model endpoint that accepts the connection and never answers: the common way a real model
fails (an overloaded server, a proxy, a local model still loading). It reads what it is sent
and holds every connection open, silent, until the server is stopped.

`SilentServer` listens on 127.0.0.1 on its own thread; `base_url` looks like any other fake's,
so a provider is pointed at it the same way. `accepted` counts the connections it took.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType
from typing import Self


class SilentServer:
    """Accepts on 127.0.0.1:<ephemeral>, reads and discards, never writes a byte."""

    def __init__(self, path: str = "/v1") -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        self.base_url = f"http://127.0.0.1:{self.port}{path}"
        self.accepted = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="silent-model", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ)
        conns: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.1):
                    if key.fileobj is self._sock:
                        with contextlib.suppress(BlockingIOError):
                            conn, _ = self._sock.accept()
                            conn.setblocking(False)
                            conns.append(conn)
                            sel.register(conn, selectors.EVENT_READ)
                            with self._lock:
                                self.accepted += 1
                        continue
                    conn = key.fileobj  # type: ignore[assignment]
                    try:
                        data = conn.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:  # the client gave up: forget it
                        sel.unregister(conn)
                        conn.close()
                        conns.remove(conn)
        finally:
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.close()
            sel.close()
