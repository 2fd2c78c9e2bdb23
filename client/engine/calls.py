"""The Engine's calls to the daemon in its workspace: a blocking `request` (an error reply is
raised as `ApiError`) and a non-blocking `submit` that answers None once the client is closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from client.engine.ports import ApiPort, Reply
from transport.client import ApiError, ClientClosed


class WorkspaceCalls:
    """Requests over one `ApiPort`, in one workspace."""

    def __init__(self, api: ApiPort, workspace_id: str) -> None:
        self.api = api
        self.workspace_id = workspace_id

    def request(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float = 30.0
    ) -> dict[str, Any]:
        """One request in this workspace; raises `ApiError`, or `TimeoutError` without a reply."""
        body = dict(params or {})
        if method != "host.status":
            body.setdefault("workspaceId", self.workspace_id)
        future = self.api.submit(method, body)
        try:
            status, result = future.result(timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"no reply to {method} within {timeout} s") from exc
        if status >= 400:
            raise ApiError.from_reply(status, result)
        return result

    def submit(self, method: str, params: Mapping[str, Any]) -> Future[Reply] | None:
        """Send without waiting; None when the client is already closed (nothing was sent)."""
        try:
            return self.api.submit(method, params)
        except ClientClosed:
            return None
