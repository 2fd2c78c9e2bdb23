"""The Engine's calls to the daemon in its workspace: a blocking `request` (an error reply is
raised as `ApiError`) and a non-blocking `submit` that answers None once the client is closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, TypeVar, overload

from client.engine.ports import ApiPort, Reply
from protocol.methods import HOST_STATUS, Method
from transport.client import ApiError, ClientClosed

R = TypeVar("R")


class WorkspaceCalls:
    """Requests over one `ApiPort`, in one workspace."""

    def __init__(self, api: ApiPort, workspace_id: str) -> None:
        self.api = api
        self.workspace_id = workspace_id

    @overload
    def request(
        self,
        method: Method[Any, R],
        params: Mapping[str, Any] | None = None,
        *,
        timeout: float = 30.0,
    ) -> R: ...

    @overload
    def request(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float = 30.0
    ) -> dict[str, Any]: ...

    def request(
        self,
        method: Method[Any, Any] | str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout: float = 30.0,
    ) -> Any:
        """One request in this workspace (`workspaceId` added unless given; `host.status` takes
        none), its result typed by `method` (a bare name: tests, probes); raises `ApiError`, or
        `TimeoutError` without a reply."""
        name = method if isinstance(method, str) else method.name
        body = dict(params or {})
        if name != HOST_STATUS.name:
            body.setdefault("workspaceId", self.workspace_id)
        future = self.api.submit(name, body)
        try:
            status, result = future.result(timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"no reply to {name} within {timeout} s") from exc
        if status >= 400:
            raise ApiError.from_reply(status, result)
        return result

    def submit(self, method: Method[Any, Any], params: Mapping[str, Any]) -> Future[Reply] | None:
        """Send without waiting; None when the client is already closed (nothing was sent)."""
        try:
            return self.api.submit(method.name, params)
        except ClientClosed:
            return None
