"""The Engine itself: its parts assembled, built over its own transport Client and events
pump (`connect`, `attach_events`), and closed (every timer, the pump, an owned Client).
"""

from __future__ import annotations

from typing import Any

from client.engine.forks import ForkRequests
from client.engine.ports import ThreadScheduler, _EventPump
from transport.security import ClientCurve


class Engine(ForkRequests):
    """Owns every fork mutation of one workspace for one client (see `client.engine`).

    Thread-safe. Network calls are non-blocking (`ApiPort.submit`); replies are handled on the
    client's socket thread and timers on the scheduler, so no method blocks except
    `request`/`load_sessions`/`wait_for`, which must not run on the client's socket thread.
    """

    # -- construction helpers ----------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        api_endpoint: str,
        events_endpoint: str | None,
        workspace_id: str,
        *,
        timeout: float = 10.0,
        curve: ClientCurve | None = None,
        events_exact: bool = False,
        **kwargs: Any,
    ) -> Engine:
        """An Engine that owns its Client and, if `events_endpoint` is given, an event pump.
        `curve`: the keys of a connection file, for tcp endpoints; `events_exact`: the
        endpoint is the daemon's terminated-topic one (`eventsExact`)."""
        from transport.client import Client

        client = Client(api_endpoint, timeout=timeout, curve=curve)
        engine = cls(client, workspace_id, **kwargs)
        engine._owned_client = client
        if events_endpoint:
            engine.attach_events(events_endpoint, curve=curve, exact=events_exact)
        return engine

    def attach_events(
        self, events_endpoint: str, *, curve: ClientCurve | None = None, exact: bool = False
    ) -> None:
        """Follow the daemon's events (`fork.operation`, `session.*`, `turn.updated`);
        `exact`: `events_endpoint` is the terminated-topic endpoint (`eventsExact`)."""
        with self._lock:
            if self._pump is None:
                self._pump = _EventPump(
                    events_endpoint, self.workspace_id, self.handle_event, curve=curve, exact=exact
                )

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every timer (ACK retries included) and the event pump; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for slot in self._slots.values():
                slot.cancel_all()
            pump, self._pump = self._pump, None
            self._cond.notify_all()
        if pump is not None:
            pump.close()
        if self._own_scheduler and isinstance(self.scheduler, ThreadScheduler):
            self.scheduler.close()
        if self._owned_client is not None:
            self._owned_client.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
