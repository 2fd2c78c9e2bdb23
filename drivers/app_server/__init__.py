"""The generic app-server side of the drivers (Codex-style app-servers: tutti-agent, Codex).

- `process`: the JSON-RPC client of one app-server subprocess over stdio (re-exported here).
- `state`: the worker-side data of a runtime, a Session and a pending server request.
- `items`: the app-server wire read as turn events (pure functions).
- `events`: the reader-thread callbacks that emit turn events and Interactions.
- `fork`: the verified through-turn fork with the `host_copy` binder and readability proof.
- `driver`: `AppServerDriver`, the `ProviderDriver` the provider modules subclass.

Importing this package loads only the process client; the driver lives in
`drivers.app_server.driver`.
"""

from drivers.app_server.process import (
    AppServerClosed,
    AppServerFailure,
    AppServerProcess,
    AppServerTimeout,
    JsonRpcError,
    ServerRequest,
    private_env,
)

__all__ = [
    "AppServerClosed",
    "AppServerFailure",
    "AppServerProcess",
    "AppServerTimeout",
    "JsonRpcError",
    "ServerRequest",
    "private_env",
]
