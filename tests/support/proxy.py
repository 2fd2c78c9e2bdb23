"""A forward proxy on 127.0.0.1 for tests of a model reached through a corporate proxy: it
tunnels `CONNECT host:port` (what clients do for https) and forwards absolute-form requests
(`POST http://host:port/path`, what clients do for plain http), and records both, so a test can
tell that a request went through it. One thread per connection; `close()` stops it all."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import urllib.parse
from types import TracebackType
from typing import Self


class ForwardProxy:
    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.tunnels: list[str] = []
        """`host:port` of every CONNECT."""
        self.forwarded: list[str] = []
        """`METHOD url` of every absolute-form request."""
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._sock.settimeout(0.1)  # close() does not wake an accept() of another thread
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            request_line, _, rest = head.partition(b"\r\n")
            method, target, version = request_line.decode("latin-1").split(" ", 2)
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                with self._lock:
                    self.tunnels.append(target)
                upstream = socket.create_connection((host, int(port)), timeout=10)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                _, _, early = rest.partition(b"\r\n\r\n")
                if early:
                    upstream.sendall(early)
            else:
                url = urllib.parse.urlsplit(target)
                with self._lock:
                    self.forwarded.append(f"{method} {target}")
                upstream = socket.create_connection(
                    (url.hostname or "127.0.0.1", url.port or 80), timeout=10
                )
                path = url.path + (f"?{url.query}" if url.query else "")
                upstream.sendall(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
            with self._lock:
                self._open.append(upstream)
            _pipe(client, upstream, self._stop)
        except (OSError, ValueError):
            return
        finally:
            for s in (client, upstream):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _pipe(a: socket.socket, b: socket.socket, stop: threading.Event) -> None:
    """Copy bytes both ways until either side closes."""
    a.settimeout(None)
    b.settimeout(None)
    while not stop.is_set():
        ready, _, _ = select.select([a, b], [], [], 0.2)
        for src in ready:
            data = src.recv(65536)
            if not data:
                return
            (b if src is a else a).sendall(data)
