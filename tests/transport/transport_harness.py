"""The in-test dispatcher of the transport tests (echo, delayed replies from other threads, held
requests, raised errors) and the handle of a running server; no sockets of its own."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from domain.errors import Conflict, ForkInProgress, HostError
from protocol.envelope import Request
from transport.server import ApiServer, Responder
from transport.wire import optional_int, require_str, require_uuid, unknown_method


@dataclass
class EchoDispatcher:
    """Dispatches the test methods; `held` keeps responders of `hold` requests to answer later."""

    server: ApiServer | None = None
    held: list[tuple[Request, Responder]] = field(default_factory=list)
    held_cond: threading.Condition = field(default_factory=threading.Condition)
    threads: list[threading.Thread] = field(default_factory=list)
    second_answers: list[bool] = field(default_factory=list)

    def __call__(self, request: Request, responder: Responder) -> None:
        method, params = request.method, request.params
        if method == "echo":
            responder.result(200, {"params": params, "id": request.id})
        elif method == "accept":
            responder.result(202, {"accepted": True})
        elif method == "later":
            # Answered from another thread, after `delayMs`.
            delay = (params.get("delayMs") or 0) / 1000
            timer = threading.Timer(delay, responder.result, (200, {"later": params.get("n")}))
            timer.daemon = True
            self.threads.append(timer)
            timer.start()
        elif method == "hold":
            with self.held_cond:
                self.held.append((request, responder))
                self.held_cond.notify_all()
        elif method == "conflict":
            raise Conflict("nope", reason="agent_session_busy")
        elif method == "retryable":
            responder.error(ForkInProgress("fork active"))
        elif method == "crash":
            raise ValueError("a bug in a handler")
        elif method == "unencodable":
            responder.result(200, {"value": object()})
        elif method == "twice":
            responder.result(200, {"first": True})
            self.second_answers.append(responder.result(200, {"second": True}))
        elif method == "raiseAfterAnswer":
            responder.result(200, {"answered": True})
            raise HostError("too late")
        elif method == "validate":
            require_str(params, "workspaceId", max_len=128)
            sid = require_uuid(params, "agentSessionId")
            limit = optional_int(params, "limit", default=50, min_value=1, max_value=200)
            responder.result(200, {"agentSessionId": sid, "limit": limit})
        elif method == "closeServer":
            assert self.server is not None
            self.server.close()
            responder.result(200, {"closing": True})
        elif method == "publish":
            assert self.server is not None
            ok = self.server.publish(params["topic"], params["event"])
            responder.result(200, {"published": ok})
        else:
            raise unknown_method(method)

    def wait_held(self, count: int, timeout: float = 10.0) -> list[tuple[Request, Responder]]:
        with self.held_cond:
            assert self.held_cond.wait_for(lambda: len(self.held) >= count, timeout)
            return list(self.held)


@dataclass
class Running:
    server: ApiServer
    dispatcher: EchoDispatcher
    home: str

    @property
    def ipc(self) -> str:
        return self.server.endpoints[0]

    @property
    def tcp(self) -> str:
        return self.server.endpoints[1]
