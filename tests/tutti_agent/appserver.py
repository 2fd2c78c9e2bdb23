"""A JSON-RPC client for app-server subprocesses (Tutti Agent or Codex) over stdio.

Each server runs with its own HOME and provider home under a tmp dir; server->client
requests are answered by a test-supplied handler; notifications are queued for inspection."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TUTTI_AGENT = [sys.executable, "-m", "tutti_agent.cli", "app-server"]
REPO = Path(__file__).resolve().parents[2]

ServerRequestHandler = Callable[[str, Mapping[str, Any]], Mapping[str, Any] | None]


class RpcError(Exception):
    def __init__(self, error: Mapping[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.code = error.get("code")
        self.message = str(error.get("message"))


class AppServerProcess:
    """Drives one app-server subprocess; `close()` ends it (stdin EOF, then kill)."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        *,
        on_server_request: ServerRequestHandler | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=str(cwd or REPO),
            text=True,
            bufsize=1,
        )
        self.notifications: queue.Queue[dict[str, Any]] = queue.Queue()
        self.server_requests: queue.Queue[dict[str, Any]] = queue.Queue()
        self._responses: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._next = 0
        self.on_server_request = on_server_request
        self.stderr_lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            msg = json.loads(line)
            if "method" in msg and "id" in msg:
                self.server_requests.put(msg)
                if self.on_server_request is not None:
                    result = self.on_server_request(msg["method"], msg.get("params") or {})
                    if result is not None:
                        self.respond(msg["id"], result)
            elif "method" in msg:
                self.notifications.put(msg)
            else:
                with self._lock:
                    q = self._responses.get(msg.get("id"))
                if q is not None:
                    q.put(msg)

    def send(self, obj: Mapping[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def respond(self, request_id: object, result: Mapping[str, Any]) -> None:
        self.send({"id": request_id, "result": dict(result)})

    def call(self, method: str, params: Mapping[str, Any] | None = None, timeout: float = 30.0):
        """Returns the result, or raises RpcError with the server's error."""
        with self._lock:
            self._next += 1
            rid = self._next
            q: queue.Queue[dict[str, Any]] = queue.Queue()
            self._responses[rid] = q
        self.send({"id": rid, "method": method, "params": dict(params or {})})
        try:
            msg = q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(
                f"no response to {method}; stderr: {''.join(self.stderr_lines)[-2000:]}"
            ) from None
        finally:
            with self._lock:
                self._responses.pop(rid, None)
        if "error" in msg:
            raise RpcError(msg["error"])
        return msg["result"]

    def initialize(self, name: str = "agenthost-tests") -> dict[str, Any]:
        result = self.call(
            "initialize",
            {
                "clientInfo": {"name": name, "title": name, "version": "0.0.1"},
                "capabilities": {"experimentalApi": True},
            },
        )
        self.send({"method": "initialized"})
        return result

    def wait_notification(
        self,
        method: str,
        pred: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Wait for a notification; earlier ones of other kinds are discarded."""
        deadline_q = timeout
        while True:
            try:
                msg = self.notifications.get(timeout=deadline_q)
            except queue.Empty:
                raise TimeoutError(f"no {method} notification") from None
            if msg["method"] == method and (pred is None or pred(msg["params"])):
                return msg["params"]

    def wait_turn_completed(self, turn_id: str, timeout: float = 30.0) -> dict[str, Any]:
        params = self.wait_notification(
            "turn/completed", lambda p: p["turn"]["id"] == turn_id, timeout
        )
        return params["turn"]

    def start_thread(self, cwd: str) -> str:
        return str(self.call("thread/start", {"cwd": cwd})["thread"]["id"])

    def start_turn(self, thread_id: str, text: str) -> str:
        result = self.call(
            "turn/start",
            {"threadId": thread_id, "input": [{"type": "text", "text": text, "text_elements": []}]},
        )
        return str(result["turn"]["id"])

    def run_turn(self, thread_id: str, text: str, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait_turn_completed(self.start_turn(thread_id, text), timeout)

    def close(self) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)


def tutti_env(tmp: Path, home_name: str = "tutti-home", **extra: str) -> dict[str, str]:
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TUTTI_AGENT_HOME": str(tmp / home_name),
        "PYTHONPATH": str(REPO),
    }
    env.update(extra)
    return env


def agent_texts(turn: Mapping[str, Any]) -> list[str]:
    return [i["text"] for i in turn["items"] if i["type"] == "agentMessage"]
