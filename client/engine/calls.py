"""The Engine's calls to the daemon in its workspace: a blocking `request` (an error reply is
raised as `ApiError`) and a non-blocking `submit` that answers None once the client is closed.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, TypeVar, cast, overload

from client.engine.ports import ApiPort
from protocol.methods import HOST_STATUS, METHODS, Method
from protocol.objects import JsonObject
from transport.client import ClientClosed, Reply

P = TypeVar("P")
R = TypeVar("R")


class WorkspaceCalls:
    """Requests over one `ApiPort`, in one workspace."""

    def __init__(self, api: ApiPort, workspace_id: str) -> None:
        self.api = api
        self.workspace_id = workspace_id

    @overload
    def request(self, method: Method[P, R], params: P, *, timeout: float = 30.0) -> R: ...

    @overload
    def request(
        self, method: str, params: JsonObject | None = None, *, timeout: float = 30.0
    ) -> JsonObject: ...

    def request(
        self, method: Method[Any, Any] | str, params: Any = None, *, timeout: float = 30.0
    ) -> Any:
        """One request in this workspace (`workspaceId` added unless given; `host.status` takes
        none), its result typed by `method`. A bare name (tests, probes) is looked up in the
        protocol's table, so only a method of the table is ever sent (`KeyError` otherwise).
        Raises `ApiError`, or `TimeoutError` without a reply."""
        typed: Method[Any, Any] = METHODS[method] if isinstance(method, str) else method
        body = dict(cast(JsonObject, params or {}))
        if typed is not HOST_STATUS:
            body.setdefault("workspaceId", self.workspace_id)
        future = self.api.submit(typed, body)
        try:
            reply = future.result(timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"no reply to {typed.name} within {timeout} s") from exc
        return reply.result()

    def submit(self, method: Method[P, R], params: P) -> Future[Reply[R]] | None:
        """Send without waiting; None when the client is already closed (nothing was sent)."""
        try:
            return self.api.submit(method, params)
        except ClientClosed:
            return None
