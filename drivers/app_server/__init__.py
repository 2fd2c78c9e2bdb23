"""The generic app-server side of the drivers (Codex-style app-servers: tutti-agent, Codex);
import a name from the module that defines it:

- `process`: the JSON-RPC client of one app-server subprocess over stdio.
- `launch`: a provider program's exact launch, fingerprinted.
- `runtimes`: the app-server processes of one provider, started and handshaken.
- `state`: the worker-side data of a runtime, a Session and a pending server request.
- `items`: the app-server wire read as turn events (pure functions).
- `events`: the reader-thread callbacks that emit turn events and Interactions.
- `fork`: the verified through-turn fork with the `host_copy` binder and readability proof.
- `resolution`: the worker side of `fork.resolve` (inspect, adopt, quarantine).
- `provider`: `AppServerProvider`, the port one Codex-style provider implements.
- `driver`: `AppServerDriver`, the `ProviderDriver` composed with one such provider.
"""
